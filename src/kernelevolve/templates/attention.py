"""Attention: ``bmm(q, k^T)`` -> pointwise scores -> softmax over keys (or none) -> ``bmm(p, v)`` as one flash kernel.

The region is found from the second bmm upwards, so the manual spelling (matmul, masked_fill, softmax), the SDPA
decomposition (scaled q and k, an arange-built causal bias, the guard that zeroes fully masked rows) and pointwise
score attention (HSTU: ``silu(s) / n * mask``, no softmax) are one pattern. The score chain is generated with
``pointwise.expression``, so any elementwise score function works. Values that feed the scores without depending on
them (masks, biases) are computed from the query/key indices when built from ``arange``/``full``, and loaded with
broadcast strides otherwise. Where their values are known at capture (index-built, or module state such as a
``tril`` buffer) they are probed once: key blocks outside the band of ``j - i`` that can carry weight are skipped, and
inside it the mask terms that are constant there are folded away.
"""
from __future__ import annotations

import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze import pointwise
from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape, tensor_args, topo_index
from kernelevolve.templates.base import Match, make_match

RESHAPES = {"view", "_unsafe_view", "reshape"}
SAME = {"alias", "clone", "contiguous", "detach", "lift_fresh_copy"}
DIM_OPS = RESHAPES | SAME | {"permute", "transpose", "t", "unsqueeze", "squeeze", "expand"}
REPLAY_OPS = DIM_OPS | {"select", "slice"}  # replayed on the runtime tensor by the launcher
CASTS = {"_to_copy", "convert_element_type"}
OUT_OPS = (DIM_OPS - {"expand"}) | CASTS
HALF = (torch.float16, torch.bfloat16)
INDEX_SOURCES = {"arange", "full"}
PROBE_LIMIT = 1 << 24  # score positions probed at capture; beyond it every mask term stays and no block is skipped
SMEM_BUDGET = 160 * 1024  # bytes of shared memory a config may plan for (H100/H200 allow 227 KB per block)
LOG2E = 1.4426950408889634

log = logging.getLogger(__name__)


class _NoMatch(Exception):
    pass


# ---- runtime layout helpers, also rendered into the kernel file ------------------------------------------------


def _layout(x, z, m, k):
    """(n1, n2, s0, s1, s2, sm, sk): ``x`` read as [z, m, k], z split over three strided dims; None if it cannot."""
    dims = [(s, st) for s, st in zip(x.shape, x.stride()) if s != 1]
    inner = []
    for want in (k, m):
        group, size = [], 1
        while size < want and dims:
            group.insert(0, dims.pop())
            size *= group[0][0]
        if size != want or any(a[1] != b[1] * b[0] for a, b in zip(group, group[1:])):
            return None
        inner.append(group[-1][1] if group else 0)
    batch, total = [], 1
    for s, st in dims:
        total *= s
        if batch and batch[-1][1] == st * s:
            batch[-1] = (batch[-1][0] * s, st)
        else:
            batch.append((s, st))
    if total != z or len(batch) > 3:
        return None
    batch = [(1, 0)] * (3 - len(batch)) + batch
    return batch[1][0], batch[2][0], batch[0][1], batch[1][1], batch[2][1], inner[1], inner[0]


def _operand(x, z, m, k):
    if x.numel() != z * m * k:
        raise ValueError(f"expected {z}x{m}x{k} elements, got shape {tuple(x.shape)}")
    lay = _layout(x, z, m, k)
    if lay is None:  # batch dims that three strides cannot express: one copy, as the reference's reshape makes
        x = x.reshape(z, m, k)
        lay = _layout(x, z, m, k)
    return x, lay


def _helpers(name: str) -> str:
    src = inspect.getsource(_layout) + "\n\n" + inspect.getsource(_operand)
    return src.replace("_layout(", f"{name}_layout(").replace("def _operand(", f"def {name}_operand(")


# ---- graph analysis ----------------------------------------------------------------------------------------------


@dataclass
class _Region:
    pv: fx.Node
    mode: str = "softmax"
    zero_empty: bool = False  # SDPA: rows with every key masked give 0 (plain softmax gives NaN)
    softmax: list[fx.Node] = field(default_factory=list)
    pchain: list[fx.Node] = field(default_factory=list)  # casts/views from the weights to bmm(p, v)
    x: fx.Node | None = None  # the score softmax reads, or the weight bmm(p, v) reads
    qk: fx.Node | None = None
    prefix: list[fx.Node] = field(default_factory=list)  # views from qk to the score tensor
    main: list[fx.Node] = field(default_factory=list)  # pointwise nodes on the path from the scores to x
    side: list[fx.Node] = field(default_factory=list)  # nodes feeding the scores without depending on them
    leaves: list[fx.Node] = field(default_factory=list)  # external tensors the score chain reads
    chains: dict[str, list[fx.Node]] = field(default_factory=dict)  # q/k/v: [source, ..., bmm operand]
    out: list[fx.Node] = field(default_factory=list)

    @property
    def s_node(self) -> fx.Node:
        return self.prefix[-1] if self.prefix else self.qk

    def nodes(self) -> list[fx.Node]:
        ops = [n for c in self.chains.values() for n in c[1:]]
        return [self.qk, self.pv, *self.prefix, *self.main, *self.side, *self.softmax, *self.pchain, *ops, *self.out]


def _scale(n: fx.Node) -> float | None:
    """The factor of ``x * c`` or ``x / c`` with a Python number ``c``."""
    if op_name(n) not in ("mul", "div") or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    if op_name(n) == "mul" and not isinstance(a, fx.Node):
        a, b = b, a
    if not isinstance(a, fx.Node) or isinstance(b, (bool, fx.Node)) or not isinstance(b, (int, float)) or b == 0:
        return None
    return float(b) if op_name(n) == "mul" else 1.0 / float(b)


