"""Matmul-shaped families: a tiled GEMM with a fused pointwise epilogue, and the larger patterns built on it.

``mm``/``addmm``/``bmm``/``baddbmm`` are matched on the graph: the views and casts that feed an operand are replayed
in the launcher as strides (a weight's ``permute`` costs no copy), and the pointwise nodes that consume the product
(bias, activation, scale, residual, casts, order-keeping views) run in the kernel before the one store. Extra epilogue
operands are broadcast to the output in the launcher and read through their strides (a cast of one, such as a half
bias up-cast to fp32, is done on the loaded values); a stride that is zero for every shape (a bias along M) is left out
of the address. Half operands up-cast for an fp32 GEMM (how half ``baddbmm`` traces) are multiplied as half tiles.
Families tried first claim bigger regions: two GEMMs that share their A and meet in one pointwise result (SwiGLU), two
chained batched layers (multi-task towers) and DCN cross layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, is_convex, op_name, region_io, shape, tensor_args
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, compute_dtype, emit
from kernelevolve.templates.base import Match, make_match

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "permute", "transpose", "t", "alias", "clone",
         "detach", "contiguous", "lift_fresh_copy"}
CASTS = {"_to_copy", "convert_element_type"}
OPERAND_OPS = VIEWS | CASTS | {"expand", "select", "slice"}
SPLITS = {"split", "split_with_sizes"}
SMEM_BYTES = 200 * 1024  # H100/H200 allow 227 KB per block; the rest is left to the epilogue's layout conversion
REDUCE_BLOCK = (32, 128)
SMS = 132
MAX_EXTRAS = 8
MAX_FUSED_H = 256  # widest tower intermediate kept in registers

KNOBS: dict[str, list[Any]] = {"BLOCK_M": [128, 64, 256, 32], "BLOCK_N": [128, 64, 256, 32], "BLOCK_K": [64, 32, 128],
                               "GROUP_M": [8, 4, 1], "SPLIT_K": [1, 2, 4, 8], "num_warps": [4, 8],
                               "num_stages": [3, 4, 2, 5]}


# ---- graph side: operands, epilogues -------------------------------------------------------------------------------


def _numel(s: tuple[int, ...]) -> int:
    return math.prod(s)


def _tup(s: Any) -> str:
    s = tuple(s)
    return f"({s[0]},)" if len(s) == 1 else f"({', '.join(map(str, s))})"


def _keeps_order(node: fx.Node) -> bool:
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
        if len(src) > 2 and dst == (_numel(src[:-1]), src[-1]):
            return f"{expr}.flatten(0, -2)", (f"{expr}.shape[:-1]", src[:-1])
        return f"{expr}.reshape{_tup(dst)}", lead
    if name == "permute":
        return f"{expr}.permute{_tup(args[1])}", lead
    if name == "t":
        return f"{expr}.t()", lead
    if name == "transpose":
        return f"{expr}.transpose({args[1]}, {args[2]})", lead
    if name == "expand":
        off = len(dst) - len(src)
        sizes = [-1 if i >= off and src[i - off] == d else d for i, d in enumerate(dst)]
        return f"{expr}.expand{_tup(sizes)}", lead
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


def _chainable(n: Any, taken: set[fx.Node]) -> bool:
    if not isinstance(n, fx.Node) or n.op != "call_function" or n in taken or op_name(n) not in OPERAND_OPS:
        return False
    if not n.args or not isinstance(n.args[0], fx.Node) or dtype(n) not in FLOATS:
        return False
    return op_name(n) not in CASTS or set(n.kwargs) <= {"dtype", "memory_format"}


def operand(node: fx.Node, inside: set[fx.Node], taken: set[fx.Node]) -> Operand:
    """Walk up from a GEMM operand through views/casts used only on this path; they become launcher strides."""
    chain: list[fx.Node] = []
    n, casts = node, 0
    while _chainable(n, taken) and all(u in inside or u in chain for u in n.users):
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
    if u.op != "call_function" or dtype(u) is None or _numel(shape(u)) != numel:
        return False
    args = tensor_args(u)
    if op_name(u) in VIEWS:
        return len(args) == 1 and args[0] in region and _keeps_order(u)
    if not can_emit(u):
        return False
    new = [a for a in args if a not in region]
    for a in args:
        if a in region and _numel(shape(a)) != numel:
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
            if a in region or a in sources or a in found or not _chainable(a, taken) or op_name(a) not in CASTS:
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
    return absorbed[:cut]


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


# ---- the stage description (plain data) ----------------------------------------------------------------------------


@dataclass
class Head:
    value: fx.Node  # the node whose value is this accumulator (the GEMM, or a getitem of its split)
    gemm: fx.Node
    b: Operand
    chunk: int | None = None  # which half of a split product this head is


class StageBuilder:
    """Collects what one GEMM stage renders to: operand expressions, epilogue lines, extra operands, stores."""

    def __init__(self, tag: str, a: Operand, heads: list[Head], casts: set[fx.Node] | frozenset = frozenset()):
        self.tag, self.a, self.heads, self.casts = tag, a, heads, casts
        g = heads[0].gemm
        self.batched = op_name(g) in ("bmm", "baddbmm")
        a_shape, b_shape = shape(gemm_parts(g)[0]), shape(gemm_parts(g)[1])
        n = b_shape[-1] // (2 if heads[0].chunk is not None else 1)
        self.sizes = {"Bt": a_shape[0] if self.batched else 1, "M": a_shape[-2], "N": n, "K": a_shape[-1]}
        self.canon = (self.sizes["Bt"], self.sizes["M"], n)
        self.env: dict[fx.Node, str] = {}
        self.lines: list[str] = []
        self.extras: list[dict[str, str]] = []
        self.extra_nodes: set[fx.Node] = set()
        self._extra_var: dict[tuple, str] = {}
        self.narrow = half_source([a] + [h.b for h in heads])
        self.dot = TL_DTYPES[self.narrow or dtype(g)]
        self._heads()

    def shape_expr(self, s: tuple[int, ...]) -> str:
        _, m, n = self.canon
        if s == (tuple(self.canon) if self.batched else (m, n)):
            return "(Bt, M, N)" if self.batched else "(M, N)"
        if self.a.lead and s == tuple(self.a.lead[1]) + (n,):
            return f"(*{self.a.lead[0]}, N)"
        return _tup(s)

    def _extra(self, node: fx.Node, target: tuple[int, ...], target_expr: str, chunk: int | None = None) -> str:
        key = (node, target, chunk)
        if key in self._extra_var:
            return self._extra_var[key]
        casts = []
        while node in self.casts:
            casts.insert(0, node)
            node = node.args[0]
        var = f"{self.tag}_e{len(self.extras)}"
        meta = torch.empty_strided(shape(node), node.meta["val"].stride(), device="meta").expand(target)
        expr = f"x_{node.name}.expand{target_expr}"
        if chunk is not None:
            meta, expr = meta.chunk(2, -1)[chunk], f"{expr}.chunk(2, -1)[{chunk}]"
        strides = meta.reshape(self.canon).stride()
        dims = "".join(d for d, s in zip("bmn", strides) if s != 0 and (d != "b" or self.batched))
        self.extras.append({"var": var, "expr": f"{expr}.reshape(Bt, M, N)", "dims": dims,
                            "type": compute_dtype(dtype(node))})
        self.extra_nodes.add(node)
        if casts:  # the loaded tensor converted as the graph's casts do (rounded where one narrows)
            var = emit(casts, {node: var}, self.lines, prefix=f"{var}_c")[casts[-1]]
        self._extra_var[key] = var
        return var

    def _heads(self) -> None:
        for j, h in enumerate(self.heads):
            acc = f"{self.tag}_acc{j}"
            _, _, bias, alpha, beta = gemm_parts(h.gemm)
            if bias is None and alpha == 1.0:
                self.env[h.value] = acc
                continue
            val = f"{acc} * {float(alpha)!r}" if alpha != 1.0 else acc
            if bias is not None and beta != 0:
                full = self.canon if self.batched else self.canon[1:]
                full_expr = "(Bt, M, N)" if self.batched else "(M, N)"
                if h.chunk is not None:
                    full = full[:-1] + (2 * full[-1],)
                    full_expr = full_expr[:-2] + "2 * N)"
                e = self._extra(bias, full, full_expr, h.chunk)
                val = f"{val} + {e} * {float(beta)!r}" if beta != 1.0 else f"{val} + {e}"
            self.lines.append(f"{self.tag}_h{j} = {val}")
            self.env[h.value] = f"{self.tag}_h{j}"

    def epilogue(self, nodes: list[fx.Node]) -> None:
        for i, u in enumerate(nodes):
            if op_name(u) in VIEWS:
                self.env[u] = self.env[u.args[0]]
                continue
            local = dict(self.env)  # an extra is named for the broadcast its consumer gives it
            for a in tensor_args(u):
                if a not in self.env:
                    local[a] = self._extra(a, shape(u), self.shape_expr(shape(u)))
            self.env[u] = emit([u], local, self.lines, prefix=f"{self.tag}_v{i}_")[u]

    def build(self, stores: list[fx.Node]) -> dict[str, Any]:
        return {"tag": self.tag, "batched": self.batched, "dot": self.dot, "sizes": self.sizes,
                "a": {"expr": self.a.expr, "cast": None if self.narrow else self.a.cast},
                "bs": [{"expr": h.b.expr + (f".chunk(2, -1)[{h.chunk}]" if h.chunk is not None else ""),
                        "cast": None if self.narrow else h.b.cast} for h in self.heads],
                "accs": [f"{self.tag}_acc{j}" for j in range(len(self.heads))],
                "extras": self.extras, "lines": self.lines,
                "stores": [{"name": f"x_{o.name}", "var": self.env[o], "shape": self.shape_expr(shape(o)),
                            "dtype": str(dtype(o))} for o in stores]}


# ---- rendering -----------------------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _itemsize(tl_dtype: str) -> int:
    return 4 if tl_dtype == "tl.float32" else 2


def _first(value: Any, values: list[Any]) -> list[Any]:
    return [value] + [v for v in values if v != value]


def fit(config: dict[str, Any], sizes: dict[str, int], itemsize: int, n_b: int) -> dict[str, Any]:
    """Clamp a configuration: blocks no larger than the problem, accumulators within the registers, pipeline
    buffers within shared memory. Every combination of the knob values renders a kernel that compiles."""
    bm = min(config["BLOCK_M"], max(16, _pow2(sizes["M"])))
    bn = min(config["BLOCK_N"], max(16, _pow2(sizes["N"])))
    bk = min(config["BLOCK_K"], max(16, _pow2(sizes["K"])))
    warps, stages = config["num_warps"], config["num_stages"]
    while n_b * bm * bn > 128 * 32 * warps:  # more than 128 fp32 accumulator registers per thread spills
        if warps < 8:
            warps = 8
        elif bn >= bm:
            bn //= 2
        else:
            bm //= 2
    while stages > 2 and stages * (bm + n_b * bn) * bk * itemsize > SMEM_BYTES:
        stages -= 1
    while bk > 16 and stages * (bm + n_b * bn) * bk * itemsize > SMEM_BYTES:
        bk //= 2
    split = max(1, min(config.get("SPLIT_K", 1), -(-sizes["K"] // bk)))
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": config.get("GROUP_M", 8), "SPLIT_K": split,
            "num_warps": warps, "num_stages": stages}


def precisions(dot: str, allow_tf32: bool) -> list[str]:
    """fp32 dot modes, the default first: exact FMA unless tf32 is allowed; tf32x3 (three tf32 tensor-core dots on
    a hi/lo split) keeps about fp32 accuracy and is left to the search."""
    if dot != "tl.float32":
        return []
    return ["tf32", "tf32x3", "ieee"] if allow_tf32 else ["ieee", "tf32x3"]


def gemm_space(sizes: dict[str, int], dot: str, n_b: int, allow_tf32: bool = False) -> dict[str, list[Any]]:
    m, n, k, bt = sizes["M"], sizes["N"], sizes["K"], sizes["Bt"]
    ieee = dot == "tl.float32" and not allow_tf32
    tiles = [(128, 256), (128, 128), (64, 128), (64, 64), (32, 64), (32, 32)][n_b > 1 or ieee:]
    fitting = [(bm, bn) for bm, bn in tiles if bm <= max(32, _pow2(m)) and bn <= max(32, _pow2(n))]
    count = lambda t: bt * -(-m // t[0]) * -(-n // t[1])  # noqa: E731
    # the largest tile that still gives two waves over the 132 SMs of an H100/H200 (a 4096x1024x1024 bf16 GEMM:
    # 64x128 tiles 0.030 ms, 128x128 0.060 ms)
    bm, bn = next((t for t in fitting if count(t) >= 2 * SMS), fitting[-1])
    split = 1
    while split < 8 and count((bm, bn)) * split < SMS and k // (split * 2) >= 256:
        split *= 2
    default = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32 if ieee else 64, "GROUP_M": 8, "SPLIT_K": split,
               "num_warps": 8 if n_b * bm * bn >= 128 * 256 else 4, "num_stages": 3}
    space = {key: _first(default[key], values) for key, values in KNOBS.items()}
    return {**space, "INPUT_PRECISION": precisions(dot, allow_tf32)} if dot == "tl.float32" else space


def _precision(dot: str, mode: str | None) -> str:
    return f', input_precision="{mode}"' if dot == "tl.float32" and mode else ""


def _dot(out: str, x: str, y: str, acc: str | None, dot: str, prec: str) -> list[str]:
    """``out = x @ y (+ acc)``. The interpreter multiplies bf16 bit patterns in tl.dot (triton#11584), so there, and
    only there (UPCAST is a constexpr), bf16 operands are widened first."""
    tail = f", {acc}{prec})" if acc else f"{prec})"
    line = f"{out} = tl.dot({x}, {y}{tail}"
    if dot != "tl.bfloat16":
        return [line]
    return ["if UPCAST:", f"    {out} = tl.dot({x}.to(tl.float32), {y}.to(tl.float32){tail}", "else:", f"    {line}"]


def upcast_flag(name: str, kernel: str) -> str:
    return f'{name}_UPCAST = type({kernel}).__name__ == "InterpretedFunction"'


def _epi_ptrs(st: dict[str, Any], stores: bool = True) -> list[str]:
    ptrs = [f"{e['var']}_ptr" for e in st["extras"]]
    return ptrs + ([f"{st['tag']}_o{j}_ptr" for j in range(len(st["stores"]))] if stores else [])


def _epi_strides(st: dict[str, Any]) -> list[str]:
    return [f"{e['var']}_s{d}" for e in st["extras"] for d in e["dims"]]


def _launch_strides(st: dict[str, Any], var: str = "e") -> list[str]:
    return [f"{var}[{j}].stride({'bmn'.index(d)})" for j, e in enumerate(st["extras"]) for d in e["dims"]]


def _load_extra(e: dict[str, str], rn: str, mask_n: str, mask: str) -> str:
    v, dims = e["var"], e["dims"]
    off = [f"{v}_ptr"] + ([f"rb64 * {v}_sb"] if "b" in dims else [])
    if "m" in dims and "n" in dims:
        off, m, tail = off + [f"rm64[:, None] * {v}_sm", f"{rn}[None, :] * {v}_sn"], mask, ""
    elif "m" in dims:
        off, m, tail = off + [f"rm64 * {v}_sm"], "mask_m", "[:, None]"
    elif "n" in dims:
        off, m, tail = off + [f"{rn} * {v}_sn"], mask_n, "[None, :]"
    else:
        m, tail = None, ""
    load = f"tl.load({' + '.join(off)}" + (f", mask={m}, other=0)" if m else ")")
    return f"{v} = {load}{tail}.to({e['type']})"


def _epilogue(st: dict[str, Any], rn: str = "rn", mask_n: str = "mask_n", mask: str = "mask", n: str = "N",
              stores: bool = True) -> list[str]:
    # 64-bit row offsets: an lm-head output (16384 x 128256) passes 2**31 elements
    out = ["rm64 = rm.to(tl.int64)"] + [_load_extra(e, rn, mask_n, mask) for e in st["extras"]] + list(st["lines"])
    if stores and st["stores"]:
        out.append(f"out_off = rb64 * M * {n} + rm64[:, None] * {n} + {rn}[None, :]")
        for j, s in enumerate(st["stores"]):
            p = f"{st['tag']}_o{j}_ptr"
            out.append(f"tl.store({p} + out_off, {s['var']}.to({p}.dtype.element_ty), mask={mask})")
    return out


def _indent(lines: list[str], depth: int) -> list[str]:
    return [" " * (4 * depth) + line for line in lines]


def _k_loop(loads: list[tuple[str, str, str, str, str]], dots: list[str], step: str) -> list[str]:
    """The K loop body; a load is (var, pointer, mask when K divides evenly, mask otherwise, cast)."""
    def load(v: str, p: str, m: str, c: str) -> str:
        return f"{v} = tl.load({p}, mask={m}, other=0.0){c}" if m else f"{v} = tl.load({p}){c}"

    full = [load(v, p, m, c) for v, p, m, _, c in loads]
    masked = [load(v, p, m, c) for v, p, _, m, c in loads]
    return ["if EVEN_K:"] + _indent(full, 1) + ["else:", f"    k_left = K - k * {step}"] + _indent(masked, 1) + dots


def gemm_kernel(name: str, st: dict[str, Any], split_k: int, prec: str) -> str:
    nb, tag = len(st["bs"]), st["tag"]
    ptrs = ["a_ptr"] + [f"b{j}_ptr" for j in range(nb)]
    strides = ["s_ab", "s_am", "s_ak"] + [f"s_b{j}{d}" for j in range(nb) for d in "bkn"]
    if split_k == 1:
        ptrs, strides = ptrs + _epi_ptrs(st), strides + _epi_strides(st)
    else:
        ptrs.append("ws_ptr")
    ac = f".to({st['a']['cast']})" if st["a"]["cast"] else ""
    loads = [("a", "a_ptrs", "", "rk[None, :] < k_left", ac)]
    loads += [(f"b{j}", f"b{j}_ptrs", "", "rk[:, None] < k_left", f".to({b['cast']})" if b["cast"] else "")
              for j, b in enumerate(st["bs"])]
    accs = st["accs"]
    dots = [line for j, acc in enumerate(accs) for line in _dot(acc, "a", f"b{j}", acc, st["dot"], prec)]
    steps = ["a_ptrs += (BLOCK_K * SPLIT_K) * s_ak"]
    steps += [f"b{j}_ptrs += (BLOCK_K * SPLIT_K) * s_b{j}k" for j in range(nb)]
    body = ["pid = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)", "grid_m = tl.cdiv(M, BLOCK_M)",
            "grid_n = tl.cdiv(N, BLOCK_N)", "width = GROUP_M * grid_n", "first_m = (pid // width) * GROUP_M",
            "size_m = min(grid_m - first_m, GROUP_M)", "pid_m = first_m + (pid % width) % size_m",
            "pid_n = (pid % width) // size_m", "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", "rk = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)",
            # rows/columns past the edge read wrapped data (never stored), so the K loop needs no M/N masks
            "a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak"]
    body += [f"b{j}_ptrs = b{j}_ptr + rb64 * s_b{j}b + rk[:, None] * s_b{j}k + (rn % N)[None, :] * s_b{j}n"
             for j in range(nb)]
    body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    body += ["for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):"]
    body += _indent(_k_loop(loads, dots, "(BLOCK_K * SPLIT_K)") + steps, 1)
    body += ["mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]"]
    if split_k == 1:
        body += _epilogue(st)
    else:
        body += ["plane = tl.num_programs(1).to(tl.int64) * M * N",
                 "ws_off = rb64 * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]"]
        body += [f"tl.store(ws_ptr + ({j} * SPLIT_K + tl.program_id(2)) * plane + ws_off, {acc}, mask=mask)"
                 for j, acc in enumerate(accs)]
    head = [f"def {name}_{tag}_kernel({', '.join(ptrs + ['M', 'N', 'K'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,",
            "        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + _indent(body, 1))


def reduce_kernel(name: str, st: dict[str, Any]) -> str:
    """Second pass of split-K: sum the fp32 partials, then the epilogue."""
    params = ["ws_ptr"] + _epi_ptrs(st) + ["M", "N"] + _epi_strides(st)
    body = ["pid = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)", "grid_n = tl.cdiv(N, BLOCK_N)",
            "rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)",
            "mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]",
            "plane = tl.num_programs(1).to(tl.int64) * M * N",
            "ws_ptrs = ws_ptr + rb64 * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]"]
    for j, acc in enumerate(st["accs"]):
        body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)", "for s in tl.static_range(SPLIT_K):",
                 f"    {acc} += tl.load(ws_ptrs + ({j} * SPLIT_K + s) * plane, mask=mask, other=0.0)"]
    body += _epilogue(st)
    head = [f"def {name}_{st['tag']}_reduce({', '.join(params)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + _indent(body, 1))


def prep_text(name: str, st: dict[str, Any], params: list[str], stores: bool = True) -> str:
    """Extra operands broadcast to the output (strides, no copies where a view does) and the outputs allocated."""
    outs = st["stores"] if stores else []
    extras = "".join(f"{e['expr']}, " for e in st["extras"])
    allocs = "".join(f"torch.empty((Bt, M, N), device=device, dtype={s['dtype']}), " for s in outs)
    views = "".join(f"o[{j}].view{s['shape']}, " for j, s in enumerate(outs))
    return "\n".join([f"def {name}_{st['tag']}_prep(Bt, M, N, device, {', '.join(params)}):",
                      f"    e = ({extras})", f"    o = ({allocs})", f"    return e, o, ({views})"])


def stage_text(name: str, st: dict[str, Any], cfg: dict[str, Any], params: list[str]) -> str:
    tag, nb, sk = st["tag"], len(st["bs"]), cfg["SPLIT_K"]
    un = "" if st["batched"] else ".unsqueeze(0)"
    bs = ", ".join(f"b{j}" for j in range(nb))
    lines = [f"def {name}_{tag}({', '.join(params)}):", f"    a = ({st['a']['expr']}){un}"]
    lines += [f"    b{j} = ({b['expr']}){un}" for j, b in enumerate(st["bs"])]
    lines += ["    Bt, M, K = a.shape", "    N = b0.shape[2]"]
    for j in range(nb):
        lines += [f"    if tuple(b{j}.shape) != (Bt, K, N):",
                  f"        raise ValueError(f'{name}: cannot multiply {{tuple(a.shape)}} by {{tuple(b{j}.shape)}}')"]
    lines.append(f"    e, o, views = {name}_{tag}_prep(Bt, M, N, a.device, {', '.join(params)})")
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    grid = f"(triton.cdiv(M, {bm}) * triton.cdiv(N, {bn}), Bt, {sk})"
    strides = "*a.stride(), " + "".join(f"*b{j}.stride(), " for j in range(nb))
    consts = (f"BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={cfg['GROUP_M']}, SPLIT_K={sk}, "
              f"EVEN_K=K % {bk * sk} == 0, UPCAST={name}_UPCAST, num_warps={cfg['num_warps']}, "
              f"num_stages={cfg['num_stages']}")
    extra_strides = "".join(f"{s}, " for s in _launch_strides(st))
    if sk == 1:
        lines.append(f"    {name}_{tag}_kernel[{grid}](a, {bs}, *e, *o, M, N, K, {strides}{extra_strides}{consts})")
    else:
        rm, rn = REDUCE_BLOCK
        lines += [f"    ws = torch.empty(({nb}, {sk}, Bt, M, N), device=a.device, dtype=torch.float32)",
                  f"    {name}_{tag}_kernel[{grid}](a, {bs}, ws, M, N, K, {strides}{consts})",
                  f"    {name}_{tag}_reduce[(triton.cdiv(M, {rm}) * triton.cdiv(N, {rn}), Bt)](ws, *e, *o, M, N, "
                  f"{extra_strides}BLOCK_M={rm}, BLOCK_N={rn}, SPLIT_K={sk}, num_warps=4)"]
    lines.append("    return views")
    return "\n".join(lines)


def launcher_text(name: str, match: Match, calls: list[tuple[str, list[str], list[str]]]) -> str:
    """``def name(*inputs)``: unpack the inputs, run each (function, arguments, results), return the outputs."""
    ins = [f"x_{n.name}" for n in match.inputs]
    lines = [f"def {name}(*inputs):", f"    {', '.join(ins)}, = inputs"]
    lines += [f"    {', '.join(res)}, = {fn}({', '.join(args)})" for fn, args, res in calls]
    lines.append(f"    return ({''.join(f'x_{o.name}, ' for o in match.outputs)})")
    return "\n".join(lines)


def render_gemm(match: Match, st: dict[str, Any], config: dict[str, Any], name: str) -> list[str]:
    """Kernel(s), prep and stage function of one GEMM stage."""
    cfg = fit(config, st["sizes"], _itemsize(st["dot"]), len(st["bs"]))
    prec = _precision(st["dot"], config.get("INPUT_PRECISION", "ieee"))
    params = [f"x_{n.name}" for n in match.inputs] + match.spec.get("intermediates", [])[:int(st["tag"][1:])]
    parts = [gemm_kernel(name, st, cfg["SPLIT_K"], prec)]
    if st["tag"] == "s0":
        parts.append(upcast_flag(name, f"{name}_s0_kernel"))
    if cfg["SPLIT_K"] > 1:
        parts.append(reduce_kernel(name, st))
    return parts + [prep_text(name, st, params), stage_text(name, st, cfg, params)]


def fit_fused(config: dict[str, Any], s0: dict[str, int], s1: dict[str, int], itemsize: int) -> dict[str, Any]:
    bm = min(config["BLOCK_M"], max(16, _pow2(s0["M"])))
    bk = min(config["BLOCK_K"], max(16, _pow2(s0["K"])))
    bn = min(config["BLOCK_N"], max(16, _pow2(s1["N"])))
    bh = max(16, _pow2(s0["N"]))
    warps, stages = config["num_warps"], config["num_stages"]
    while bm > 16 and bm * (bh + bn) > 128 * 32 * warps:  # both accumulators live at once
        if warps < 8:
            warps = 8
        else:
            bm //= 2
    while stages > 2 and (stages * (bm + bh) * bk + bh * bn) * itemsize > SMEM_BYTES:
        stages -= 1
    while bk > 16 and (stages * (bm + bh) * bk + bh * bn) * itemsize > SMEM_BYTES:
        bk //= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}


def fused_kernel(name: str, s0: dict[str, Any], s1: dict[str, Any], prec0: str, prec1: str) -> str:
    """Two chained batched layers per (row block, batch): the first layer's whole output row block stays in
    registers (H <= 256) and feeds the second layer's dots, which loop over the output columns."""
    ptrs = ["a_ptr", "b_ptr", "c_ptr"] + _epi_ptrs(s0, stores=False) + _epi_ptrs(s1)
    strides = ["s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn", "s_cb", "s_ck", "s_cn"]
    strides += _epi_strides(s0) + _epi_strides(s1)
    ac = f".to({s0['a']['cast']})" if s0["a"]["cast"] else ""
    bc = f".to({s0['bs'][0]['cast']})" if s0["bs"][0]["cast"] else ""
    cc = f".to({s1['bs'][0]['cast']})" if s1["bs"][0]["cast"] else ""
    acc0, acc1 = s0["accs"][0], s1["accs"][0]
    loads = [("a", "a_ptrs", "", "rk[None, :] < k_left", ac),
             ("b", "b_ptrs", "mask_h[None, :]", "(rk[:, None] < k_left) & mask_h[None, :]", bc)]
    body = ["pid_m = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)",
            "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "rh = tl.arange(0, BLOCK_H)", "rk = tl.arange(0, BLOCK_K)",
            "mask_m = rm < M", "mask_h = rh < H", "mask0 = mask_m[:, None] & mask_h[None, :]",
            "a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak",
            "b_ptrs = b_ptr + rb64 * s_bb + rk[:, None] * s_bk + rh[None, :] * s_bn",
            f"{acc0} = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)", "for k in range(0, tl.cdiv(K, BLOCK_K)):"]
    body += _indent(_k_loop(loads, _dot(acc0, "a", "b", acc0, s0["dot"], prec0), "BLOCK_K")
                    + ["a_ptrs += BLOCK_K * s_ak", "b_ptrs += BLOCK_K * s_bk"], 1)
    body += _epilogue(s0, "rh", "mask_h", "mask0", "H", stores=False)
    # padded columns must be exact zeros: an epilogue such as sigmoid turns the zero padding into 0.5
    body += [f"hv = tl.where(mask_h[None, :], {s0['stores'][0]['var']}, 0.0).to({s1['dot']})",
             "c_ptrs = c_ptr + rb64 * s_cb + rh[:, None] * s_ck", "for n0 in range(0, N, BLOCK_N):"]
    loop = ["rn = n0 + tl.arange(0, BLOCK_N)", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]",
            f"c = tl.load(c_ptrs + rn[None, :] * s_cn, mask=mask_h[:, None] & mask_n[None, :], other=0.0){cc}",
            *_dot(acc1, "hv", "c", None, s1["dot"], prec1)]
    body += _indent(loop + _epilogue(s1), 1)
    head = [f"def {name}_kernel({', '.join(ptrs + ['M', 'K', 'H', 'N'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,",
            "        EVEN_K: tl.constexpr, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + _indent(body, 1))


def fused_launcher(name: str, match: Match, s0: dict[str, Any], s1: dict[str, Any], cfg: dict[str, Any]) -> str:
    ins = [f"x_{n.name}" for n in match.inputs]
    params = ", ".join(ins)
    strides = ", ".join(["*a.stride(), *b.stride(), *c.stride()"] + _launch_strides(s0, "e0")
                        + _launch_strides(s1, "e1"))
    bm, bk = cfg["BLOCK_M"], cfg["BLOCK_K"]
    views = {s["name"]: f"views[{j}]" for j, s in enumerate(s1["stores"])}
    return "\n".join([
        f"def {name}(*inputs):", f"    {params}, = inputs", f"    a = {s0['a']['expr']}",
        f"    b = {s0['bs'][0]['expr']}", f"    c = {s1['bs'][0]['expr']}", "    Bt, M, K = a.shape",
        "    H, N = b.shape[2], c.shape[2]", "    if tuple(b.shape) != (Bt, K, H) or tuple(c.shape) != (Bt, H, N):",
        f"        raise ValueError(f'{name}: cannot chain {{tuple(a.shape)}}, {{tuple(b.shape)}}, {{tuple(c.shape)}}')",
        f"    e0, _, _ = {name}_{s0['tag']}_prep(Bt, M, H, a.device, {params})",
        f"    e1, o, views = {name}_{s1['tag']}_prep(Bt, M, N, a.device, {params})",
        f"    {name}_kernel[(triton.cdiv(M, {bm}), Bt)](a, b, c, *e0, *e1, *o, M, K, H, N, {strides},",
        f"        BLOCK_M={bm}, BLOCK_K={bk}, BLOCK_H=max(16, triton.next_power_of_2(H)), BLOCK_N={cfg['BLOCK_N']},",
        f"        EVEN_K=K % {bk} == 0, UPCAST={name}_UPCAST, num_warps={cfg['num_warps']}, "
        f"num_stages={cfg['num_stages']})",
        f"    return ({''.join(views[f'x_{o.name}'] + ', ' for o in match.outputs)})"])


# ---- families ------------------------------------------------------------------------------------------------------


def _reaches(start: fx.Node, goal: fx.Node, region: set[fx.Node]) -> bool:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        if n is goal:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(u for u in n.users if u in region)
    return False


def finish(family: str, kind: str, base: set[fx.Node], epi: list[fx.Node], a: Operand,
           heads: list[Head], taken: set[fx.Node]) -> Match | None:
    """One-stage match over ``base`` + ``epi`` (and the casts feeding them), or None when it is not convex or leaves
    a value without a name."""
    casts = feeding_casts(base | set(epi), [a] + [h.b for h in heads], taken)
    match = make_match(family, list(base) + epi + casts, {}, kind)
    if match is None:
        return None
    sb = StageBuilder("s0", a, heads, set(casts))
    sb.epilogue(epi)
    if any(o not in sb.env for o in match.outputs) or not sb.extra_nodes <= set(match.inputs):
        return None
    match.spec = {"stages": [sb.build(match.outputs)]}
    return match


def single(family: str, kind: str, node: fx.Node, taken: set[fx.Node]) -> tuple[Match | None, Operand, list]:
    a_node, b_node = gemm_parts(node)[:2]
    a = operand(a_node, {node}, taken)
    b = operand(b_node, {node, *a.nodes}, taken)
    base = {node, *a.nodes, *b.nodes}
    epi = grow(base, _numel(shape(node)), taken)
    return finish(family, kind, base, epi, a, [Head(node, node, b)], taken), a, epi


class MatmulTemplate:
    """One GEMM (mm/addmm/bmm/baddbmm, nn.Linear) with its operand views and its pointwise epilogue."""

    family = "matmul"
    kind = "matmul"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        taken, found = set(taken), []
        for node in graph.calls():
            if is_gemm(node, taken):
                match = self.claim(node, taken)
                if match is not None:
                    found.append(match)
                    taken |= set(match.nodes)
        return found

    def claim(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        return single(self.family, self.kind, node, taken)[0]

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        st = match.spec["stages"][0]
        return gemm_space(st["sizes"], st["dot"], len(st["bs"]), match.spec.get("allow_tf32", False))

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        config = {**{k: v[0] for k, v in self.space(match, "cuda").items()}, **config}
        st = match.spec["stages"][0]
        parts = render_gemm(match, st, config, name)
        ins = [f"x_{n.name}" for n in match.inputs]
        parts.append(launcher_text(name, match, [(f"{name}_s0", ins, [s["name"] for s in st["stores"]])]))
        return "\n\n\n".join(parts) + "\n"


class CrossTemplate(MatmulTemplate):
    """A DCN-v2 cross layer, ``x0 * (x_l @ W^T + b) + x_l``: a square GEMM whose epilogue multiplies by an outside
    tensor and adds the GEMM's own input back."""

    family = "cross"
    kind = "dcn_cross"

    def claim(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        match, a, epi = single(self.family, self.kind, node, taken)
        if match is None:
            return None
        a_node = gemm_parts(node)[0]
        inside = set(match.nodes)
        outer = lambda u: [x for x in tensor_args(u) if x not in inside]  # noqa: E731
        scaled = any(op_name(u) == "mul" and outer(u) for u in epi)
        residual = any(op_name(u) == "add" and {a.source, a_node} & set(outer(u)) for u in epi)
        return match if scaled and residual and shape(node)[-1] == shape(a_node)[-1] else None


class DualGemmTemplate(MatmulTemplate):
    """Two GEMMs on one A (``x @ W1^T``, ``x @ W3^T``, or the halves of one ``x @ W13^T``) that meet in one
    pointwise result, e.g. SwiGLU ``silu(a) * b``: one kernel, A read once, two accumulators."""

    family = "dual_gemm"
    kind = "dual_gemm"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        taken, found = set(taken), []
        gemms = [n for n in graph.calls() if is_gemm(n, taken)]
        # a cheap key first: only GEMMs reading the same tensor at the same shapes can share their A
        keys = {g: (operand(gemm_parts(g)[0], {g}, taken).source, shape(g), dtype(g)) for g in gemms}
        for i, node in enumerate(gemms):
            if node in taken:
                continue
            match = self.split(node, taken)
            for other in gemms[i + 1:]:
                if match is None and other not in taken and keys[other] == keys[node]:
                    match = self.pair(node, other, taken)
            if match is not None:
                found.append(match)
                taken |= set(match.nodes)
        return found

    @staticmethod
    def _one_output(match: Match | None, heads: list[fx.Node]) -> Match | None:
        if match is None or len(match.outputs) != 1:
            return None
        region = set(match.nodes)
        return match if all(_reaches(h, match.outputs[0], region) for h in heads) else None

    def pair(self, g0: fx.Node, g1: fx.Node, taken: set[fx.Node]) -> Match | None:
        batched = op_name(g0) in ("bmm", "baddbmm")
        if batched != (op_name(g1) in ("bmm", "baddbmm")) or shape(g0) != shape(g1) or dtype(g0) != dtype(g1):
            return None
        a0 = operand(gemm_parts(g0)[0], {g0, g1}, taken)
        a1 = operand(gemm_parts(g1)[0], {g0, g1}, taken)
        if a0.expr != a1.expr or a0.cast != a1.cast:
            return None
        b0 = operand(gemm_parts(g0)[1], {g0}, taken)
        b1 = operand(gemm_parts(g1)[1], {g1}, taken)
        base = {g0, g1, *a0.nodes, *a1.nodes, *b0.nodes, *b1.nodes}
        epi = grow(base, _numel(shape(g0)), taken)
        match = finish(self.family, self.kind, base, epi, a0, [Head(g0, g0, b0), Head(g1, g1, b1)], taken)
        return self._one_output(match, [g0, g1])

    def split(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        n_full, views, v = shape(node)[-1], [], node
        while len(v.users) == 1 and not set(v.users) & taken:
            u = next(iter(v.users))
            if op_name(u) not in VIEWS or not _keeps_order(u) or shape(u)[-1] != n_full:
                break
            views.append(u)
            v = u
        s = next(iter(v.users)) if len(v.users) == 1 else None
        if s is None or s in taken or op_name(s) not in SPLITS or n_full % 2:
            return None
        dim = (s.args[2] if len(s.args) > 2 else 0) % len(shape(v))
        sizes = s.args[1] if isinstance(s.args[1], (list, tuple)) else [s.args[1]] * 2
        items = sorted(s.users, key=lambda g: g.args[1])
        if dim != len(shape(v)) - 1 or list(sizes) != [n_full // 2] * 2 or [g.args[1] for g in items] != [0, 1]:
            return None
        a_node, b_node = gemm_parts(node)[:2]
        a = operand(a_node, {node}, taken)
        b = operand(b_node, {node, *a.nodes}, taken)
        base = {node, *views, s, *items, *a.nodes, *b.nodes}
        epi = grow(base, _numel(shape(items[0])), taken)
        heads = [Head(items[0], node, b, 0), Head(items[1], node, b, 1)]
        return self._one_output(finish(self.family, self.kind, base, epi, a, heads, taken), items)


class BatchedSmallTemplate:
    """Multi-task towers: two chained batched layers ``act(X[t] @ W1[t] + b1[t]) @ W2[t] + b2[t]``, one launch over
    (tasks x row blocks); with FUSE the first layer's output (H <= 256 wide) never leaves registers."""

    family = "batched_matmul"
    kind = "batched_matmul"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        taken, found = set(taken), []
        for node in graph.calls():
            if is_gemm(node, taken) and op_name(node) in ("bmm", "baddbmm"):
                match = self.chain(node, taken)
                if match is not None:
                    found.append(match)
                    taken |= set(match.nodes)
        return found

    @staticmethod
    def _next_layer(hn: fx.Node, taken: set[fx.Node]) -> fx.Node | None:
        v = hn
        while len(v.users) == 1 and _chainable(next(iter(v.users)), taken):
            v = next(iter(v.users))
        nxt = next(iter(v.users)) if len(v.users) == 1 else None
        if nxt is None or not is_gemm(nxt, taken) or op_name(nxt) not in ("bmm", "baddbmm"):
            return None
        return nxt if gemm_parts(nxt)[0] is v else None

    def chain(self, g0: fx.Node, taken: set[fx.Node]) -> Match | None:
        a_node, b_node = gemm_parts(g0)[:2]
        a = operand(a_node, {g0}, taken)
        b = operand(b_node, {g0, *a.nodes}, taken)
        base0 = {g0, *a.nodes, *b.nodes}
        epi0 = grow(base0, _numel(shape(g0)), taken)
        outs = region_io(list(base0) + epi0)[1]
        if len(outs) != 1:
            return None
        hn = outs[0]
        # the intermediate is kept in its half type: the up-cast before the second layer is done on the loaded tile
        while hn in epi0 and op_name(hn) in CASTS and dtype(hn) == torch.float32 and len(hn.args[0].users) == 1 \
                and dtype(hn.args[0]) in (torch.float16, torch.bfloat16) and hn.args[0] in epi0:
            epi0.remove(hn)
            hn = hn.args[0]
        region0 = list(base0) + epi0
        g1 = self._next_layer(hn, taken | set(region0))
        if g1 is None or shape(g0)[-1] > MAX_FUSED_H:
            return None
        a1 = operand(gemm_parts(g1)[0], {g1}, taken | set(region0))
        keeps = all(op_name(c) in CASTS or (op_name(c) in VIEWS and _keeps_order(c)) for c in a1.nodes)
        if a1.source is not hn or not keeps or shape(gemm_parts(g1)[0]) != shape(g0):
            return None
        a1.lead = None
        b1 = operand(gemm_parts(g1)[1], {g1}, taken)
        base1 = set(region0) | {g1, *a1.nodes, *b1.nodes}
        epi1 = grow(base1, _numel(shape(g1)), taken)
        casts = feeding_casts(base1 | set(epi1), [a, b, a1, b1], taken)
        match = make_match(self.family, list(base1) + epi1 + casts, {}, self.kind)
        if match is None:
            return None
        sb0 = StageBuilder("s0", a, [Head(g0, g0, b)], set(casts))
        sb0.epilogue(epi0)
        sb1 = StageBuilder("s1", a1, [Head(g1, g1, b1)], set(casts))
        sb1.epilogue(epi1)
        # the second layer's epilogue may read outside tensors only: the first layer's values live in registers
        if any(o not in sb1.env for o in match.outputs) or not sb0.extra_nodes | sb1.extra_nodes <= set(match.inputs):
            return None
        match.spec = {"stages": [sb0.build([hn]), sb1.build(match.outputs)], "intermediates": [f"x_{hn.name}"]}
        return match

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        s0, s1 = (st["sizes"] for st in match.spec["stages"])
        dot = match.spec["stages"][0]["dot"]
        bm = 64 if s0["M"] > 32 else 32
        bn = 128 if s1["N"] > 64 else (64 if s1["N"] > 32 else 32)
        bk = 32 if dot == "tl.float32" or s0["K"] <= 32 else 64
        # measured on an H200 (8 tasks, 4096 x 512 -> 256 -> 128): bf16 fused 0.26 ms, unfused 0.24 ms; fp32 fused
        # spills (8.3 ms against 0.27 ms), so fusing is the default only for narrow 16-bit intermediates
        fuse = dot != "tl.float32" and s0["N"] <= 128
        space = {"FUSE": [fuse, not fuse], "BLOCK_M": _first(bm, KNOBS["BLOCK_M"]),
                 "BLOCK_N": _first(bn, KNOBS["BLOCK_N"]), "BLOCK_K": _first(bk, KNOBS["BLOCK_K"]),
                 "num_warps": [4, 8], "num_stages": [3, 4, 2, 5]}
        modes = precisions(dot, match.spec.get("allow_tf32", False))
        return {**space, "INPUT_PRECISION": modes} if modes else space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        config = {**{k: v[0] for k, v in self.space(match, "cuda").items()}, **config}
        s0, s1 = match.spec["stages"]
        ins = [f"x_{n.name}" for n in match.inputs]
        if not config["FUSE"]:
            cfg = {**config, "GROUP_M": 8, "SPLIT_K": 1}
            parts = render_gemm(match, s0, cfg, name) + render_gemm(match, s1, cfg, name)
            calls = [(f"{name}_s0", ins, match.spec["intermediates"]),
                     (f"{name}_s1", ins + match.spec["intermediates"], [s["name"] for s in s1["stores"]])]
            return "\n\n\n".join(parts + [launcher_text(name, match, calls)]) + "\n"
        cfg = fit_fused(config, s0["sizes"], s1["sizes"], _itemsize(s0["dot"]))
        mode = config.get("INPUT_PRECISION", "ieee")
        parts = [fused_kernel(name, s0, s1, _precision(s0["dot"], mode), _precision(s1["dot"], mode)),
                 upcast_flag(name, f"{name}_kernel"),
                 prep_text(name, s0, ins, stores=False), prep_text(name, s1, ins),
                 fused_launcher(name, match, s0, s1, cfg)]
        return "\n\n\n".join(parts) + "\n"


# Tried in this order: the bigger patterns claim their nodes before the plain GEMM sees them.
FAMILIES = (DualGemmTemplate, BatchedSmallTemplate, CrossTemplate, MatmulTemplate)
