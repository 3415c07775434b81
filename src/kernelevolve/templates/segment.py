"""Embedding bags and jagged segment reductions: gather rows (of a table, by index) and pool them per bag.

Recognised on the graph, whatever the spelling: ``_embedding_bag``/``embedding_bag`` (sum, mean, max; offsets with or
without the last one; per-sample weights; padding_idx); a gather (``embedding``, ``index_select``, ``index``) or a plain
values tensor pooled by ``index_put_(accumulate=True)``, ``index_add``, ``scatter_add`` or ``scatter_reduce`` with
segment ids (an input, built in the graph from lengths with ``repeat_interleave``, or from offsets with
``searchsorted(offsets, arange(N), right=True) - 1``, which makes them offsets again); ``segment_reduce`` with lengths
or offsets; ``sum``/``amax``/``amin`` over the bag axis of a [B, L, D] gather. One program pools one bag for one block
of D, accumulating in fp32; the pointwise ops that consume the pooled rows (a mean as sum / clamp(lengths)) run in the
same kernel, and so do bag counts the graph computes itself (``bincount`` of offset-built ids, ``diff(offsets)``).
Segment ids in any order are sorted in the launcher (argsort + searchsorted, no host sync). Offsets are taken to start
at 0, as ``embedding_bag`` requires.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, is_convex, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, compute_dtype, emit
from kernelevolve.templates.base import Match, make_match

FAMILY = "segment"
BAG_OPS = {"_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"}
SCATTER_OPS = {"index_put", "index_put_", "index_add", "index_add_", "scatter_add", "scatter_add_",
               "scatter_reduce", "scatter_reduce_"}
POOL_OPS = {"sum": "sum", "amax": "max", "amin": "min"}
VIEW_OPS = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze",
            "clone", "contiguous", "alias", "detach"}
UPCASTS = {"_to_copy", "convert_element_type"}
SPACE = {"BLOCK_D": [128, 64, 256, 32], "BLOCK_L": [16, 32, 64, 8], "num_warps": [4, 2, 8], "num_stages": [1, 2, 3]}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
EMPTY = {"sum": 0.0, "mean": float("nan"), "max": float("-inf"), "min": float("inf")}


# ---- graph helpers (shared with the interaction family) --------------------------------------------------------------


def bind(node: fx.Node) -> dict[str, Any]:
    """Arguments of an ATen call by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        else:
            out[a.name] = node.kwargs.get(a.name, a.default_value if a.has_default_value() else None)
    return out