def _climb(node: fx.Node, used: set[fx.Node], ok: Any) -> list[fx.Node]:
    """[source, ..., node]: the chain of single-user, single-input nodes ``ok`` accepts above and at ``node``."""
    chain = [node]
    while (node.op == "call_function" and node not in used and ok(node) and len(node.users) == 1
           and len(tensor_args(node)) == 1):
        node = tensor_args(node)[0]
        chain.insert(0, node)
    return chain


def _operand_op(n: fx.Node) -> bool:
    return op_name(n) in REPLAY_OPS or (pointwise.can_emit(n) and op_name(n) not in ("full_like", "scalar_tensor"))


def _softmax(end: fx.Node) -> tuple[fx.Node, list[fx.Node], bool, int] | None:
    """(score, nodes, zeroes empty rows, dim) when ``end`` is a decomposed softmax, with SDPA's guard or not."""
    nodes: list[fx.Node] = []
    cond = None
    if op_name(end) == "where" and len(end.args) == 3 and isinstance(end.args[2], fx.Node):
        cond, fill, div = end.args
        if op_name(fill) != "full_like" or fill.args[0] is not div or fill.args[1] != 0:
            return None
        nodes, end = [end, fill], div
    if op_name(end) != "div" or not all(isinstance(a, fx.Node) for a in end.args):
        return None
    exp, total = end.args
    if op_name(exp) != "exp" or op_name(total) != "sum" or total.args[0] is not exp or op_name(exp.args[0]) != "sub":
        return None
    x, amax = exp.args[0].args
    if op_name(amax) != "amax" or amax.args[0] is not x or len(amax.args[1]) != 1:
        return None
    dim = amax.args[1][0]
    if list(total.args[1]) != [dim]:
        return None
    nodes += [end, exp, total, exp.args[0], amax]
    if cond is not None:
        guard = _guard(cond, x, dim)
        if guard is None:
            return None
        nodes += guard
    return x, nodes, cond is not None, dim


def _guard(cond: Any, x: fx.Node, dim: int) -> list[fx.Node] | None:
    """The nodes of ``not any(x != -inf, dim)``."""
    chain = [cond]
    for name in ("logical_not", "any", "logical_not", "eq"):
        n = chain[-1]
        if not isinstance(n, fx.Node) or op_name(n) != name:
            return None
        if name == "any" and list(n.args[1:2]) not in ([dim], [[dim]]):
            return None
        chain.append(n.args[0])
    eq = chain[-2]
    return chain[:-1] if chain[-1] is x and eq.args[1] == float("-inf") else None


def _descendants(node: fx.Node) -> set[fx.Node]:
    out, stack = set(), [node]
    while stack:
        for u in stack.pop().users:
            if u not in out:
                out.add(u)
                stack.append(u)
    return out


def _score_graph(reg: _Region, used: set[fx.Node], zmn: tuple[int, int, int]) -> None:
    """Fill qk, prefix, main, side and leaves from the nodes above ``reg.x``."""
    seen, stack, bmms = set(), [reg.x], set()
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function" or n in used:
            continue
        if op_name(n) == "bmm":
            bmms.add(n)
            continue
        if pointwise.is_pointwise(n) or op_name(n) in DIM_OPS | INDEX_SOURCES:
            seen.add(n)
            stack.extend(tensor_args(n))
    found = [b for b in bmms if shape(b) == zmn and reg.x in _descendants(b) | {b}]
    if len(found) != 1:
        raise _NoMatch("the scores must come from one bmm")
    reg.qk = qk = found[0]
    below = _descendants(qk)
    cur = qk
    while len(cur.users) == 1 and next(iter(cur.users)) in seen and op_name(next(iter(cur.users))) in DIM_OPS:
        cur = next(iter(cur.users))
        reg.prefix.append(cur)
    order = topo_index(qk.graph)
    reg.main = sorted((n for n in seen if n in below and n not in reg.prefix), key=order.__getitem__)
    reg.side = sorted((n for n in seen if n not in below), key=order.__getitem__)
    s_shape = shape(reg.s_node)
    for n in reg.main:
        if not pointwise.can_emit(n) or shape(n) != s_shape:
            raise _NoMatch(f"{n.name} is not an elementwise op on the scores")
    for n in reg.side:
        if pointwise.is_pointwise(n) and not pointwise.can_emit(n):
            raise _NoMatch(f"no Triton expression for {n.name}")


def _prune(reg: _Region) -> None:
    """Side nodes used outside the region become external inputs; then list the leaves."""
    inside = set(reg.nodes())
    changed = True
    while changed:
        changed = False
        for n in list(reg.side):
            if any(u not in inside for u in n.users):
                reg.side.remove(n)
                inside.discard(n)
                changed = True
    inner = set(reg.main) | set(reg.side)
    leaves: list[fx.Node] = []
    for n in [*reg.main, *reg.side]:
        for a in tensor_args(n):
            if a not in inner and a is not reg.s_node and a not in leaves:
                leaves.append(a)
    below = _descendants(reg.qk) | {reg.qk}
    if any(a in below for a in leaves):
        raise _NoMatch("the scores feed something the score chain reads (a second reduction?)")
    reg.leaves = leaves


def _s_dims(reg: _Region, z: int, m: int, n: int) -> tuple[list[int], list[int], int | None, int, list[int]]:
    """Shape/strides of the score tensor over the bmm output, its query and key dims, batch dims in z order."""
    t = torch.empty((z, m, n), device="meta")
    for p in reg.prefix:
        t = _apply(p, t)
    qdim = kdim = None
    batch = []
    for d, (size, st) in enumerate(zip(t.shape, t.stride())):
        if size == 1:
            continue
        if kdim is None and st == 1 and size == n:
            kdim = d
        elif qdim is None and st == n and size == m:
            qdim = d
        else:
            batch.append((st, d))
    batch.sort(reverse=True)
    expect = m * n
    for st, d in reversed(batch):
        if st != expect:
            raise _NoMatch("the score views reorder the batch")
        expect *= t.shape[d]
    if kdim is None or expect != z * m * n:
        raise _NoMatch("no key dim in the scores")
    return list(t.shape), list(t.stride()), qdim, kdim, [d for _, d in batch]


