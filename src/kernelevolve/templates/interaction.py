"""Feature interactions of recommendation models: the DLRM pairwise dot and the FM second-order term.

DLRM: ``bmm(T, T^T)`` (or the same ``einsum('bnd,bmd->bnm')``) where both operands are views of one [B, F, D] tensor,
then ``Z[:, li, lj]``, or on Z flattened to [B, F*F] ``[:, flat]``/``index_select(1, flat)``/``gather`` with one
position row for every batch row (``take_along_dim``), with index pairs that are graph constants (``tril_indices``, a
lifted list) or inputs (a module buffer), then optionally ``cat([dense, ..., pairs], 1)``. One program takes BLOCK_B
batch rows: it loads each row's [F, D] block once (from the pieces of the ``cat`` that built T, read in place), forms Z
with ``tl.dot``, gathers the pairs from registers and writes them straight into their columns of the output, next to
the copied dense columns.
FM: ``0.5 * (sum_f(x)^2 - sum_f(x^2))``, summed over D or not, with the scalar pointwise ops around it.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, emit
from kernelevolve.templates.base import Match, make_match
from kernelevolve.templates.segment import UPCASTS, ancestors_within, const_value, pow2, view_chain, view_map

FAMILY = "interaction"
SPACE = {"BLOCK_B": [1, 2, 4, 8], "num_warps": [4, 8, 2], "num_stages": [1, 2]}
DOT_SPACE = {"BLOCK_K": [128, 64, 32]}  # D chunk of the Z = T T^T product, clamped to D
MAX_F = 128  # Z is held in registers: F_pad^2 fp32 values per row
HALF = (torch.float16, torch.bfloat16)
PICKS = ("index", "index_select", "gather")
PIECE_VIEWS = ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "clone", "contiguous", "alias")


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
    while op_name(x) in UPCASTS and dtype(x) in (torch.float32, torch.float64):
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
    while x is not None and op_name(x) in UPCASTS and dtype(x) in (torch.float32, torch.float64):
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
    """DLRM pairwise dot interaction and FM second-order term; see the module docstring."""

    family = FAMILY

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        matches: list[Match] = []
        used = set(taken)
        for node in graph.calls():
            if node in used:
                continue
            name = op_name(node)
            match = _dot_match(node, used, graph.gm) if name == "bmm" else \
                _fm_match(node, used) if name == "sub" else None
            if match is not None:
                matches.append(match)
                used |= set(match.nodes)
        return matches

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        space = {k: list(v) for k, v in SPACE.items()}
        if match.spec["form"] == "dot":
            d = max(16, pow2(match.spec["D"]))
            space["BLOCK_K"] = list(dict.fromkeys(max(16, min(v, d)) for v in DOT_SPACE["BLOCK_K"]))
            space["num_stages"] = [2, 1]  # H200, B=16384 F=27 D=128 bf16: 83 us against 122 us with one stage
        return space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        return _render_dot(match, config, name) if match.spec["form"] == "dot" else _render_fm(match, config, name)


# ---- rendering: DLRM -------------------------------------------------------------------------------------------------

_DOT_KERNEL = '''
@triton.jit
def {name}_kernel({params}out_ptr, B, D, stride_o,
        BLOCK_B: tl.constexpr, F: tl.constexpr, F_PAD: tl.constexpr, BLOCK_K: tl.constexpr, P: tl.constexpr,
        P_PAD: tl.constexpr):
    fi = tl.arange(0, F_PAD)
    p = tl.arange(0, P_PAD)
    pmask = p < P
{positions}
    for r in tl.static_range(BLOCK_B):
        # rows past the end redo the last row: the same values to the same place, no batch mask needed
        b = tl.minimum(tl.program_id(0) * BLOCK_B + r, B - 1).to(tl.int64)
{rows}
        z = tl.zeros([F_PAD, F_PAD], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            t = tl.load(rowp[:, None] + k[None, :]{sk}, mask=(fi < F)[:, None] & (k < D)[None, :], other=0.0)
            z = tl.dot({operands}, z, input_precision="{precision}")
        v = tl.gather(tl.reshape(z, [F_PAD * F_PAD]), flat, 0)
        tl.store(out_ptr + b * stride_o + {col} + p, v{cast}, mask=pmask)
{copies}
'''

_DOT_LAUNCHER = '''
{name}_cache = {{}}


def {name}(*inputs):
    B = {B}
    out = torch.empty(({B}, {width}), dtype={out_dtype}, device=inputs[0].device)
{prep}
    grid = (triton.cdiv(B, {BLOCK_B}),)
    {name}_kernel[grid]({args}out, B, {D}, out.stride(0),
        BLOCK_B={BLOCK_B}, F={F}, F_PAD={F_PAD}, BLOCK_K={BLOCK_K}, P={P}, P_PAD={P_PAD},
        num_warps={num_warps}, num_stages={num_stages})
    return (out,)
'''


def _positions(spec: dict, name: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """Kernel lines giving ``flat`` (pair positions in the flattened Z tile), with params, launcher lines and args."""
    if "flat" in spec:
        prep = [f"pos = {name}_cache.get(out.device)", "if pos is None:",
                f"    pos = {name}_cache[out.device] = torch.tensor({name}_FLAT, dtype=torch.int32, "
                "device=out.device)"]
        return ["flat = tl.load(pos_ptr + p, mask=pmask, other=0)"], ["pos_ptr"], prep, ["pos"]
    f, lines = spec["F"], []
    names = ["li", "lj"] if spec["index"] == 3 else ["lf"]
    for n, k in zip(names, spec["pairs"]):
        lines.append(f"{n} = tl.load({n}_ptr + p, mask=pmask, other=0).to(tl.int32)")
    if spec["index"] == 3:
        lines += [f"li = tl.minimum(tl.maximum(tl.where(li < 0, li + F, li), 0), F - 1)",
                  f"lj = tl.minimum(tl.maximum(tl.where(lj < 0, lj + F, lj), 0), F - 1)", "flat = li * F_PAD + lj"]
    else:
        lines += [f"lf = lf % {f * f}", f"lf = tl.where(lf < 0, lf + {f * f}, lf)", "flat = (lf // F) * F_PAD + lf % F"]
    prep = [f"{n} = inputs[{k}].contiguous()" for n, k in zip(names, spec["pairs"])]
    prep += [f"assert {n}.numel() == {spec['P']}, 'index pairs of the traced count expected'" for n in names]
    return lines, [f"{n}_ptr" for n in names], prep, names


def _copies(match: Match, out_dtype: str) -> tuple[list[str], list[str], list[str], int]:
    """Kernel lines copying the other ``cat`` pieces into their columns; params, args and the pairs' column."""
    spec, lines, params, args, col, pair_col = match.spec, [], [], [], 0, 0
    for k, (pos, w) in enumerate(zip(spec["pieces"], spec["widths"])):
        if pos < 0:
            pair_col = col
        else:
            params += [f"c{k}_ptr", f"c{k}_s0", f"c{k}_s1"]
            args += [f"inputs[{pos}]", f"inputs[{pos}].stride(0)", f"inputs[{pos}].stride(1)"]
            lines += [f"ck = tl.arange(0, {pow2(w)})",
                      f"v = tl.load(c{k}_ptr + b * c{k}_s0 + ck * c{k}_s1, mask=ck < {w}, other=0)",
                      f"tl.store(out_ptr + b * stride_o + {col} + ck, v.to({out_dtype}), mask=ck < {w})"]
        col += w
    return lines, params, args, pair_col


