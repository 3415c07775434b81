"""InteractionTemplate: matching the DLRM pairwise dot and the FM second-order term on the graph, and the config
space."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.analyze.pointwise import can_emit
from kernelevolve.templates.base import Match, claim_each, make_match
from kernelevolve.templates.graphutil import CASTS, RESHAPES, ancestors_within, const_value, pow2, view_chain, view_map
from kernelevolve.templates.interaction.render import render_dot, render_fm
from kernelevolve.templates.matmul.launch import precisions

FAMILY = "interaction"
SPACE = {"BLOCK_B": [1, 2, 4, 8], "num_warps": [4, 8, 2], "num_stages": [1, 2]}
DOT_SPACE = {"BLOCK_K": [128, 64, 32]}  # D chunk of the Z = T T^T product, clamped to D
MAX_F = 128  # Z is held in registers: F_pad^2 fp32 values per row
PICKS = ("index", "index_select", "gather")
PIECE_VIEWS = RESHAPES | {"unsqueeze", "squeeze", "clone", "contiguous", "alias"}


# ---- DLRM pairwise dot -----------------------------------------------------------------------------------------------


def _operand(node: fx.Node) -> tuple[fx.Node, list[fx.Node], tuple[int, ...], int] | None:
    root, chain = view_chain(node)
    found = view_map(chain, root)
    return None if found is None else (root, chain, *found)


def _same_rows(a: tuple, b: tuple, sizes: tuple[int, int, int]) -> bool:
    """bmm(A, B) is T T^T: A[b, i, k] and B[b, k, i] read the same element of the same tensor."""
    (ra, _, sa, oa), (rb, _, sb, ob) = a, b
    pairs = ((sa[0], sb[0], sizes[0]), (sa[1], sb[2], sizes[1]), (sa[2], sb[1], sizes[2]))
    return ra is rb and oa == ob and all(x == y or n == 1 for x, y, n in pairs)


def _pair_roots(pick: fx.Node, z_dims: int, f: int) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """The 1-D index tensors naming the pairs ``pick`` takes from Z (li and lj of ``Z[:, li, lj]``, or one flat
    position into the flattened Z) and the nodes between them and ``pick`` (a batch ``expand`` for ``gather``, the
    ``remainder`` of ``take_along_dim``)."""
    name = op_name(pick)
    if name == "index":
        idx = pick.args[1]
        if len(idx) != z_dims or idx[0] is not None or not all(isinstance(i, fx.Node) for i in idx[1:]):
            return None
        return list(idx[1:]), []
    if z_dims != 2 or pick.args[1] not in (1, -1) or not isinstance(pick.args[2], fx.Node):
        return None
    if name == "index_select":
        return [pick.args[2]], []
    node, nodes = pick.args[2], []
    if op_name(node) == "remainder" and node.args[1] == f * f and len(node.users) == 1:
        nodes.append(node)  # the kernel wraps positions modulo F*F anyway
        node = node.args[0]
    root, chain = view_chain(node)
    found = view_map(chain, root)
    if found is None or found[1] or len(shape(root)) != 1 or any(len(c.users) != 1 for c in chain):
        return None
    if any(s != w and n > 1 for s, w, n in zip(found[0], (0, 1), shape(pick))):
        return None  # every batch row must take the same positions
    return [root], nodes + chain


def _pairs(pick: fx.Node, z_dims: int, f: int, gm: fx.GraphModule) -> tuple[dict, list[fx.Node], list] | None:
    """The pairs ``pick`` takes from Z: constant flat positions in the padded [F, F] tile, or index inputs (the
    1-D tensors the kernel reads)."""
    found = _pair_roots(pick, z_dims, f)
    if found is None:
        return None
    roots, chain = found
    if any(len(shape(i)) != 1 or shape(i) != shape(roots[0]) or dtype(i) not in (torch.int64, torch.int32)
           for i in roots):
        return None
    fp = max(16, pow2(f))
    values = [const_value(i, gm) for i in roots]
    if all(v is not None for v in values):
        if len(roots) == 2:
            i, j = (v.long() % f for v in values)
        else:
            flat = values[0].long() % (f * f)
            i, j = flat // f, flat % f
        nodes = chain + [n for root in roots for n in ancestors_within(root, set())]
        return {"flat": (i * fp + j).tolist()}, nodes, []
    return {"index": len(roots) + 1}, chain, roots


def _z_index(bmm: fx.Node, n_b: int, f: int) -> tuple[list[fx.Node], fx.Node] | None:
    """The views from Z = bmm(...) to the node that picks pairs (``index``, or on Z flattened to [B, F*F] also
    ``index_select``/``gather``), and that node; Z may be seen transposed (it is symmetric)."""
    z, chain = bmm, []
    while len(z.users) == 1 and op_name(next(iter(z.users))) in ("view", "_unsafe_view", "reshape", "permute",
                                                                   "transpose", "clone", "contiguous", "alias",
                                                                   "expand"):
        z = next(iter(z.users))
        chain.append(z)
    zmap = view_map(chain, bmm)
    if zmap is None or zmap[1] or len(z.users) != 1 or shape(z)[0] != n_b:
        return None
    want = [(f * f, f, 1), (f * f, 1, f)] if len(shape(z)) == 3 else [(f * f, 1)]
    if not any(all(s == w or n == 1 for s, w, n in zip(zmap[0], ws, shape(z))) for ws in want):
        return None
    pick = next(iter(z.users))
    return (chain, pick) if op_name(pick) in PICKS and pick.args[0] is z else None


def _piece_source(piece: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """A ``cat`` piece that is a reshape-like view (``dense.unsqueeze(1)``) of a tensor only it reads: that tensor
    and the views, which the launcher replays as a ``reshape``."""
    node, chain = piece, []
    while op_name(node) in PIECE_VIEWS and node.op == "call_function" and len(node.users) == 1 \
            and isinstance(node.args[0], fx.Node) and node.args[0].op != "get_attr":
        chain.append(node)
        node = node.args[0]
    return node, chain


def _features(root: fx.Node, operand: tuple, f: int, d: int) -> list[tuple] | None:
    """When the [B, F, D] features are a ``cat`` along F (of [B, n, D] or [B, n*D] pieces) read in order, per piece
    (the tensor read, first feature, count, piece shape, views absorbed): the kernel reads them in place and the
    cat is never written."""
    strides, offset = operand[2], operand[3]
    if op_name(root) != "cat" or offset or len(root.args[0]) > 64:
        return None
    dim = root.args[1] if len(root.args) > 1 else 0
    rank = len(shape(root))
    if dim % rank != 1 or any(s != w and n > 1 for s, w, n in zip(strides, (f * d, d, 1), (2, f, d))):
        return None
    out, f0 = [], 0
    if any(dtype(p) != dtype(root) for p in root.args[0]):
        return None
    for p in root.args[0]:
        width = shape(p)[1] if rank == 3 else shape(p)[1] // d
        if len(shape(p)) != rank or (rank == 2 and shape(p)[1] % d) or (rank == 3 and shape(p)[2] != d):
            return None
        src, views = _piece_source(p)
        out.append((src, f0, width, shape(p), views))
        f0 += width
    return out if f0 == f else None


def _out_cat(index: fx.Node, n_b: int, taken: set[fx.Node]) -> fx.Node | None:
    if len(index.users) != 1:
        return None
    cat = next(iter(index.users))
    if op_name(cat) != "cat" or cat in taken or (cat.args[1] if len(cat.args) > 1 else 0) not in (1, -1):
        return None
    pieces = list(cat.args[0])
    ok = all(len(shape(p)) == 2 and shape(p)[0] == n_b for p in pieces) and pieces.count(index) == 1
    return cat if ok else None


def _dot_match(bmm: fx.Node, taken: set[fx.Node], gm: fx.GraphModule) -> Match | None:
    a, b = _operand(bmm.args[0]) or (), _operand(bmm.args[1]) or ()
    if not a or not b or len(shape(bmm)) != 3:
        return None
    n_b, f, f2 = shape(bmm)
    d = shape(bmm.args[0])[2]
    found = _z_index(bmm, n_b, f) if f == f2 <= MAX_F and _same_rows(a, b, (n_b, f, d)) else None
    pairs = _pairs(found[1], len(shape(found[1].args[0])), f, gm) if found else None
    if pairs is None:
        return None
    (z_chain, index), (spec, pick_nodes, pair_inputs) = found, pairs
    cat = _out_cat(index, n_b, taken)
    nodes = [*a[1], *b[1], bmm, *z_chain, *pick_nodes, index] + ([cat] if cat else [])
    feats = _features(a[0], a, f, d)
    if feats and all(u in nodes for u in a[0].users) and a[0] not in taken:
        nodes += [a[0]] + [n for piece in feats for n in piece[4]]
    else:
        feats = None
    if any(n in taken for n in nodes):
        return None
    outs = list(cat.args[0]) if cat else [index]
    inputs = [p[0] for p in feats] if feats else [a[0]]
    inputs += pair_inputs + [p for p in outs if p is not index]
    match = make_match(FAMILY, nodes, kind="pairwise_interaction", inputs=list(dict.fromkeys(inputs)))
    if match is None or match.outputs != [cat or index]:
        return None
    pos = {n: match.inputs.index(n) for n in match.inputs}
    # per feature piece: input position, first feature, count, rank, the shape to view the input as (None: as is)
    pieces = [[pos[p], f0, n, len(ps), list(ps) if vs else None] for p, f0, n, ps, vs in feats] if feats else None
    match.spec = dict(spec, form="dot", B=n_b, F=f, D=d, strides=list(a[2]), offset=a[3], x_shape=list(shape(a[0])),
                      feats=pieces, pick=index.name,
                      pairs=[pos[i] for i in pair_inputs], pieces=[-1 if p is index else pos[p] for p in outs],
                      widths=[shape(p)[1] for p in outs], P=shape(index)[1])
    return match


# ---- FM second-order term --------------------------------------------------------------------------------------------


def _square_of(node: Any) -> fx.Node | None:
    if not isinstance(node, fx.Node):
        return None
    if op_name(node) == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    if op_name(node) == "pow" and len(node.args) == 2 and node.args[1] == 2 and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _field_sum(node: Any) -> tuple[fx.Node, int, bool, list[fx.Node]] | None:
    """``sum(x, [f], keepdim)`` of a rank-3 x (through up-casts): (x, f, keepdim, nodes)."""
    if not isinstance(node, fx.Node) or op_name(node) != "sum" or len(node.args) < 2 or node.kwargs.get("dtype"):
        return None
    dims = node.args[1]
    x, nodes = node.args[0], [node]
    while op_name(x) in CASTS and dtype(x) in (torch.float32, torch.float64):
        nodes.append(x)
        x = x.args[0]
    if not isinstance(dims, (list, tuple)) or len(dims) != 1 or len(shape(x)) != 3:
        return None
    keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    return x, dims[0] % 3, keep, nodes


def _fm_core(sub: fx.Node) -> tuple[dict, list[fx.Node]] | None:
    if op_name(sub) != "sub" or sub.kwargs.get("alpha") not in (None, 1) or len(sub.args) != 2:
        return None
    s_node = _square_of(sub.args[0])
    q = _field_sum(sub.args[1])
    s = _field_sum(s_node)
    if s is None or q is None:
        return None
    x2 = q[0]
    x = _square_of(x2)
    peeled = []
    while x is not None and op_name(x) in CASTS and dtype(x) in (torch.float32, torch.float64):
        peeled.append(x)
        x = x.args[0]
    if x is None or x is not s[0] or s[1:3] != q[1:3] or len(shape(x)) != 3:
        return None
    f, keep = s[1], s[2]
    b_dim, d_dim = [i for i in range(3) if i != f]
    nodes = [*s[3], sub.args[0], *q[3][1:], x2, *peeled, q[3][0], sub]
    roles = {"S": s[3][0].name, "A": sub.args[0].name, "X2": x2.name, "Q": q[3][0].name, "sub": sub.name}
    spec = {"form": "fm", "dims": [b_dim, f, d_dim], "d_out": d_dim if keep else d_dim - (d_dim > f),
            "roles": roles, "B": shape(x)[b_dim], "F": shape(x)[f], "D": shape(x)[d_dim]}
    return spec, nodes


def _fm_match(sub: fx.Node, taken: set[fx.Node]) -> Match | None:
    found = _fm_core(sub)
    if found is None:
        return None
    spec, nodes = found
    if any(n in taken for n in nodes) or not all(u in nodes for n in nodes[:-1] for u in n.users):
        return None
    pre, post, cur, dsum = [], [], sub, None
    while len(cur.users) == 1:
        u = next(iter(cur.users))
        if u in taken:
            break
        if can_emit(u) and u.all_input_nodes == [cur]:
            (post if dsum else pre).append(u)
        elif dsum is None and op_name(u) == "sum" and len(u.args) > 1 and list(u.args[1]) in (
                [spec["d_out"]], [spec["d_out"] - len(shape(cur))]) and not u.kwargs.get("dtype"):
            dsum = u
        else:
            break
        cur = u
    region = nodes + pre + ([dsum] if dsum else []) + post
    match = make_match(FAMILY, region, kind="pairwise_interaction")
    if match is None or match.outputs != [cur] or len(match.inputs) != 1:
        return None
    match.spec = dict(spec, pre=[n.name for n in pre], post=[n.name for n in post],
                      dsum=dsum.name if dsum else None, out_shape=list(shape(cur)))
    return match


class InteractionTemplate:
    """DLRM pairwise dot interaction and FM second-order term; see the package docstring."""

    family = FAMILY

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        def claim(node: fx.Node, used: set[fx.Node]) -> Match | None:
            name = op_name(node)
            return _dot_match(node, used, graph.gm) if name == "bmm" else \
                _fm_match(node, used) if name == "sub" else None

        return claim_each(graph, taken, claim)

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        space = {k: list(v) for k, v in SPACE.items()}
        if match.spec["form"] == "dot":
            d = max(16, pow2(match.spec["D"]))
            space["BLOCK_K"] = list(dict.fromkeys(max(16, min(v, d)) for v in DOT_SPACE["BLOCK_K"]))
            space["num_stages"] = [2, 1]  # H200, B=16384 F=27 D=128 bf16: 83 us against 122 us with one stage
            pairs = next(n for n in match.nodes if n.name == match.spec["pick"])
            if dtype(pairs) == torch.float32:  # exact FMA by default; tf32x3 keeps about fp32 accuracy
                space["INPUT_PRECISION"] = precisions("tl.float32", bool(match.spec.get("allow_tf32")))
        return space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        return render_dot(match, config, name) if match.spec["form"] == "dot" else render_fm(match, config, name)