def _apply(node: fx.Node, t: torch.Tensor) -> torch.Tensor:
    """A view node applied to a meta tensor (reshapes must be views: a copy would lose the index map)."""
    name = op_name(node)
    if name in SAME or name in CASTS:
        return t
    if name in RESHAPES:
        return t.view(node.args[1])
    return node.target(t, *node.args[1:], **node.kwargs)


def _p_chain_ok(reg: _Region, s_shape: list[int], s_strides: list[int], zmn: tuple[int, int, int]) -> bool:
    """The views from the weights to bmm(p, v) read them back in the order bmm(q, k^T) wrote them."""
    t = torch.empty_strided(s_shape, s_strides, device="meta")
    try:
        for p in reg.pchain:
            t = _apply(p, t)
    except RuntimeError:
        return False
    want = (zmn[1] * zmn[2], zmn[2], 1)
    return tuple(t.shape) == zmn and all(s == 1 or st == w for s, st, w in zip(t.shape, t.stride(), want))


def _out_layout(chain: list[fx.Node], pv: fx.Node) -> tuple | None:
    """Strides through which the kernel writes bmm(p, v) into a contiguous tensor shaped like the chain's end."""
    end = chain[-1] if chain else pv
    t = torch.empty(shape(end), device="meta")
    try:
        for n in reversed(chain):
            name, src = op_name(n), n.args[0]
            if name == "permute":
                dims = [d % t.dim() for d in n.args[1]]
                t = t.permute(sorted(range(len(dims)), key=dims.__getitem__))
            elif name in ("transpose", "t"):
                t = t.transpose(*(n.args[1:3] if name == "transpose" else (0, 1)))
            elif name in SAME or name in CASTS or src is pv:
                continue
            else:
                t = t.view(shape(src))
    except RuntimeError:
        return None
    return _layout(t, *shape(pv))


def _in_map(u: fx.Node, x: fx.Node, du: list[int | None]) -> list[int | None] | None:
    """Which score dim each dim of ``x`` indexes, given the same for its user ``u``."""
    name, sx, su = op_name(u), shape(x), shape(u)
    rx, ru = len(sx), len(su)
    if name in SAME:
        return list(du)
    if pointwise.is_pointwise(u) or name == "expand":
        off = ru - rx
        return None if off < 0 else [du[i + off] if sx[i] != 1 else None for i in range(rx)]
    if name == "unsqueeze":
        d = u.args[1] % ru
        return du[:d] + du[d + 1:]
    res: list[int | None] = [None] * rx
    if name == "squeeze":
        dims = u.args[1] if len(u.args) > 1 else range(rx)
        dims = {d % rx for d in ([dims] if isinstance(dims, int) else dims)}
        kept = [i for i in range(rx) if not (sx[i] == 1 and i in dims)]
    elif name == "permute":
        kept = [p % rx for p in u.args[1]]
    elif name in ("transpose", "t"):
        a, b = (u.args[1] % rx, u.args[2] % rx) if name == "transpose" else (0, 1)
        kept = list(range(rx))
        kept[a], kept[b] = kept[b], kept[a]
    elif name in RESHAPES:
        kept = [i for i in range(rx) if sx[i] != 1]
        if [sx[i] for i in kept] != [s for s in su if s != 1]:
            return None
        du = [du[k] for k in range(ru) if su[k] != 1]
    else:
        return None
    for i, d in zip(kept, du):
        res[i] = d
    return res


def _dim_maps(reg: _Region, rank: int) -> dict[fx.Node, list[int | None]]:
    """Map every side value and leaf onto the score dims; a side node that cannot be mapped becomes a leaf."""
    while True:
        dm: dict[fx.Node, list[int | None]] = {n: list(range(rank)) for n in reg.main}
        inner = set(reg.main) | set(reg.side)
        order = topo_index(reg.pv.graph)
        bad = None
        for x in sorted([*reg.side, *reg.leaves], key=order.__getitem__, reverse=True):
            maps = [_in_map(u, x, dm[u]) for u in x.users if u in inner]
            shared = op_name(x) != "arange"  # an arange may be read along a different axis by each user
            if any(m is None or (shared and m != maps[0]) for m in maps):
                bad = x
                break
            dm[x] = maps[0]
        if bad is None:
            return dm
        if bad in reg.leaves:
            raise _NoMatch(f"{bad.name} does not broadcast onto the scores one way")
        reg.side.remove(bad)
        _prune(reg)


# ---- probing the mask at capture ---------------------------------------------------------------------------------


def _known(graph: CapturedGraph, node: fx.Node) -> torch.Tensor | None:
    """The value of mask-like module state (and views of it). Only all-0/1/inf tensors, such as a ``tril`` buffer,
    are trusted: the evaluator rebuilds the module with another seed, which changes any random parameter."""
    if node.op == "placeholder":
        idx = graph.placeholders().index(node)
        v = graph.example[0][idx] if idx < len(graph.state_names) else None
        return v if v is not None and bool(((v == 0) | (v == 1) | v.isinf()).all()) else None
    if node.op == "call_function" and op_name(node) in REPLAY_OPS and len(tensor_args(node)) == 1:
        base = _known(graph, node.args[0])
        return None if base is None else node.target(base, *node.args[1:], **node.kwargs)
    return None