def _rows(spec: dict) -> tuple[list[str], str, list[str], list[str], list[str]]:
    """Kernel lines giving ``rowp``, the address of each feature row of batch row b (a feature may come from any
    piece of the input ``cat``), the inner stride, params, launcher lines and args."""
    if not spec["feats"]:
        sb, si, sk = spec["strides"]
        prep = ["x = inputs[0].contiguous()", f"assert x.shape == {tuple(spec['x_shape'])}, 'features of the "
                "traced shape expected'"]
        return [f"rowp = x_ptr + b * {sb} + fi * {si}"], f" * {sk}", ["x_ptr"], prep, \
            [f"x.reshape(-1)[{spec['offset']}:]"]
    lines, params, prep, args = [], [], [], []
    for k, (pos, f0, n, rank, view) in enumerate(spec["feats"]):
        row = f"f{k}_ptr + b * f{k}_sb + (fi - {f0}) * f{k}_sf"
        lines.append(f"rowp = tl.where(fi >= {f0}, {row}, rowp)" if k else f"rowp = {row}")
        params += [f"f{k}_ptr", f"f{k}_sb", f"f{k}_sf"]
        piece = f"inputs[{pos}].reshape({tuple(view)})" if view else f"inputs[{pos}]"
        prep += [f"f{k} = {piece}", f"f{k} = f{k} if f{k}.stride(-1) == 1 else f{k}.contiguous()",
                 f"assert f{k}.shape[0] == B, 'features of the traced batch expected'"]
        args += [f"f{k}", f"f{k}.stride(0)", f"f{k}.stride(1)" if rank == 3 else f"{spec['D']} * f{k}.stride(1)"]
    return lines, "", params, prep, args


