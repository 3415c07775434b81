"""Graph analysis: the region from bmm(p, v) up to bmm(q, k^T), the score chain between them, and how every value
the scores read maps onto the score dims."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze import pointwise
from kernelevolve.analyze.graph import op_name, shape, tensor_args, topo_index
from kernelevolve.templates.attention.render import layout_of
from kernelevolve.templates.graphutil import CASTS, DIM_OPS, RESHAPES, SAME

REPLAY_OPS = DIM_OPS | {"select", "slice"}  # replayed on the runtime tensor by the launcher
OUT_OPS = (DIM_OPS - {"expand"}) | CASTS
INDEX_SOURCES = {"arange", "full"}


class NoMatch(Exception):
    pass


# ---- graph analysis ----------------------------------------------------------------------------------------------


@dataclass
class Region:
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


def softmax_scale(n: fx.Node) -> float | None:
    """The factor of ``x * c`` or ``x / c`` with a Python number ``c``."""
    if op_name(n) not in ("mul", "div") or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    if op_name(n) == "mul" and not isinstance(a, fx.Node):
        a, b = b, a
    if not isinstance(a, fx.Node) or isinstance(b, (bool, fx.Node)) or not isinstance(b, (int, float)) or b == 0:
        return None
    return float(b) if op_name(n) == "mul" else 1.0 / float(b)


def climb(node: fx.Node, used: set[fx.Node], ok: Any) -> list[fx.Node]:
    """[source, ..., node]: the chain of single-user, single-input nodes ``ok`` accepts above and at ``node``."""
    chain = [node]
    while (node.op == "call_function" and node not in used and ok(node) and len(node.users) == 1
           and len(tensor_args(node)) == 1):
        node = tensor_args(node)[0]
        chain.insert(0, node)
    return chain


def operand_op(n: fx.Node) -> bool:
    return op_name(n) in REPLAY_OPS or (pointwise.can_emit(n) and op_name(n) not in ("full_like", "scalar_tensor"))


def softmax_of(end: fx.Node) -> tuple[fx.Node, list[fx.Node], bool, int] | None:
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


def score_graph(reg: Region, used: set[fx.Node], zmn: tuple[int, int, int]) -> None:
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
        raise NoMatch("the scores must come from one bmm")
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
            raise NoMatch(f"{n.name} is not an elementwise op on the scores")
    for n in reg.side:
        if pointwise.is_pointwise(n) and not pointwise.can_emit(n):
            raise NoMatch(f"no Triton expression for {n.name}")


def prune_region(reg: Region) -> None:
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
        raise NoMatch("the scores feed something the score chain reads (a second reduction?)")
    reg.leaves = leaves


def s_dims(reg: Region, z: int, m: int, n: int,
            reduced: int | None = None) -> tuple[list[int], list[int], int | None, int, list[int]]:
    """Shape/strides of the score tensor over the bmm output, its query and key dims, batch dims in z order.
    A single key leaves no dim to find by its size: it is the one the softmax reduces (``reduced``), else the last."""
    t = torch.empty((z, m, n), device="meta")
    for p in reg.prefix:
        t = _apply(p, t)
    qdim = kdim = None
    if n == 1:
        last = (reduced if reduced is not None else -1) % t.dim()
        kdim = last if t.shape[last] == 1 else None
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
            raise NoMatch("the score views reorder the batch")
        expect *= t.shape[d]
    if kdim is None or expect != z * m * n:
        raise NoMatch("no key dim in the scores")
    return list(t.shape), list(t.stride()), qdim, kdim, [d for _, d in batch]


def _apply(node: fx.Node, t: torch.Tensor) -> torch.Tensor:
    """A view node applied to a meta tensor (reshapes must be views: a copy would lose the index map)."""
    name = op_name(node)
    if name in SAME or name in CASTS:
        return t
    if name in RESHAPES:
        return t.view(node.args[1])
    return node.target(t, *node.args[1:], **node.kwargs)


def p_chain_ok(reg: Region, s_shape: list[int], s_strides: list[int], zmn: tuple[int, int, int]) -> bool:
    """The views from the weights to bmm(p, v) read them back in the order bmm(q, k^T) wrote them."""
    t = torch.empty_strided(s_shape, s_strides, device="meta")
    try:
        for p in reg.pchain:
            t = _apply(p, t)
    except RuntimeError:
        return False
    want = (zmn[1] * zmn[2], zmn[2], 1)
    return tuple(t.shape) == zmn and all(s == 1 or st == w for s, st, w in zip(t.shape, t.stride(), want))


def out_layout_of(chain: list[fx.Node], pv: fx.Node) -> tuple | None:
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
    return layout_of(t, *shape(pv))


def in_map(u: fx.Node, x: fx.Node, du: list[int | None]) -> list[int | None] | None:
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


def dim_maps(reg: Region, rank: int) -> dict[fx.Node, list[int | None]]:
    """Map every side value and leaf onto the score dims; a side node that cannot be mapped becomes a leaf."""
    while True:
        dm: dict[fx.Node, list[int | None]] = {n: list(range(rank)) for n in reg.main}
        inner = set(reg.main) | set(reg.side)
        order = topo_index(reg.pv.graph)
        bad = None
        for x in sorted([*reg.side, *reg.leaves], key=order.__getitem__, reverse=True):
            maps = [in_map(u, x, dm[u]) for u in x.users if u in inner]
            shared = op_name(x) != "arange"  # an arange may be read along a different axis by each user
            if any(m is None or (shared and m != maps[0]) for m in maps):
                bad = x
                break
            dm[x] = maps[0]
        if bad is None:
            return dm
        if bad in reg.leaves:
            raise NoMatch(f"{bad.name} does not broadcast onto the scores one way")
        reg.side.remove(bad)
        prune_region(reg)