def _evaluate(reg: _Region, values: dict[fx.Node, Any], probe: torch.Tensor) -> dict[fx.Node, Any]:
    vals = dict(values)
    vals[reg.s_node] = probe
    order = topo_index(reg.pv.graph)
    for n in sorted([*reg.side, *reg.main], key=order.__getitem__):
        if any(vals.get(a) is None for a in tensor_args(n)):
            vals[n] = None
            continue
        args, kwargs = torch.utils._pytree.tree_map(lambda a: vals[a] if isinstance(a, fx.Node) else a,
                                                    (n.args, n.kwargs))
        vals[n] = n.target(*args, **kwargs)
    return vals


def _probe(graph: CapturedGraph, reg: _Region, s_shape: list[int], qdim: int | None,
           kdim: int) -> tuple[list[int | None], dict[fx.Node, Any]]:
    """The band [lo, hi] of ``j - i`` outside which weights are zero whatever the scores, and the boundary values
    that are constant inside it. Scores are probed with random fills; masks come from indices and module state."""
    band: list[int | None] = [None, None]
    m, n = s_shape[qdim] if qdim is not None else 1, s_shape[kdim]
    known = {leaf: _known(graph, leaf) for leaf in reg.leaves}
    if m * n > PROBE_LIMIT or any(v is not None and v.numel() > PROBE_LIMIT for v in known.values()):
        return band, {}
    rank = len(s_shape)
    frame = [1] * rank
    frame[kdim] = n
    if qdim is not None:
        frame[qdim] = m
    gen = torch.Generator().manual_seed(0)
    fills = [torch.randn(frame, generator=gen) * 4, torch.randn(frame, generator=gen) + 8,
             -torch.rand(frame, generator=gen) * 8 - 1]
    runs = [_evaluate(reg, known, f.to(dtype(reg.s_node))) for f in fills]
    i = torch.arange(m).view([m if d == qdim else 1 for d in range(rank)])
    j = torch.arange(n).view([n if d == kdim else 1 for d in range(rank)])
    if runs[0][reg.x] is not None and qdim is not None:
        empty = torch.stack([(r[reg.x] == float("-inf")) if reg.mode == "softmax" else (r[reg.x] == 0) for r in runs])
        live = torch.broadcast_to(~empty.all(0), torch.broadcast_shapes(empty.shape[1:], tuple(frame)))
        live = live.movedim((qdim, kdim), (-2, -1)).reshape(-1, m, n).any(0)
        if live.any():
            d = (torch.arange(n)[None, :] - torch.arange(m)[:, None])[live]
            lo, hi = int(d.min()), int(d.max())
            band = [lo if lo > 1 - m else None, hi if hi < n - 1 else None]
    inband = torch.ones(frame, dtype=torch.bool)
    if band[0] is not None:
        inband &= (j - i) >= band[0]
    if band[1] is not None:
        inband &= (j - i) <= band[1]
    consts = {}
    for b in {a for u in reg.main for a in tensor_args(u) if a not in reg.main and a is not reg.s_node}:
        v = runs[0].get(b)
        if isinstance(v, torch.Tensor):
            full = torch.broadcast_shapes(v.shape, inband.shape)
            sel = torch.broadcast_to(v, full)[torch.broadcast_to(inband, full)]
            if sel.numel() and bool((sel == sel[0]).all()):
                consts[b] = sel[0].item()
    return band, consts


# ---- code generation ---------------------------------------------------------------------------------------------


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and (v != v or abs(v) == float("inf")):
        return "float('nan')" if v != v else f"float('{'-' if v < 0 else ''}inf')"
    return repr(v)


def _fold(n: fx.Node, cv: dict[fx.Node, Any]) -> Any:
    """The argument ``n`` reduces to once its constant operands are known (where/masked_fill/+0/*1), else None."""
    name, a = op_name(n), n.args

    def c(i: int) -> Any:
        return cv.get(a[i]) if isinstance(a[i], fx.Node) else a[i]

    if name == "where" and c(0) is not None:
        return a[1] if c(0) else a[2]
    if name == "masked_fill" and c(1) is not None:
        return a[2] if c(1) else a[0]
    if n.kwargs or len(a) != 2:
        return None
    if (name in ("add", "sub") and c(1) == 0) or (name in ("mul", "div") and c(1) == 1):
        return a[0]
    if (name == "add" and c(0) == 0) or (name == "mul" and c(0) == 1):
        return a[1]
    return None


def _reciprocal(n: fx.Node, env: dict[fx.Node, str]) -> str | None:
    """``x / c`` as ``x * (1 / c)``: a multiply instead of an fp32 division per score (within an ulp)."""
    if op_name(n) != "div" or n.kwargs or not isinstance(n.args[0], fx.Node) or n.args[0] not in env:
        return None
    c = n.args[1]
    ok = isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0 and abs(c) != float("inf")
    return f"({env[n.args[0]]} * {1.0 / c!r})" if ok else None


def _score_code(reg: _Region, env0: dict[fx.Node, str], consts: dict[fx.Node, Any],
                prefix: str) -> tuple[list[str], str]:
    """Triton statements computing ``reg.x`` from ``s`` (the scaled scores), indices and loaded leaves."""
    env, cv, lines = dict(env0), dict(consts), []
    for node, v in consts.items():
        env[node] = _literal(v)
    needed, stack = set(), [reg.x]
    while stack:
        n = stack.pop()
        if n not in env and n not in needed:
            needed.add(n)
            stack.extend(tensor_args(n))
    order = topo_index(reg.pv.graph)
    for k, n in enumerate(sorted(needed, key=order.__getitem__)):
        name = op_name(n)
        if name == "full":
            cv[n] = n.args[1]
            env[n] = _literal(cv[n])
        elif name in DIM_OPS and not pointwise.is_pointwise(n):
            env[n] = env[n.args[0]]
            if n.args[0] in cv:
                cv[n] = cv[n.args[0]]
        elif name == "scalar_tensor":
            cv[n] = n.args[0]
            env[n] = _literal(cv[n])
        else:
            to = _fold(n, cv)
            if to is None:
                expr = _reciprocal(n, env) or pointwise.expression(n, env)
                if not expr.isidentifier():  # identity casts just rename
                    lines.append(f"{prefix}{k} = {expr}")
                    expr = f"{prefix}{k}"
                env[n] = expr
            elif isinstance(to, fx.Node):
                env[n] = env[to]
                if to in cv:
                    cv[n] = cv[to]
            else:
                env[n], cv[n] = _literal(to), to
    return lines, env[reg.x]


