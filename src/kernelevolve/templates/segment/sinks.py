"""The ops that pool rows into bags (embedding bags, accumulating scatters, ``segment_reduce``, a reduction over the
bag axis of a gather): each gives a spec, the roles of its inputs and the nodes it absorbs."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype, op_name, shape
from kernelevolve.templates.graphutil import CASTS, ancestors_within, bind, const_value
from kernelevolve.templates.segment.facts import lengths_of, lengths_summed
from kernelevolve.templates.segment.sources import from_lengths, from_offsets, gather_source, segment_ids, values_source

BAG_OPS = {"_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"}
SCATTER_OPS = {"index_put", "index_put_", "index_add", "index_add_", "scatter_add", "scatter_add_",
               "scatter_reduce", "scatter_reduce_"}
POOL_OPS = {"sum": "sum", "amax": "max", "amin": "min"}
EMPTY = {"sum": 0.0, "mean": float("nan"), "max": float("-inf"), "min": float("inf")}


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
            found = segment_ids(b["index"], shape(src)[0])
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
    while op_name(x) in CASTS and dtype(x) in (torch.float32, torch.float64) and len(x.users) == 1:
        nodes.append(x)
        x = x.args[0]
    if length < 1 or len(x.users) != 1:
        return None
    if op_name(x) in ("view", "_unsafe_view", "reshape") and len(shape(x.args[0])) == 2:
        nodes.append(x)
        x = x.args[0]
    found = gather_source(x) if len(x.users) == 1 else None
    if found is None or math.prod(shape(found[1])) != n_bags * length:
        return None
    spec = {"reduce": POOL_OPS[op_name(node)], "bags": "fixed", "L": length, "init": None, "extra": 0,
            "empty": 0.0}
    return spec, {"table": found[0], "idx": found[1]}, nodes + [x]


def sink(node: fx.Node, gm: fx.GraphModule, offsets: bool = True) -> tuple[dict, dict, list[fx.Node]] | None:
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
        src = values_source(rows, shape(rows)[0])
        if src is None:
            return None
        roles.update(src[0])
        nodes += src[1]
    if spec["bags"] == "ids":
        spec["ids_node"] = roles["ids"]  # for the counts beside the pooling (counts_of); taken out before the match
        sorted_ids = from_lengths(roles["ids"], shape(node)[0], gm)
        if sorted_ids is not None:
            spec["bags"] = "lengths"
            roles["lengths"] = sorted_ids[0]
            del roles["ids"]
            nodes += sorted_ids[1]
            _lengths_as_offsets(spec, roles, nodes)
        elif offsets and (built := from_offsets(roles["ids"], shape(node)[0], gm)) is not None:
            spec.update(bags="offsets", include_last=built[1], **({"from_zero": True} if built[2] else {}))
            roles["offsets"] = built[0]
            del roles["ids"]
            nodes += built[3]
            if built[1]:
                _offsets_as_lengths(spec, roles, nodes, gm)
    return spec, roles, nodes


def _offsets_as_lengths(spec: dict, roles: dict, nodes: list[fx.Node], gm: fx.GraphModule) -> None:
    """Offsets made from lengths (a zero, then their running sum): the bags are the lengths, and the kernel's launcher
    sums them once instead of the graph's cumsum, zeros and cat."""
    found = lengths_summed(roles["offsets"], gm)
    if found is None:
        return
    lengths, between = found
    for key in ("include_last", "from_zero"):
        spec.pop(key, None)
    spec["bags"] = "lengths"
    del roles["offsets"]
    roles["lengths"] = lengths
    _absorb(nodes, between)


def _absorb(nodes: list[fx.Node], between: tuple[fx.Node, ...]) -> None:
    """Add to ``nodes`` each of ``between`` all of whose users are in them, until none is left to add."""
    inside = set(nodes)
    grew = True
    while grew:
        grew = False
        for n in between:
            if n not in inside and all(u in inside for u in n.users):
                inside.add(n)
                nodes.append(n)
                grew = True


def _lengths_as_offsets(spec: dict, roles: dict, nodes: list[fx.Node]) -> None:
    """Lengths that are the differences of offsets (``offsets[1:] - offsets[:-1]``, however spelled): the bags are
    the offsets, last end included. The subtraction joins the region where nothing else reads it; where something does
    (a mean's divisor), it stays outside, or joins as a count (counts_of)."""
    found = lengths_of(roles["lengths"])
    if found is None:
        return
    offsets, between = found
    spec.update(bags="offsets", include_last=True)
    del roles["lengths"]
    roles["offsets"] = offsets
    _absorb(nodes, between)  # from the ids down: the views over the subtraction join even where it stays outside


def normalise(spec: dict, roles: dict, nodes: list[fx.Node], gm: fx.GraphModule) -> None:
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
