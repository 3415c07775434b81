"""Graph side of the matmul families: the views and casts that feed a GEMM operand (replayed as launcher strides)
and the pointwise consumers grown into its epilogue."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype, is_convex, op_name, region_io, shape, tensor_args
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit
from kernelevolve.templates.graphutil import CASTS, DIM_OPS

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
VIEWS = DIM_OPS - {"expand"}  # an operand's chain to its GEMM; a broadcast is replayed separately
OPERAND_OPS = VIEWS | CASTS | {"expand", "select", "slice"}
SPLITS = {"split", "split_with_sizes"}
MAX_EXTRAS = 8


def numel_of(s: tuple[int, ...]) -> int:
    return math.prod(s)


def as_tuple(s: Any) -> str:
    s = tuple(s)
    return f"({s[0]},)" if len(s) == 1 else f"({', '.join(map(str, s))})"


def keeps_order(node: fx.Node) -> bool:
    """A view whose elements keep their row-major order (a permute may only move size-1 dims)."""
    name, src = op_name(node), shape(node.args[0])
    if name == "permute":
        perm = list(node.args[1])
    elif name in ("transpose", "t"):
        perm = list(range(len(src)))
        d0, d1 = (node.args[1] % len(src), node.args[2] % len(src)) if name == "transpose" else (0, 1)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        return name in VIEWS
    kept = [d % len(src) for d in perm if src[d] != 1]
    return kept == sorted(kept)


@dataclass
class Operand:
    nodes: list[fx.Node]  # absorbed views/casts, consumer first
    source: fx.Node  # the tensor the launcher receives
    expr: str  # launcher expression replaying the views on ``x_<source>``
    cast: str | None  # dtype the loaded tile is converted to
    lead: tuple[str, tuple[int, ...]] | None  # leading dims flattened away: (expression, traced sizes)


def _replay(c: fx.Node, expr: str, lead: Any) -> tuple[str, Any]:
    name, src, dst = op_name(c), shape(c.args[0]), shape(c)
    args = list(c.args)
    if name in ("view", "_unsafe_view", "reshape"):
        if dst == src:
            return expr, lead
        if len(src) > 2 and dst == (numel_of(src[:-1]), src[-1]):
            return f"{expr}.flatten(0, -2)", (f"{expr}.shape[:-1]", src[:-1])
        return f"{expr}.reshape{as_tuple(dst)}", lead
    if name == "permute":
        return f"{expr}.permute{as_tuple(args[1])}", lead
    if name == "t":
        return f"{expr}.t()", lead
    if name == "transpose":
        return f"{expr}.transpose({args[1]}, {args[2]})", lead
    if name == "expand":
        off = len(dst) - len(src)
        sizes = [-1 if i >= off and src[i - off] == d else d for i, d in enumerate(dst)]
        return f"{expr}.expand{as_tuple(sizes)}", lead
    if name == "unsqueeze":
        return f"{expr}.unsqueeze({args[1]})", lead
    if name == "squeeze":
        return (f"{expr}.squeeze({tuple(args[1]) if isinstance(args[1], (list, tuple)) else args[1]})"
                if len(args) > 1 else f"{expr}.squeeze()"), lead
    if name == "select":
        return f"{expr}.select({args[1]}, {args[2]})", lead
    if name == "slice":
        dim = (args[1] if len(args) > 1 else 0) % len(src)
        start = args[2] if len(args) > 2 and args[2] is not None else ""
        end = args[3] if len(args) > 3 and args[3] is not None else ""
        step = args[4] if len(args) > 4 else 1
        return f"{expr}[{':, ' * dim}{start}:{end}:{step}]", lead
    return expr, lead  # clone, alias, casts: the values are read as they are


def chainable(n: Any, taken: set[fx.Node]) -> bool:
    if not isinstance(n, fx.Node) or n.op != "call_function" or n in taken or op_name(n) not in OPERAND_OPS:
        return False
    if not n.args or not isinstance(n.args[0], fx.Node) or dtype(n) not in FLOATS:
        return False
    return op_name(n) not in CASTS or set(n.kwargs) <= {"dtype", "memory_format"}


def operand(node: fx.Node, inside: set[fx.Node], taken: set[fx.Node]) -> Operand:
    """Walk up from a GEMM operand through views/casts used only on this path; they become launcher strides."""
    chain: list[fx.Node] = []
    n, casts = node, 0
    while chainable(n, taken) and all(u in inside or u in chain for u in n.users):
        casts += op_name(n) in CASTS
        if casts > 1:
            break
        chain.append(n)
        n = n.args[0]
    expr, lead = f"x_{n.name}", None
    for c in reversed(chain):
        expr, lead = _replay(c, expr, lead)
    cast = TL_DTYPES[dtype(node)] if dtype(n) != dtype(node) else None
    return Operand(chain, n, expr, cast, lead)


def _absorbable(u: fx.Node, region: set[fx.Node], numel: int, extras: dict[fx.Node, tuple]) -> bool:
    if u.op != "call_function" or dtype(u) is None or numel_of(shape(u)) != numel:
        return False
    args = tensor_args(u)
    if op_name(u) in VIEWS:
        return len(args) == 1 and args[0] in region and keeps_order(u)
    if not can_emit(u):
        return False
    new = [a for a in args if a not in region]
    for a in args:
        if a in region and numel_of(shape(a)) != numel:
            return False
        if a not in region and (dtype(a) is None or extras.get(a, shape(u)) != shape(u)):
            return False
    if len(set(extras) | set(new)) > MAX_EXTRAS:
        return False
    return is_convex(region | {u})


def feeding_casts(region: set[fx.Node], operands: list[Operand], taken: set[fx.Node]) -> list[fx.Node]:
    """Casts of outside tensors that only the region reads (a half bias up-cast for the add): the kernel loads the
    tensor as it is and converts it, so no converted copy is written. GEMM operand sources are left as they are."""
    sources = {o.source for o in operands}
    found: list[fx.Node] = []
    todo = list(region)
    while todo:
        for a in tensor_args(todo.pop()):
            if a in region or a in sources or a in found or not chainable(a, taken) or op_name(a) not in CASTS:
                continue
            if dtype(a.args[0]) in FLOATS and all(u in region or u in found for u in a.users):
                found.append(a)
                todo.append(a)
    return found


def grow(base: set[fx.Node], numel: int, taken: set[fx.Node]) -> list[fx.Node]:
    """Pointwise consumers of ``base`` absorbed in graph order, then cut to the prefix that leaves fewest outputs."""
    order = {n: i for i, n in enumerate(next(iter(base)).graph.nodes)}
    region, absorbed, extras = set(base), [], {}
    while True:
        cands = sorted({u for n in region for u in n.users if u not in region and u not in taken}, key=order.get)
        u = next((c for c in cands if _absorbable(c, region, numel, extras)), None)
        if u is None:
            break
        region.add(u)
        absorbed.append(u)
        extras.update({a: shape(u) for a in tensor_args(u) if a not in region})
    best, cut = len(region_io(base)[1]), 0
    for k in range(1, len(absorbed) + 1):
        n_out = len(region_io(list(base) + absorbed[:k])[1])
        if n_out <= best:
            best, cut = n_out, k
    kept = set(base) | set(absorbed[:cut])
    # constants the epilogue reads (``torch.where(h > 0, h, 0.0)``'s 0.0) become literals, not tensors made per call
    consts = [a for a in dict.fromkeys(a for n in absorbed[:cut] for a in tensor_args(n))
              if op_name(a) == "scalar_tensor" and a not in taken and all(u in kept for u in a.users)]
    return sorted(consts + absorbed[:cut], key=order.get)


def gemm_parts(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None, float, float]:
    """(A, B, bias, alpha, beta) of a GEMM node."""
    if op_name(node) in ("mm", "bmm"):
        return node.args[0], node.args[1], None, 1.0, 1.0
    return node.args[1], node.args[2], node.args[0], node.kwargs.get("alpha", 1.0), node.kwargs.get("beta", 1.0)


def is_gemm(node: fx.Node, taken: set[fx.Node]) -> bool:
    return (node.op == "call_function" and node not in taken and op_name(node) in GEMMS and dtype(node) in FLOATS
            and all(dtype(a) in FLOATS for a in tensor_args(node)))


def half_source(operands: list[Operand]) -> torch.dtype | None:
    """The half type every operand was up-cast from, if one: a product of two fp16 (bf16) values is exact in fp32,
    so the dot runs on the half tiles at the tensor-core rate with the same fp32 accumulation as the fp32 GEMM."""
    kinds = {dtype(o.source) for o in operands}
    if len(kinds) != 1 or not kinds <= {torch.float16, torch.bfloat16}:
        return None
    return kinds.pop() if all(o.cast == "tl.float32" for o in operands) else None