def _index_env(reg: _Region, dm: dict[fx.Node, list[int | None]], qdim: int | None, kdim: int) -> dict[fx.Node, str]:
    """``arange`` values as expressions of the query/key offsets: on the arange itself, or on each view of it when
    the views read it along different axes."""
    env = {}
    inner = set(reg.main) | set(reg.side)
    for n in reg.side:
        if op_name(n) != "arange":
            continue
        a, ov = n.args, n.target._overloadname
        start, step = (0, 1) if ov == "default" else (a[0], a[2] if len(a) > 2 else 1)
        if not all(isinstance(v, int) for v in (start, step)):
            raise _NoMatch("non-integer arange")
        dt = n.kwargs.get("dtype")
        cast = ".to(tl.float32)" if dt is not None and dt.is_floating_point else ""
        direct = set()
        for u in (u for u in n.users if u in inner):
            (d,) = _in_map(u, n, dm[u])
            if d is None:
                expr = str(start)
            elif d in (qdim, kdim):
                expr = f"({'offs_m[:, None]' if d == qdim else 'offs_n[None, :]'} * {step} + {start}){cast}"
            else:
                raise _NoMatch("an index mask over a batch dim")
            if op_name(u) in DIM_OPS and not pointwise.is_pointwise(u):
                env[u] = expr
            else:
                direct.add(expr)
        if len(direct) > 1:
            raise _NoMatch("an arange read along two axes by elementwise ops")
        if direct:
            env[n] = direct.pop()
    return env


def _simple(chain: list[fx.Node], scales: bool) -> bool:
    """Only casts (and, if ``scales``, multiplies by constants) between the source and the operand."""
    pw = [n for n in chain[1:] if op_name(n) not in REPLAY_OPS]
    return all(op_name(n) in CASTS or (scales and _scale(n)) for n in pw)


def _dot_dtypes(reg: _Region, end: fx.Node) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes the two dots run in. Half sources upcast only for the math (SDPA on the CPU) keep the half dot:
    q.k products are exact in fp32 either way; p is rounded to v's half type, as flash attention does, when the
    output is half too."""
    q, k, v = reg.chains["q"], reg.chains["k"], reg.chains["v"]
    qk, pv = dtype(reg.qk), dtype(reg.pv)
    if qk == torch.float32 and dtype(q[0]) == dtype(k[0]) in HALF and _simple(q, True) and _simple(k, True):
        qk = dtype(q[0])
    if pv == torch.float32 and dtype(v[0]) in HALF and dtype(end) in HALF and _simple(v, False):
        pv = dtype(v[0])
    return qk, pv


def _operand_code(role: str, chain: list[fx.Node], to: torch.dtype, fold: bool) -> tuple[list[str], float]:
    """Statements turning the loaded tile ``role`` into the dot operand, and the scale folded into the scores."""
    src, pw = chain[0], [n for n in chain[1:] if op_name(n) not in REPLAY_OPS]
    if _simple(chain, fold):
        factor = 1.0
        for n in pw:
            factor *= _scale(n) or 1.0
        return ([f"{role} = {role}.to({pointwise.TL_DTYPES[to]})"] if dtype(src) != to else []), factor
    lines = [f"{role}_x = {role}.to(tl.float32)"]
    env = pointwise.emit(pw, {src: f"{role}_x"}, lines, prefix=f"{role}_p")
    lines.append(f"{role} = {env[pw[-1]]}.to({pointwise.TL_DTYPES[to]})")
    return lines, 1.0


def _replay(var: str, chain: list[fx.Node]) -> list[str]:
    """Launcher lines redoing the chain's views on the runtime source (trailing reshapes are read by strides)."""
    ops = [n for n in chain[1:] if op_name(n) in REPLAY_OPS and op_name(n) not in SAME]
    while ops and op_name(ops[-1]) in RESHAPES:
        ops.pop()
    lines = []
    for n in ops:
        target = "aten.reshape.default" if op_name(n) in RESHAPES else str(n.target)
        args = "".join(f", {a!r}" for a in n.args[1:])
        lines.append(f"{var} = torch.ops.{target}({var}{args})")
    return lines


def _aux_spec(dmap: list[int | None], index: int, s_shape: list[int], qdim: int | None, kdim: int,
              zorder: list[int]) -> dict[str, Any]:
    """How the launcher views a leaf as [z, m, n] (its dim feeding each score dim) and the tile the kernel loads."""
    src = {d: i for i, d in enumerate(dmap) if d is not None}
    perm = [*zorder, qdim, kdim]
    rows, cols = qdim is not None and qdim in src, kdim in src
    kind = {(True, True): "tile", (True, False): "row", (False, True): "col", (False, False): "scalar"}[rows, cols]
    return {"input": index, "sizes": [s_shape[d] if d is not None else 1 for d in perm],
            "dims": [src.get(d) if d is not None else None for d in perm], "kind": kind}