def is_view(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and op_name(node) in VIEW_OPS


def view_chain(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The first non-view ancestor of ``node`` and the views from it to ``node`` (in graph order)."""
    chain = []
    while is_view(node):
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def view_map(chain: list[fx.Node], root: fx.Node) -> tuple[tuple[int, ...], int] | None:
    """Strides and offset, in elements of a contiguous ``root``, of the view that ``chain`` makes of it; None when
    a step copies (a ``reshape`` that cannot be a view). Worked out on the meta device: no data is touched."""
    env: dict[fx.Node, Any] = {root: torch.empty(shape(root), device="meta")}
    sub = lambda a: env[a] if isinstance(a, fx.Node) else a  # noqa: E731
    for n in chain:
        name = op_name(n)
        if name in ("clone", "contiguous", "alias", "detach"):
            env[n] = env[n.args[0]]
            continue
        args = torch.utils._pytree.tree_map(sub, n.args)
        kwargs = torch.utils._pytree.tree_map(sub, n.kwargs)
        try:
            env[n] = args[0].view(args[1]) if name in ("reshape", "_unsafe_view") else n.target(*args, **kwargs)
        except RuntimeError:
            return None
    out = env[chain[-1]] if chain else env[root]
    return tuple(out.stride()), out.storage_offset()


def const_value(node: Any, gm: fx.GraphModule, memo: dict | None = None) -> Any:
    """The value of a node computed from constants alone (``arange``, ``tril_indices``, lifted tensors), else None."""
    memo = {} if memo is None else memo
    if not isinstance(node, fx.Node):
        return node
    if node in memo:
        return memo[node]
    value = None
    if node.op == "get_attr":
        value = getattr(gm, node.target)
    elif node.op == "call_function":
        args = [const_value(a, gm, memo) for a in node.all_input_nodes]
        if all(isinstance(a, torch.Tensor) for a in args):
            env = dict(zip(node.all_input_nodes, args))
            sub = lambda a: env[a] if isinstance(a, fx.Node) else a  # noqa: E731
            with torch.no_grad():
                value = node.target(*torch.utils._pytree.tree_map(sub, node.args),
                                    **torch.utils._pytree.tree_map(sub, node.kwargs))
    memo[node] = value
    return value


def ancestors_within(node: fx.Node, stop: set[fx.Node]) -> list[fx.Node]:
    """``node`` and its call ancestors (constants, views) up to the nodes in ``stop``."""
    seen, todo = [], [node]
    while todo:
        n = todo.pop()
        if n in seen or n in stop or n.op == "placeholder":
            continue
        seen.append(n)
        todo.extend(n.all_input_nodes)
    return seen


def closed(nodes: set[fx.Node], extra: list[fx.Node]) -> bool:
    """Whether every user of ``extra`` lies inside ``nodes``: they are computed only for the region."""
    return all(u in nodes for n in extra for u in n.users)


def pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def side_class(arg_shape: tuple[int, ...], tile: tuple[int, ...], axes: tuple[int, int]) -> tuple | None:
    """How a value broadcasts onto the [bag, D] tile: (class, dim of its bag axis, dim of its D axis) or None."""
    r = len(tile)
    if len(arg_shape) > r:
        return None
    lead = r - len(arg_shape)
    padded = (1,) * lead + tuple(arg_shape)
    if any(p not in (1, t) for p, t in zip(padded, tile)):
        return None
    has_b, has_d = padded[axes[0]] > 1, padded[axes[1]] > 1
    kind = {(True, True): "tile", (True, False): "row", (False, True): "col", (False, False): "scalar"}[(has_b, has_d)]
    return kind, axes[0] - lead, axes[1] - lead


def grow_epilogue(nodes: list[fx.Node], start: list[fx.Node], tile: tuple[int, ...], axes: tuple[int, int],
                  taken: set[fx.Node]) -> list[fx.Node]:
    """Add the pointwise consumers of ``start`` that stay [bag, D]-shaped, and the per-bag values they read
    (``clamp(lengths, 1).unsqueeze(1)``), while the region stays convex."""
    region = list(nodes)
    frontier = list(start)
    while frontier:
        n = frontier.pop(0)
        for u in list(n.users):
            if u in region or u in taken or not can_emit(u) or shape(u) != tile:
                continue
            extra = [u]
            for a in u.all_input_nodes:
                if a not in region and side_class(shape(a), tile, axes) is None:
                    break
                if a not in region:
                    extra += _row_prologue(a, tile[axes[0]], taken, set(region) | {u})
            else:
                trial = region + extra
                if is_convex(trial):
                    region = trial
                    frontier.append(u)
    return region


def _row_prologue(node: fx.Node, n_bags: int, taken: set[fx.Node], inside: set[fx.Node]) -> list[fx.Node]:
    """Per-bag views and pointwise ops (all of whose users are inside) feeding the epilogue, e.g. a clamp of lengths."""
    s = shape(node)
    if node in taken or node.op != "call_function" or sum(d > 1 for d in s) > 1 or math.prod(s) != n_bags:
        return []
    if not all(u in inside for u in node.users):
        return []
    if op_name(node) in ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze") or can_emit(node):
        out = [node]
        for a in node.all_input_nodes:
            if math.prod(shape(a)) not in (1, n_bags):
                return []
            out += _row_prologue(a, n_bags, taken, inside | {node})
        return out
    return []


# ---- recognising the pooled value ------------------------------------------------------------------------------------


def _gather(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(table, indices) when ``node`` gathers rows of a 2-D table."""
    name = op_name(node)
    if name == "embedding":
        table, idx = node.args[0], node.args[1]
    elif name == "index_select" and node.args[1] == 0:
        table, idx = node.args[0], node.args[2]
    elif name == "index" and len(node.args[1]) == 1 and isinstance(node.args[1][0], fx.Node):
        table, idx = node.args[0], node.args[1][0]
    else:
        return None
    if len(shape(table)) != 2 or dtype(idx) not in (torch.int64, torch.int32):
        return None
    return table, idx


def _values(node: fx.Node, n_rows: int) -> tuple[dict[str, fx.Node], list[fx.Node]] | None:
    """The source of pooled rows [N, D]: roles (table, idx, psw or values) and the nodes absorbed."""
    roles: dict[str, fx.Node] = {}
    nodes: list[fx.Node] = []
    while op_name(node) in UPCASTS and dtype(node) in (torch.float32, torch.float64) and len(node.users) == 1:
        nodes.append(node)
        node = node.args[0]
    if op_name(node) == "mul" and len(node.users) == 1 and all(isinstance(a, fx.Node) for a in node.args):
        a, b = node.args if shape(node.args[1]) == (n_rows, 1) else node.args[::-1]
        if shape(b) == (n_rows, 1) and shape(a) == shape(node):
            nodes.append(node)
            root, chain = view_chain(b)
            keep = len(shape(root)) == 1 and all(len(c.users) == 1 for c in chain)
            roles["psw"] = root if keep else b
            nodes += chain if keep else []
            node = a
    found = _gather(node) if len(node.users) == 1 else None
    if found is None:
        if roles:
            return None
        return {"values": node}, nodes
    nodes.append(node)
    roles["table"], roles["idx"] = found
    return roles, nodes


def _segment_ids(index: fx.Node, n_rows: int) -> tuple[fx.Node, list[fx.Node]] | None:
    """The [N] segment ids a scatter index [N, D] broadcasts, with the views absorbed."""
    root, chain = view_chain(index)
    if len(shape(root)) not in (1, 2) or math.prod(shape(root)) != n_rows or len(shape(index)) != 2:
        return None
    found = view_map(chain, root)
    if found is None or found[1] != 0 or shape(index)[0] != n_rows or (n_rows > 1 and found[0][0] != 1):
        return None
    if shape(index)[1] > 1 and found[0][1] != 0:
        return None
    if not all(u in chain for c in chain[:-1] for u in c.users):
        return None
    return root, chain


def _from_lengths(ids: fx.Node, n_bags: int, gm: fx.GraphModule) -> tuple[fx.Node, list[fx.Node]] | None:
    """``repeat_interleave(lengths)`` (possibly through ``arange(S)[...]``): sorted ids, bags given by lengths."""
    nodes = []
    if op_name(ids) == "index_select" and ids.args[1] == 0:
        base = const_value(ids.args[0], gm)
        if base is None or not torch.equal(base, torch.arange(n_bags, dtype=base.dtype)):
            return None
        nodes = ancestors_within(ids.args[0], set()) + [ids]
        ids = ids.args[2]
    if op_name(ids) != "repeat_interleave" or len(ids.args) != 1:
        return None
    lengths = ids.args[0]
    if shape(lengths) != (n_bags,):
        return None
    return lengths, nodes + [ids]


def _from_offsets(ids: fx.Node, n_bags: int, gm: fx.GraphModule) -> tuple[fx.Node, bool, list[fx.Node]] | None:
    """``searchsorted(offsets, arange(N), right=True) - 1`` (or ``bucketize``): the bag of every position, sorted by
    construction, so the offsets are the bags. Returns the offsets, whether they also hold the end of the last bag
    (one more offset than bags), and the nodes that built the ids."""
    if op_name(ids) != "sub" or len(ids.args) != 2 or ids.args[1] != 1 or ids.kwargs.get("alpha", 1) != 1:
        return None
    found, name = ids.args[0], op_name(ids.args[0])
    if name not in ("searchsorted", "bucketize") or len(shape(ids)) != 1:
        return None
    b = bind(found)
    if name == "searchsorted":
        offsets, pos = b["sorted_sequence"], b["self"]
        right = (b["right"] or b.get("side") == "right") and b.get("sorter") is None
    else:
        offsets, pos, right = b["boundaries"], b["self"], b["right"]
    if not right or not isinstance(offsets, fx.Node) or len(shape(offsets)) != 1:
        return None
    value = const_value(pos, gm)
    n_off = shape(offsets)[0]
    if value is None or not torch.equal(value, torch.arange(shape(ids)[0], dtype=value.dtype)):
        return None
    if n_bags not in (n_off, n_off - 1):
        return None
    return offsets, n_bags == n_off - 1, ancestors_within(pos, set()) + [found, ids]


def _slice_range(node: Any, source: fx.Node) -> range | None:
    """The positions a 1-D ``slice`` of ``source`` keeps."""
    if not isinstance(node, fx.Node) or op_name(node) != "slice" or node.args[0] is not source:
        return None
    b = bind(node)
    return range(shape(source)[0])[b["start"]:b["end"]:b["step"]] if b["dim"] in (0, -1) else None


def _counts(spec: dict, roles: dict, nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """Per-bag values the graph computes beside the pooling that equal ``end - start`` of each bag: the
    ``bincount(ids, minlength=S)`` of offset-built ids, or ``offsets[1:] - offsets[:-1]`` (``diff``) when the offsets
    hold the last end. Each is [count node, the nodes under it]; in the kernel they are ``n``."""
    off = roles.get("offsets")
    if spec["bags"] != "offsets" or off is None or spec.get("padding_idx") is not None:
        return []
    n_off = shape(off)[0]
    n_bags = n_off - int(bool(spec.get("include_last")))
    inside = set(nodes)
    found = []
    for ids in nodes:
        if op_name(ids) == "sub" and op_name(ids.args[0]) in ("searchsorted", "bucketize") and ids.args[0] in inside:
            for u in ids.users:
                b = bind(u) if op_name(u) == "bincount" else {}
                if b and b["weights"] is None and b["minlength"] == n_bags and shape(u) == (n_bags,):
                    found.append([u])
    if spec.get("include_last"):
        for u in {u for sl in off.users if op_name(sl) == "slice" for u in sl.users}:
            if op_name(u) != "sub" or len(u.args) != 2 or u.kwargs.get("alpha", 1) != 1:
                continue
            hi, lo = _slice_range(u.args[0], off), _slice_range(u.args[1], off)
            if hi == range(1, n_off) and lo == range(0, n_off - 1) and all(len(a.users) == 1 for a in u.args):
                found.append([u, *u.args])
    return found


def _full_value(node: Any) -> float | None:
    if not isinstance(node, fx.Node) or op_name(node) not in ("full", "zeros"):
        return None
    return 0.0 if op_name(node) == "zeros" else float(node.args[1])


def _bag_sink(node: fx.Node) -> tuple[dict, dict, list[fx.Node]] | None:
    """``_embedding_bag``: the getitem of the pooled output is the result; the other outputs must be unused."""
    b = bind(node)
    users = list(node.users)
    if not users or any(op_name(u) != "getitem" or u.args[1] != 0 for u in users) or len(users) != 1:
        return None
    mode = {0: "sum", 1: "mean", 2: "max"}.get(int(b["mode"]))
    if mode is None:
        return None
    pad = b.get("padding_idx")
    roles = {"table": b["weight"], "idx": b["indices"], "offsets": b["offsets"]}
    if b.get("per_sample_weights") is not None:
        roles["psw"] = b["per_sample_weights"]
    spec = {"reduce": mode, "bags": "offsets", "include_last": bool(b.get("include_last_offset")),
            "padding_idx": None if pad is None or pad < 0 else int(pad), "init": None, "extra": 0, "empty": 0.0}
    return spec, roles, [node, users[0]]


def _scatter_sink(node: fx.Node) -> tuple[dict, dict, list[fx.Node]] | None:
    """``index_put_(accumulate)``/``index_add``/``scatter_add``/``scatter_reduce`` of rows into a filled [S, D]."""
    b, name = bind(node), op_name(node).rstrip("_")
    fill = _full_value(b["self"])
    if fill is None or len(shape(node)) != 2:
        return None
    if name == "index_put":
        if not b["accumulate"] or len(b["indices"]) != 1 or not isinstance(b["indices"][0], fx.Node):
            return None
        ids, src, views, reduce, include = b["indices"][0], b["values"], [], "sum", True
    else:
        src = b["source"] if name == "index_add" else b["src"]
        if b["dim"] not in (0, -2) or not isinstance(src, fx.Node) or len(shape(src)) != 2:
            return None
        if name == "index_add":
            if b.get("alpha", 1) != 1:
                return None
            ids, views = b["index"], []
        else:
            found = _segment_ids(b["index"], shape(src)[0])
            if found is None:
                return None
            ids, views = found
        reduce = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}.get(b.get("reduce", "sum"))
        include = bool(b.get("include_self", True))
        if reduce is None:
            return None
    if shape(ids) != (shape(src)[0],) or shape(src)[1] != shape(node)[1]:
        return None
    spec = {"reduce": reduce, "bags": "ids", "init": fill if include else None,
            "extra": int(include and reduce == "mean"), "empty": fill}
    own = [b["self"]] if len(b["self"].users) == 1 else []  # a shared fill stays outside; only its value is used
    return spec, {"ids": ids, "rows": src}, [*own, *views, node]


def _segment_reduce_sink(node: fx.Node) -> tuple[dict, dict, list[fx.Node]] | None:
    b = bind(node)
    reduce = b["reduce"]
    if b["axis"] != 0 or reduce not in EMPTY or len(shape(b["data"])) != 2 or b.get("indices") is not None:
        return None
    init = b.get("initial")
    spec = {"reduce": reduce, "init": None if init is None else float(init), "extra": 0,
            "empty": EMPTY[reduce] if init is None else float(init)}
    if b.get("lengths") is not None and len(shape(b["lengths"])) == 1:
        spec["bags"] = "lengths"
        return spec, {"lengths": b["lengths"], "rows": b["data"]}, [node]
    if b.get("offsets") is not None and len(shape(b["offsets"])) == 1:
        spec.update(bags="offsets", include_last=True)
        return spec, {"offsets": b["offsets"], "rows": b["data"]}, [node]
    return None


def _fixed_sink(node: fx.Node) -> tuple[dict, dict, list[fx.Node]] | None:
    """``sum``/``amax``/``amin`` over dim 1 of a [B, L, D] gather: bags of fixed length L."""
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else None
    if len(shape(x)) != 3 or list(dims or []) not in ([1], [-2]) or node.kwargs.get("dtype") is not None:
        return None
    n_bags, length, _ = shape(x)
    nodes = [node]
    while op_name(x) in UPCASTS and dtype(x) in (torch.float32, torch.float64) and len(x.users) == 1:
        nodes.append(x)
        x = x.args[0]
    if length < 1 or len(x.users) != 1:
        return None
    if op_name(x) in ("view", "_unsafe_view", "reshape") and len(shape(x.args[0])) == 2:
        nodes.append(x)
        x = x.args[0]
    found = _gather(x) if len(x.users) == 1 else None
    if found is None or math.prod(shape(found[1])) != n_bags * length:
        return None
    spec = {"reduce": POOL_OPS[op_name(node)], "bags": "fixed", "L": length, "init": None, "extra": 0,
            "empty": 0.0}
    return spec, {"table": found[0], "idx": found[1]}, nodes + [x]


def _sink(node: fx.Node, gm: fx.GraphModule, offsets: bool = True) -> tuple[dict, dict, list[fx.Node]] | None:
    name = op_name(node)
    if name in BAG_OPS:
        found = _bag_sink(node)
    elif name in SCATTER_OPS:
        found = _scatter_sink(node)
    elif name == "segment_reduce":
        found = _segment_reduce_sink(node)
    elif name in POOL_OPS:
        found = _fixed_sink(node)
    else:
        return None
    if found is None:
        return None
    spec, roles, nodes = found
    rows = roles.pop("rows", None)
    if rows is not None:
        src = _values(rows, shape(rows)[0])
        if src is None:
            return None
        roles.update(src[0])
        nodes += src[1]
    if spec["bags"] == "ids":
        sorted_ids = _from_lengths(roles["ids"], shape(node)[0], gm)
        if sorted_ids is not None:
            spec["bags"] = "lengths"
            roles["lengths"] = sorted_ids[0]
            del roles["ids"]
            nodes += sorted_ids[1]
        elif offsets and (built := _from_offsets(roles["ids"], shape(node)[0], gm)) is not None:
            spec.update(bags="offsets", include_last=built[1])
            roles["offsets"] = built[0]
            del roles["ids"]
            nodes += built[2]
    return spec, roles, nodes


def _normalise(spec: dict, roles: dict, nodes: list[fx.Node], gm: fx.GraphModule) -> None:
    """Absorb a flattening view of the indices, and turn constant ``arange`` offsets into fixed-length bags."""
    idx = roles.get("idx")
    if idx is not None and op_name(idx) in ("view", "_unsafe_view", "reshape") and len(shape(idx)) == 1 \
            and len(idx.users) == 1:
        nodes.append(idx)
        roles["idx"] = idx.args[0]
    off = roles.get("offsets")
    if off is None or idx is None or spec.get("include_last") or len(off.users) != 1:
        return
    value = const_value(off, gm)
    n = math.prod(shape(roles["idx"]))
    if value is None or value.numel() < 1 or n % value.numel():
        return
    length = n // value.numel()
    if length >= 1 and torch.equal(value, torch.arange(0, n, length, dtype=value.dtype)):
        nodes += ancestors_within(off, set())
        del roles["offsets"]
        spec.update(bags="fixed", L=length)


def _sides(match: Match, core: set[fx.Node], tile: tuple[int, ...], axes: tuple[int, int]) -> dict | None:
    """Position -> (class, bag dim, D dim) of every input an epilogue node reads; None on a conflict."""
    sides: dict[int, tuple] = {}
    for pos, inp in enumerate(match.inputs):
        for u in inp.users:
            if u not in match.nodes or u in core:
                continue
            if shape(u) == tile:
                cls = side_class(shape(inp), tile, axes)
            elif math.prod(shape(inp)) == 1:
                cls = ("scalar", None, None)
            else:
                cls = ("row", max(range(len(shape(inp))), key=lambda i: shape(inp)[i]), None)
            if cls is None or sides.setdefault(pos, cls) != cls:
                return None
    return sides


class SegmentTemplate:
    """Embedding bags and segment reductions; see the module docstring."""

    family = FAMILY

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        matches: list[Match] = []
        used = set(taken)
        for node in graph.calls():
            if node in used:
                continue
            # offset-built ids as offsets, with the bag counts beside them; then without the counts; then as ids
            for offsets, counts in ((True, True), (True, False), (False, False)):
                match = self._claim(node, graph.gm, used, offsets, counts)
                if match is not None:
                    matches.append(match)
                    used |= set(match.nodes)
                    break
        return matches

    def _claim(self, node: fx.Node, gm: fx.GraphModule, used: set[fx.Node], offsets: bool,
               counts: bool) -> Match | None:
        found = _sink(node, gm, offsets)
        if found is None:
            return None
        spec, roles, nodes = found
        _normalise(spec, roles, nodes, gm)
        found_counts = _counts(spec, roles, nodes) if counts else []
        if counts and not found_counts:
            return None
        heads = [c[0] for c in found_counts]
        nodes += [n for c in found_counts for n in c]
        pooled = nodes[1] if op_name(node) in BAG_OPS else node
        if any(n in used for n in nodes) or not closed(set(nodes), [n for n in nodes if n is not pooled
                                                                   and n not in heads]):
            return None
        if dtype(pooled) not in FLOATS or dtype(roles.get("table", roles.get("values"))) not in FLOATS:
            return None  # the kernel accumulates in fp32: integer pooling (counts) stays with ATen
        spec["counts"] = [n.name for n in heads]
        return self._match(spec, roles, nodes, pooled, used)

    def _match(self, spec: dict, roles: dict, core: list[fx.Node], pooled: fx.Node,
               used: set[fx.Node]) -> Match | None:
        tile = shape(pooled)
        axes = (0, len(tile) - 1)
        if len(tile) < 2 or any(s != 1 for s in tile[1:-1]):
            return None
        for region in (grow_epilogue(core, [pooled], tile, axes, used), core):
            match = make_match(FAMILY, region, kind="segment_reduction")
            if match is None or any(shape(o) != tile for o in match.outputs):
                continue
            sides = _sides(match, set(core), tile, axes)
            if sides is None:
                continue
            match.spec = dict(spec, roles={k: match.inputs.index(v) for k, v in roles.items()}, sides=sides,
                              pooled=pooled.name, tile=list(tile), D=tile[-1], S=tile[0],
                              epilogue=[n.name for n in match.nodes if n not in core])
            return match
        return None

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        d, length = pow2(match.spec["D"]), pow2(match.spec.get("L", 1 << 20))
        return {"BLOCK_D": list(dict.fromkeys(min(v, d) for v in SPACE["BLOCK_D"])),
                "BLOCK_L": list(dict.fromkeys(min(v, length) for v in SPACE["BLOCK_L"])),
                "num_warps": list(SPACE["num_warps"]), "num_stages": list(SPACE["num_stages"])}

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        return _render(match, config, name)


# ---- rendering -------------------------------------------------------------------------------------------------------

_BOUNDS = {
    "offsets": ["start = tl.load(bnd_ptr + bag).to(tl.int64)",
                "end = tl.load(bnd_ptr + bag + 1, mask=bag + 1 < n_bnd, other=N).to(tl.int64)"],
    "ids": ["start = tl.load(bnd_ptr + bag).to(tl.int64)", "end = tl.load(bnd_ptr + bag + 1).to(tl.int64)"],
    "lengths": ["end = tl.load(end_ptr + bag).to(tl.int64)", "start = end - tl.load(len_ptr + bag).to(tl.int64)"],
    "fixed": ["start = bag.to(tl.int64) * {L}", "end = start + {L}"],
}
_BOUND_PARAMS = {"offsets": ["bnd_ptr", "n_bnd"], "ids": ["bnd_ptr", "perm_ptr"], "lengths": ["end_ptr", "len_ptr"],
                 "fixed": []}


def _lit(v: float) -> str:
    return f"float('{v}')" if math.isinf(v) or math.isnan(v) else repr(float(v))


def _loop(spec: dict, gather: bool) -> list[str]:
    reduce, pad = spec["reduce"], spec.get("padding_idx")
    lines = ["pos = j + tl.arange(0, BLOCK_L)", "lmask = pos < end"]
    lines.append("src = tl.load(perm_ptr + pos, mask=lmask, other=0)" if spec["bags"] == "ids" else "src = pos")
    lines.append("row = tl.load(idx_ptr + src, mask=lmask, other=0).to(tl.int64)" if gather else "row = src")
    if pad is not None:
        lines += [f"lmask = lmask & (row != {pad})", "cnt += lmask.to(tl.int32)"]
    lines += ["if EVEN_D:", "    m2 = lmask[:, None]", "else:", "    m2 = lmask[:, None] & dmask[None, :]",
              "x = tl.load(src_ptr + row[:, None] * stride_v + d[None, :] * stride_d, mask=m2, other=0.0)",
              "x = x.to(tl.float32)"]
    if "psw" in spec["roles"]:
        lines.append("x = x * tl.load(psw_ptr + src, mask=lmask, other=0.0).to(tl.float32)[:, None]")
    if reduce in ("sum", "mean"):
        lines.append("acc += x")
    else:
        fn, fill = ("maximum", "-inf") if reduce == "max" else ("minimum", "inf")
        lines.append(f"acc = tl.{fn}(acc, tl.where(m2, x, float('{fill}')))")
    return lines


def _finish(spec: dict) -> tuple[list[str], list[str]]:
    reduce, init = spec["reduce"], spec["init"]
    fill = {"sum": "0.0", "mean": "0.0", "max": "float('-inf')", "min": "float('inf')"}[reduce]
    lines = [f"r = tl.{ {'max': 'max', 'min': 'min'}.get(reduce, 'sum')}(acc, 0)"]
    lines.append("n = tl.sum(cnt, 0)" if spec.get("padding_idx") is not None else "n = end - start")
    if init is not None:
        lines.append({"max": f"r = tl.maximum(r, {_lit(init)})", "min": f"r = tl.minimum(r, {_lit(init)})"}
                     .get(reduce, f"r = r + {_lit(init)}"))
    if reduce == "mean":
        lines.append(f"r = r / tl.maximum(n + {spec['extra']}, 1).to(tl.float32)")
    if spec["bags"] != "fixed" or spec.get("padding_idx") is not None:
        lines.append(f"r = tl.where(n == 0, {_lit(spec['empty'])}, r)")
    return [f"acc = tl.full([BLOCK_L, BLOCK_D], {fill}, tl.float32)"], lines


def _epilogue(match: Match, lines: list[str]) -> list[str]:
    """Loads of the epilogue's side inputs and its statements; returns the names of the values to store."""
    spec = match.spec
    by_name = {n.name: n for n in match.nodes}
    pooled = by_name[spec["pooled"]]
    if dtype(pooled) in (torch.float16, torch.bfloat16) and spec["epilogue"]:
        lines.append(f"r = r.to({TL_DTYPES[dtype(pooled)]}).to(tl.float32)")  # the graph rounds the pooled rows
    env: dict[fx.Node, str] = {pooled: "r", **{by_name[c]: "n" for c in spec.get("counts", [])}}
    loads = {"tile": "tl.load(x{k}_ptr + bag * x{k}_sb + d * x{k}_sd, mask=dmask, other=0)",
             "row": "tl.load(x{k}_ptr + bag * x{k}_sb)", "col": "tl.load(x{k}_ptr + d * x{k}_sd, mask=dmask, other=0)",
             "scalar": "tl.load(x{k}_ptr)"}
    for k, (cls, _, _) in spec["sides"].items():
        inp = match.inputs[int(k)]
        lines.append(f"s{k} = {loads[cls].format(k=k)}.to({compute_dtype(dtype(inp))})")
        env[inp] = f"s{k}"
    for i, name in enumerate(spec["epilogue"]):
        n = by_name[name]
        if can_emit(n):
            env = emit([n], env, lines, prefix=f"e{i}_")
        else:  # a view of a per-bag value: the same scalar in the kernel
            env[n] = env[n.args[0]]
    return [env[o] for o in match.outputs]


_KERNEL = '''
@triton.jit
def {name}_kernel({params}, N, D, stride_v, stride_d,
        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    bag = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
{body}
'''

_LAUNCHER = '''
def {name}(*inputs):
    src = inputs[{src}]
{prep}
    D = src.shape[1]
    outs = [torch.empty({shape}, dtype=dt, device=src.device) for dt in ({dtypes})]
    if S > 0 and D > 0:
        grid = (S, triton.cdiv(D, {BLOCK_D}))
        {name}_kernel[grid]({args}, N, D, src.stride(0), src.stride(1),
            BLOCK_L={BLOCK_L}, BLOCK_D={BLOCK_D}, EVEN_D=D % {BLOCK_D} == 0,
            num_warps={num_warps}, num_stages={num_stages})
    return tuple(outs)
'''


def _prep(spec: dict, gather: bool) -> tuple[list[str], list[str]]:
    """Launcher statements that read the bag layout, and the kernel arguments they provide."""
    r, bags = spec["roles"], spec["bags"]
    lines = [f"idx = inputs[{r['idx']}].reshape(-1)", "N = idx.numel()",
             "assert src.dim() == 2, 'the table must be 2-D'"] if gather else [
        "assert src.dim() == 2, 'the values must be 2-D'", "N = src.shape[0]"]
    args = ["src", "idx"] if gather else ["src"]
    if bags == "offsets":
        lines += [f"bnd = inputs[{r['offsets']}].reshape(-1)",
                  f"S = bnd.numel() - {int(bool(spec.get('include_last')))}"]
        args += ["bnd", "bnd.numel()"]
    elif bags == "lengths":
        lines += [f"lens = inputs[{r['lengths']}].reshape(-1)", "ends = torch.cumsum(lens, 0)", "S = lens.numel()"]
        args += ["ends", "lens"]
    elif bags == "fixed":
        lines += [f"assert N % {spec['L']} == 0, 'indices do not split into bags of {spec['L']}'",
                  f"S = N // {spec['L']}"]
    else:
        lines += [f"ids = inputs[{r['ids']}].reshape(-1)", "assert ids.numel() == N, 'one segment id per row'",
                  f"S = {spec['S']}", "perm = torch.argsort(ids, stable=True)",
                  "bnd = torch.searchsorted(ids[perm], torch.arange(S + 1, device=ids.device, dtype=ids.dtype))"]
        args += ["bnd", "perm"]
    if "psw" in r:
        lines.append(f"psw = inputs[{r['psw']}].reshape(-1)")
        args.append("psw")
    return lines, args


def _render(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    gather = "table" in spec["roles"]
    block_d = min(int(config.get("BLOCK_D", 128)), pow2(spec["D"]))
    block_l = min(int(config.get("BLOCK_L", 16)), pow2(spec.get("L", 1 << 20)))
    params = ["src_ptr"] + (["idx_ptr"] if gather else []) + _BOUND_PARAMS[spec["bags"]]
    params += ["psw_ptr"] if "psw" in spec["roles"] else []
    prep, args = _prep(spec, gather)
    for k, (cls, bdim, ddim) in spec["sides"].items():
        params.append(f"x{k}_ptr")
        args.append(f"inputs[{k}]")
        for tag, dim, used in (("sb", bdim, cls in ("tile", "row")), ("sd", ddim, cls in ("tile", "col"))):
            if used:
                params.append(f"x{k}_{tag}")
                args.append(f"inputs[{k}].stride({dim})")
    outs = [f"out{i}_ptr" for i in range(len(match.outputs))]
    init, finish = _finish(spec)
    body = [line.format(L=spec.get("L")) for line in _BOUNDS[spec["bags"]]] + init
    if spec.get("padding_idx") is not None:
        body.append("cnt = tl.zeros([BLOCK_L], tl.int32)")
    body += ["for j in range(start, end, BLOCK_L):"] + ["    " + ln for ln in _loop(spec, gather)] + finish
    values = _epilogue(match, body)
    for i, (v, o) in enumerate(zip(values, match.outputs)):
        body.append(f"tl.store(out{i}_ptr + bag * D + d, {v}.to({TL_DTYPES[dtype(o)]}), mask=dmask)")
    shape_text = "(" + ", ".join(["S", *map(str, spec["tile"][1:-1]), "D"]) + ",)"
    kernel = _KERNEL.format(name=name, params=", ".join(params + outs), body="\n".join("    " + b for b in body))
    launcher = _LAUNCHER.format(
        name=name, src=spec["roles"].get("table", spec["roles"].get("values")),
        prep="\n".join("    " + p for p in prep),
        shape=shape_text, dtypes="".join(f"{dtype(o)}, " for o in match.outputs),
        args=", ".join(args + ["outs[%d]" % i for i in range(len(outs))]), BLOCK_D=block_d, BLOCK_L=block_l,
        num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 1)))
    return kernel + launcher