def _render_dot(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    out = match.outputs[0]
    pairs_node = next(n for n in match.nodes if n.name == spec["pick"])
    out_dtype = TL_DTYPES[dtype(out)]
    load_lines, sk, load_params, load_prep, load_args = _rows(spec)
    pos_lines, pos_params, prep, pos_args = _positions(spec, name)
    copy_lines, copy_params, copy_args, col = _copies(match, out_dtype)
    cast = f".to({TL_DTYPES[dtype(pairs_node)]})" + (f".to({out_dtype})" if dtype(pairs_node) != dtype(out) else "")
    # half inputs: tf32 on the up-cast tile is exact (11-bit significands) and is the same MMA arithmetic
    if dtype(pairs_node) == torch.float32:
        operands, precision = "t, tl.trans(t)", "tf32" if spec.get("allow_tf32") else "ieee"
    else:
        operands, precision = "t.to(tl.float32), tl.trans(t).to(tl.float32)", "tf32"
    kernel = _DOT_KERNEL.format(
        name=name, params="".join(p + ", " for p in load_params + pos_params + copy_params),
        positions="\n".join("    " + ln for ln in pos_lines), rows="\n".join(" " * 8 + ln for ln in load_lines), sk=sk,
        operands=operands, precision=precision, col=col, cast=cast,
        copies="\n".join("        " + ln for ln in copy_lines))
    block_k = max(16, min(pow2(spec["D"]), int(config.get("BLOCK_K", 128))))
    launcher = _DOT_LAUNCHER.format(
        name=name, B=spec["B"], prep="\n".join("    " + p for p in load_prep + prep), width=sum(spec["widths"]),
        out_dtype=dtype(out), args="".join(a + ", " for a in load_args + pos_args + copy_args), D=spec["D"],
        BLOCK_B=int(config.get("BLOCK_B", 1)), F=spec["F"], F_PAD=max(16, pow2(spec["F"])), BLOCK_K=block_k,
        P=spec["P"], P_PAD=pow2(spec["P"]), num_warps=int(config.get("num_warps", 4)),
        num_stages=int(config.get("num_stages", 1)))
    table = f"\n{name}_FLAT = {spec['flat']!r}\n" if "flat" in spec else ""
    return table + kernel + launcher


# ---- rendering: FM ---------------------------------------------------------------------------------------------------

_FM_KERNEL = '''
@triton.jit
def {name}_kernel(x_ptr, out_ptr, B, D, sb, sf, sd,
        BLOCK_B: tl.constexpr, F: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    fs = tl.arange(0, BLOCK_F)
    bmask = rows < B
    tot = tl.zeros([BLOCK_B], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dmask = d < D
        m = bmask[:, None, None] & (fs < F)[None, :, None] & dmask[None, None, :]
        ptr = x_ptr + rows[:, None, None] * sb + fs[None, :, None] * sf + d[None, None, :] * sd
        xs = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
{inner}
{after}
'''

_FM_LAUNCHER = '''
def {name}(*inputs):
    x = inputs[0]
    assert x.dim() == 3, 'x must be [batch, fields, dim]'
    B, F, D = x.shape[{b}], x.shape[{f}], x.shape[{d}]
    assert (B, F, D) == ({B}, {F}, {D}), 'x of the traced shape expected'
    out = torch.empty({out_shape}, dtype={out_dtype}, device=x.device)
    grid = (triton.cdiv(B, {BLOCK_B}),)
    {name}_kernel[grid](x, out, B, D, x.stride({b}), x.stride({f}), x.stride({d}),
        BLOCK_B={BLOCK_B}, F={F}, BLOCK_F={BLOCK_F}, BLOCK_D={BLOCK_D},
        num_warps={num_warps}, num_stages={num_stages})
    return (out,)
'''


def _rounded(var: str, node: fx.Node) -> list[str]:
    """Where the graph holds a value in half precision, round it as the graph does."""
    dt = dtype(node)
    return [f"{var} = {var}.to({TL_DTYPES[dt]}).to(tl.float32)"] if dt in HALF else []


def _chain(nodes: list[fx.Node], env: dict[fx.Node, str], prefix: str) -> tuple[list[str], str]:
    lines: list[str] = []
    var = next(iter(env.values()))
    for i, n in enumerate(nodes):
        env = emit([n], env, lines, prefix=f"{prefix}{i}_")
        var = env[n]
        lines += _rounded(var, n)
    return lines, var


def _render_fm(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    by_name = {n.name: n for n in match.nodes}
    r = {k: by_name[v] for k, v in spec["roles"].items()}
    inner = ["s = tl.sum(xs, 1)", *_rounded("s", r["S"]), "a = s * s", *_rounded("a", r["A"]),
             "x2 = xs * xs", *_rounded("x2", r["X2"]), "q = tl.sum(x2, 1)", *_rounded("q", r["Q"]),
             "v = a - q", *_rounded("v", r["sub"])]
    pre, var = _chain([by_name[n] for n in spec["pre"]], {r["sub"]: "v"}, "p")
    inner += pre
    out_dtype = TL_DTYPES[dtype(match.outputs[0])]
    after: list[str] = []
    if spec["dsum"]:
        inner.append(f"tot += tl.sum(tl.where(dmask[None, :], {var}, 0.0), 1)")
        dsum = by_name[spec["dsum"]]
        post, var = _chain([by_name[n] for n in spec["post"]], {dsum: "tot"}, "q")
        after = _rounded("tot", dsum) + post + [f"tl.store(out_ptr + rows, {var}.to({out_dtype}), mask=bmask)"]
    else:
        inner.append(f"tl.store(out_ptr + rows[:, None] * D + d[None, :], {var}.to({out_dtype}), "
                     "mask=bmask[:, None] & dmask[None, :])")
    block_f = pow2(spec["F"])
    block_d = min(pow2(spec["D"]), max(16, 4096 // block_f))
    block_b = max(1, min(int(config.get("BLOCK_B", 1)), 8192 // (block_f * block_d)))
    b, f, d = spec["dims"]
    kernel = _FM_KERNEL.format(name=name, inner="\n".join("        " + ln for ln in inner),
                               after="\n".join("    " + ln for ln in after))
    shape_text = "(" + "".join(f"{s}, " for s in spec["out_shape"]) + ")"
    launcher = _FM_LAUNCHER.format(
        name=name, b=b, f=f, d=d, B=spec["B"], F=spec["F"], D=spec["D"], out_shape=shape_text,
        out_dtype=dtype(match.outputs[0]),
        BLOCK_B=block_b, BLOCK_F=block_f, BLOCK_D=block_d, num_warps=int(config.get("num_warps", 4)),
        num_stages=int(config.get("num_stages", 1)))
    return kernel + launcher