def _spec(reg: _Region, match: Match, dims: tuple, dm: dict[fx.Node, list[int | None]], band: list[int | None],
          consts: dict[fx.Node, Any], out_layout: tuple) -> dict[str, Any]:
    s_shape, _, qdim, kdim, zorder = dims
    idx = {node: i for i, node in enumerate(match.inputs)}
    end = reg.out[-1] if reg.out else reg.pv
    qk, pv = _dot_dtypes(reg, end)
    scale, operands = 1.0, {}
    for role in ("q", "k", "v"):
        chain = reg.chains[role]
        code, factor = _operand_code(role, chain, qk if role != "v" else pv, fold=role != "v")
        scale *= factor
        operands[role] = {"input": idx[chain[0]], "replay": _replay(role, chain), "code": code}
    env0 = {reg.s_node: "s"}
    cur = reg.s_node
    while len(cur.users) == 1 and next(iter(cur.users)) in reg.main and _scale(next(iter(cur.users))):
        cur = next(iter(cur.users))
        scale *= _scale(cur)
        env0[cur] = "s"
    env0.update(_index_env(reg, dm, qdim, kdim))
    aux = []
    for i, leaf in enumerate(reg.leaves):
        env0[leaf] = f"a{i}"
        aux.append(_aux_spec(dm[leaf], idx[leaf], s_shape, qdim, kdim, zorder))
    z, m, n = shape(reg.qk)
    return {"mode": reg.mode, "zero_empty": reg.zero_empty, "band": band, "scale": scale,
            "sizes": [z, m, n, shape(reg.qk.args[0])[2], shape(reg.pv)[2]],
            "qk_dtype": pointwise.TL_DTYPES[qk], "pv_dtype": pointwise.TL_DTYPES[pv],
            "operands": operands, "aux": aux,
            "score": {"full": _score_code(reg, env0, {}, "sf"), "interior": _score_code(reg, env0, consts, "si")},
            "out": {"shape": list(shape(end)), "dtype": str(dtype(end)), "layout": list(out_layout)}}


def _match(graph: CapturedGraph, pv: fx.Node, used: set[fx.Node]) -> Match:
    zmn = shape(pv.args[0])
    reg = _Region(pv)
    pchain = _climb(pv.args[0], used, lambda x: op_name(x) in DIM_OPS | CASTS)
    end, reg.pchain = pchain[0], pchain[1:]
    if end.op != "call_function" or end in used:
        raise _NoMatch("no weights computed before bmm(p, v)")
    found = _softmax(end)
    if found is not None:
        reg.x, reg.softmax, reg.zero_empty, kd = found
    elif pointwise.is_pointwise(end):
        reg.mode, reg.x, kd = "pointwise", end, None
    else:
        raise _NoMatch("neither softmax nor elementwise weights")
    _score_graph(reg, used, zmn)
    if reg.mode == "pointwise" and all(_scale(n) or op_name(n) in CASTS | SAME for n in reg.main):
        raise _NoMatch("a plain chain of matmuls")
    dims = _s_dims(reg, *zmn)
    s_shape, s_strides, qdim, kdim, _ = dims
    if (kd is not None and kd % len(s_shape) != kdim) or list(shape(reg.x)) != s_shape:
        raise _NoMatch("softmax over another dim than the keys")
    if not _p_chain_ok(reg, s_shape, s_strides, zmn):
        raise _NoMatch("the weights reach bmm(p, v) reordered")
    ok = _operand_op
    reg.chains = {"q": _climb(reg.qk.args[0], used, ok), "k": _climb(reg.qk.args[1], used, ok),
                  "v": _climb(pv.args[1], used, ok)}
    down, node = [], pv
    while len(node.users) == 1:
        node = next(iter(node.users))
        if node.op != "call_function" or node in used or op_name(node) not in OUT_OPS:
            break
        down.append(node)
    cut = next(c for c in range(len(down), -1, -1) if c == 0 or _out_layout(down[:c], pv) is not None)
    reg.out = down[:cut]
    out_layout = _out_layout(reg.out, pv)
    if out_layout is None:
        raise _NoMatch("cannot write the output through strides")
    _prune(reg)
    dm = _dim_maps(reg, len(s_shape))
    band, consts = _probe(graph, reg, s_shape, qdim, kdim)
    match = make_match("attention", reg.nodes(), kind="attention")
    if match is None or match.outputs != [reg.out[-1] if reg.out else pv]:
        raise _NoMatch("the region is not convex or leaks an intermediate")
    match.spec = _spec(reg, match, dims, dm, band, consts, out_layout)
    return match


# ---- rendering ---------------------------------------------------------------------------------------------------


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _clamp(block: int, size: int) -> int:
    return min(block, max(16, _pow2(size)))


def _aux_load(i: int, kind: str) -> str:
    ptr, mask = {"tile": ("offs_m[:, None] * a{i}_sa + offs_n[None, :] * a{i}_sb", "m_ok[:, None] & n_ok[None, :]"),
                 "row": ("offs_m[:, None] * a{i}_sa", "m_ok[:, None]"),
                 "col": ("offs_n[None, :] * a{i}_sb", "n_ok[None, :]"), "scalar": ("0", None)}[kind]
    ptr = ptr.format(i=i)
    return f"a{i} = tl.load(A{i} + {ptr}" + (f", mask={mask}, other=0)" if mask else ")")


def _load(var: str, ptrs: str, mask: str, even: str | None) -> list[str]:
    masked = f"{var} = tl.load({ptrs}, mask={mask}, other=0.0)"
    return [masked] if even is None else [f"if {even}:", f"    {var} = tl.load({ptrs})", "else:", f"    {masked}"]


def _dot(out: str, a: str, b: str, acc: str, dt: str, allow_tf32: bool) -> list[str]:
    """``out = a @ b (+ acc)``. The interpreter multiplies bf16 bit patterns in tl.dot (triton#11584), so there, and
    only there (UPCAST is a constexpr), bf16 operands are widened first."""
    prec = {"tl.float32": f", input_precision='{'tf32' if allow_tf32 else 'ieee'}'"}.get(dt, "")
    line = f"{out} = tl.dot({a}, {b}{acc}{prec})"
    if dt != "tl.bfloat16":
        return [line]
    wide = f"{out} = tl.dot({a}.to(tl.float32), {b}.to(tl.float32){acc}, input_precision='ieee')"
    return ["if UPCAST:", f"    {wide}", "else:", f"    {line}"]


def _body(spec: dict[str, Any], version: str) -> list[str]:
    """One key block: scores, the score chain, then the online-softmax update or the plain accumulation."""
    masked = version == "full"
    lines, out = spec["score"][version]
    softmax = spec["mode"] == "softmax"
    fold = softmax and not masked and out == "s"  # exp2 base folded into the scale: one multiply per score
    scale = spec["scale"] * (LOG2E if fold else 1.0)
    code = ["offs_n = start_n + offs_n0", "n_ok = offs_n < N"]
    kp = "K + offs_d[:, None] * k_sa + offs_n[None, :] * k_sb"
    code += _load("k", kp, "d_ok[:, None] & n_ok[None, :]", None) if masked else _load("k", kp, "d_ok[:, None]",
                                                                                      "EVEN_D")
    code += spec["operands"]["k"]["code"]
    tf32 = bool(spec.get("allow_tf32", False))  # set by the caller from the problem; off unless it says so
    code += _dot("s", "q", "k", "", spec["qk_dtype"], tf32)
    if scale != 1.0:
        code.append(f"s = s * {scale!r}")
    used = set(re.findall(r"\w+", "\n".join(lines)))
    code += [_aux_load(i, a["kind"]) for i, a in enumerate(spec["aux"]) if f"a{i}" in used]
    code += lines
    if softmax:
        code.append(f"t = {out}" if fold else f"t = {out} * {LOG2E}")
        if masked:
            code.append("t = tl.where(n_ok[None, :], t, float('-inf'))")
        code += ["m_new = tl.maximum(m_i, tl.max(t, 1))",
                 "m_use = tl.where(m_new == float('-inf'), 0.0, m_new)",  # rows with no key yet: keep p = 0, not NaN
                 "p = tl.exp2(t - m_use[:, None])", "alpha = tl.exp2(m_i - m_use)",
                 "l_i = l_i * alpha + tl.sum(p, 1)", "acc = acc * alpha[:, None]", "m_i = m_new"]
    else:
        code.append(f"p = {out}")
        if masked:
            code.append("p = tl.where(n_ok[None, :], p, 0.0)")
    vp = "V + offs_n[:, None] * v_sa + offs_e[None, :] * v_sb"
    code += _load("v", vp, "n_ok[:, None] & e_ok[None, :]", None) if masked else _load("v", vp, "e_ok[None, :]",
                                                                                      "EVEN_DV")
    code += spec["operands"]["v"]["code"]
    code += _dot("acc", "p.to(v.dtype)", "v", ", acc", spec["pv_dtype"], tf32)
    return code


def _ranges(band: list[int | None]) -> list[str]:
    """Key-block ranges of one query block: [lo, ilo) and [ihi, hi) need the full mask, [ilo, ihi) does not."""
    lo_b, hi_b = band
    code = ["n_full = N // BLOCK_N * BLOCK_N"]
    if lo_b is None:
        code += ["lo = 0", "ilo = 0"]
    else:
        code += [f"lo = tl.maximum(m0 + ({lo_b}), 0) // BLOCK_N * BLOCK_N",
                 f"ilo = (tl.maximum(m0 + BLOCK_M - 1 + ({lo_b}), 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N",
                 "ilo = tl.maximum(ilo, lo)"]
    if hi_b is None:
        code += ["hi = N", "ihi = n_full"]
    else:
        code += [f"hi = tl.minimum(m0 + BLOCK_M + ({hi_b}), N)",
                 f"ihi = tl.minimum(tl.maximum(m0 + ({hi_b}) + 1, 0) // BLOCK_N * BLOCK_N, n_full)"]
    return code + ["ilo = tl.minimum(ilo, hi)", "ihi = tl.maximum(ihi, ilo)"]


def _indent(lines: list[str], depth: int) -> str:
    return "\n".join(" " * (4 * depth) + line for line in lines)


def _kernel(spec: dict[str, Any], name: str) -> str:
    tensors = ["q", "k", "v", "o"] + [f"a{i}" for i in range(len(spec["aux"]))]
    ptrs = ", ".join(t.upper() for t in tensors)
    lays = ",\n    ".join(", ".join(f"{t}_{f}" for f in ("n1", "n2", "s0", "s1", "s2", "sa", "sb")) for t in tensors)
    softmax = spec["mode"] == "softmax"
    start = "num_m - 1 - pid % num_m" if spec["band"][1] is not None else "pid % num_m"  # longest rows first
    head = [
        "pid = tl.program_id(0)", "num_m = tl.cdiv(M, BLOCK_M)", "z = (pid // num_m).to(tl.int64)",
        f"m0 = ({start}) * BLOCK_M", "offs_m = m0 + tl.arange(0, BLOCK_M)", "offs_n0 = tl.arange(0, BLOCK_N)",
        "offs_d = tl.arange(0, BLOCK_D)", "offs_e = tl.arange(0, BLOCK_DV)",
        "m_ok = offs_m < M", "d_ok = offs_d < D", "e_ok = offs_e < DV",
        *[f"{t.upper()} += {name}_zoff(z, {t}_n1, {t}_n2, {t}_s0, {t}_s1, {t}_s2)" for t in tensors],
        *_load("q", "Q + offs_m[:, None] * q_sa + offs_d[None, :] * q_sb", "m_ok[:, None] & d_ok[None, :]",
               "EVEN_M and EVEN_D"),
        *spec["operands"]["q"]["code"],
        "m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)", "l_i = tl.zeros([BLOCK_M], tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)", *_ranges(spec["band"])]
    full, interior = _body(spec, "full"), _body(spec, "interior")
    loops = [("lo, ilo", full)] if spec["band"][0] is not None else []
    loops = [line for bounds, body in [*loops, ("ilo, ihi", interior), ("ihi, hi", full)]
             for line in [f"for start_n in range({bounds}, BLOCK_N):", *("    " + b for b in body)]]
    tail = []
    if softmax:
        if spec["zero_empty"]:
            tail.append("l_i = tl.where(l_i == 0.0, 1.0, l_i)")  # SDPA: a row with no key left is 0
        tail.append("acc = acc / l_i[:, None]")  # plain softmax keeps 0 / 0 = NaN there, as torch does
    tail += ["o_ptrs = O + offs_m[:, None] * o_sa + offs_e[None, :] * o_sb", "if EVEN_M and EVEN_DV:",
             "    tl.store(o_ptrs, acc.to(O.dtype.element_ty))", "else:",
             "    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_ok[:, None] & e_ok[None, :])"]
    return f'''
@triton.jit
def {name}_zoff(z, n1, n2, s0, s1, s2):
    return (z // (n1 * n2)) * s0 + ((z // n2) % n1) * s1 + (z % n2) * s2


@triton.jit
def {name}_kernel(
    {ptrs}, M, N, D, DV,
    {lays},
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, UPCAST: tl.constexpr,
):
{_indent(head, 1)}
{_indent(loops, 1)}
{_indent(tail, 1)}


{name}_UPCAST = type({name}_kernel).__name__ == "InterpretedFunction"
'''


def _launch_config(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """Blocks clamped to the problem, and stages/key block cut until the pipelined tiles fit in shared memory."""
    _, m, n, d, dv = spec["sizes"]
    bm, bn = _clamp(int(config["BLOCK_M"]), m), _clamp(int(config["BLOCK_N"]), n)
    bd, bdv, stages = max(16, _pow2(d)), max(16, _pow2(dv)), int(config["num_stages"])
    esize = 4 if spec["qk_dtype"] == "tl.float32" else 2

    def smem(stages: int, bn: int) -> int:
        return esize * (bm * bd + stages * bn * (bd + bdv) + bm * bn)

    while smem(stages, bn) > SMEM_BUDGET and stages > 1:
        stages -= 1
    while smem(stages, bn) > SMEM_BUDGET and bn > 16:
        bn //= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_DV": bdv, "num_warps": int(config["num_warps"]),
            "num_stages": stages}


def _launcher(spec: dict[str, Any], name: str, cfg: dict[str, int]) -> str:
    z, m, n, d, dv = spec["sizes"]
    ops = spec["operands"]
    body = []
    for role, (rows, cols) in (("q", (m, d)), ("k", (d, n)), ("v", (n, dv))):
        body += [f"{role} = inputs[{ops[role]['input']}]", *ops[role]["replay"],
                 f"{role}, {role}_lay = {name}_operand({role}, {z}, {rows}, {cols})"]
    for i, a in enumerate(spec["aux"]):
        strides = ", ".join("0" if dim is None else f"a{i}.stride({dim})" for dim in a["dims"])
        body += [f"a{i} = inputs[{a['input']}]",
                 f"a{i}, a{i}_lay = {name}_operand(a{i}.as_strided({a['sizes']}, [{strides}]), {z}, {m}, {n})"]
    aux = "".join(f"a{i}, " for i in range(len(spec["aux"])))
    aux_lays = "".join(f", *a{i}_lay" for i in range(len(spec["aux"])))
    out = spec["out"]
    body += [f"out = torch.empty({out['shape']}, device=q.device, dtype={out['dtype']})",
             f"grid = (triton.cdiv({m}, {cfg['BLOCK_M']}) * {z},)",
             f"{name}_kernel[grid](",
             f"    q, k, v, out, {aux}{m}, {n}, {d}, {dv}, *q_lay, *k_lay, *v_lay, *{tuple(out['layout'])}{aux_lays},",
             f"    BLOCK_M={cfg['BLOCK_M']}, BLOCK_N={cfg['BLOCK_N']}, BLOCK_D={cfg['BLOCK_D']}, "
             f"BLOCK_DV={cfg['BLOCK_DV']},",
             f"    EVEN_M={m % cfg['BLOCK_M'] == 0}, EVEN_D={d == cfg['BLOCK_D']}, EVEN_DV={dv == cfg['BLOCK_DV']}, "
             f"UPCAST={name}_UPCAST,",
             f"    num_warps={cfg['num_warps']}, num_stages={cfg['num_stages']})",
             "return (out,)"]
    return f"def {name}(*inputs):\n{_indent(body, 1)}\n"


class AttentionTemplate:
    """Flash attention over a matched bmm -> scores -> (softmax) -> bmm region."""

    family = "attention"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        used, matches = set(taken), []
        for pv in graph.calls():
            if op_name(pv) != "bmm" or pv in used:
                continue
            try:
                match = _match(graph, pv, used)
            except _NoMatch as e:
                log.debug("attention at %s: %s", pv.name, e)
                continue
            matches.append(match)
            used |= set(match.nodes)
        return matches

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        # H200, B=4 S=2048: bf16 D=64 is best at 128x64 with 4 warps (0.125 ms causal); D=128 at 64x64 with 4 warps
        # (0.183 ms against 0.198 for 128x64 with 8); fp32 (FMA dots) at 64x64 with 4 warps (0.63 ms), while 128x64
        # with 4 warps spills (12 ms).
        _, m, n, d, dv = match.spec["sizes"]
        small = match.spec["qk_dtype"] != "tl.float32" and max(d, dv) <= 64
        return {"BLOCK_M": list(dict.fromkeys(_clamp(b, m) for b in ((128, 64) if small else (64, 128)))),
                "BLOCK_N": list(dict.fromkeys(_clamp(b, n) for b in (64, 128, 32))),
                "num_warps": [4, 8],
                "num_stages": [3, 2, 4] if match.spec["qk_dtype"] != "tl.float32" else [2, 3, 4]}

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        cfg = _launch_config(match.spec, config)
        return "\n\n".join([_helpers(name), _kernel(match.spec, name), _launcher(match.spec, name, cfg)])
