"""Recognising the pooled value of a segment reduction: the rows it pools (a gather of a table, or a values tensor)
and the bags, as segment ids, lengths or offsets."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype, op_name, shape
from kernelevolve.templates.graphutil import CASTS, ancestors_within, bind, const_value, view_chain, view_map
from kernelevolve.templates.segment.facts import identity, lengths_near, only_used_within


def gather_source(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
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


def values_source(node: fx.Node, n_rows: int) -> tuple[dict[str, fx.Node], list[fx.Node]] | None:
    """The source of pooled rows [N, D]: roles (table, idx, psw or values) and the nodes absorbed."""
    roles: dict[str, fx.Node] = {}
    nodes: list[fx.Node] = []
    while op_name(node) in CASTS and dtype(node) in (torch.float32, torch.float64) and len(node.users) == 1:
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
    found = gather_source(node) if len(node.users) == 1 else None
    if found is None:
        if roles:
            return None
        return {"values": node}, nodes
    nodes.append(node)
    roles["table"], roles["idx"] = found
    return roles, nodes


def segment_ids(index: fx.Node, n_rows: int) -> tuple[fx.Node, list[fx.Node]] | None:
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


def from_lengths(ids: fx.Node, n_bags: int, gm: fx.GraphModule) -> tuple[fx.Node, list[fx.Node]] | None:
    """``repeat_interleave(lengths)`` (possibly through ``arange(S)[...]``), or the search among the bags' ends
    ``searchsorted(cumsum(lengths), arange(N), right=True)`` (or ``bucketize``): sorted ids, bags given by lengths."""
    ends = _ends_search(ids, gm)
    if ends is not None and op_name(ends[0]) == "cumsum" and len(shape(ends[0])) == 1 \
            and bind(ends[0])["dim"] in (0, -1) and shape(ends[0]) == (n_bags,) and len(ends[0].users) == 1:
        lengths = ends[0].args[0]
        if isinstance(lengths, fx.Node) and shape(lengths) == (n_bags,):
            return lengths, ends[1] + [ends[0]]
    nodes = []
    if op_name(ids) == "index_select" and ids.args[1] == 0:
        base = const_value(ids.args[0], gm)
        if base is None or not torch.equal(base, torch.arange(n_bags, dtype=base.dtype)):
            return None
        nodes = ancestors_within(ids.args[0], set()) + [ids]
        ids = ids.args[2]
    if op_name(ids) != "repeat_interleave" or len(ids.args) != 1:
        return None
    lengths, views = ids.args[0], []
    while isinstance(lengths, fx.Node) and identity(lengths) and len(lengths.users) == 1:
        views.append(lengths)  # a size-1 repeat_interleave views and expands its repeats to their own shape
        lengths = lengths.args[0]
    if shape(lengths) != (n_bags,):
        return None
    return lengths, nodes + views[::-1] + [ids]


def _ends_search(ids: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node, list[fx.Node]] | None:
    """(the sorted ends, the nodes that built the ids) of ``searchsorted(ends, arange(N), right=True)`` (or
    ``bucketize``)."""
    name = op_name(ids) if isinstance(ids, fx.Node) else ""
    if name not in ("searchsorted", "bucketize") or len(shape(ids)) != 1:
        return None
    b = bind(ids)
    if name == "searchsorted":
        ends, pos = b["sorted_sequence"], b["self"]
        right = (b["right"] or b.get("side") == "right") and b.get("sorter") is None
    else:
        ends, pos, right = b["boundaries"], b["self"], b["right"]
    if not right or not isinstance(ends, fx.Node) or len(shape(ends)) != 1:
        return None
    value = const_value(pos, gm)
    if value is None or not torch.equal(value, torch.arange(shape(ids)[0], dtype=value.dtype)):
        return None
    return ends, ancestors_within(pos, set()) + [ids]


def from_offsets(ids: fx.Node, n_bags: int,
                  gm: fx.GraphModule) -> tuple[fx.Node, bool, bool, list[fx.Node]] | None:
    """``searchsorted(offsets, arange(N), right=True) - 1`` (or ``bucketize``), or the same search among the bags'
    ends, ``searchsorted(offsets[1:], arange(N), right=True)``: the bag of every position, sorted by construction, so
    the offsets are the bags. Returns the offsets, whether they also hold the end of the last bag (one more offset
    than bags), whether the first bag starts at row 0 whatever the first offset says (the search among the ends puts
    every row before the first end in bag 0), and the nodes that built the ids."""
    minus_one = op_name(ids) == "sub" and len(ids.args) == 2 and ids.args[1] == 1 and ids.kwargs.get("alpha", 1) == 1
    if len(shape(ids)) != 1:
        return None
    search = _ends_search(ids.args[0] if minus_one else ids, gm)
    if search is None:
        return None
    offsets, built = search[0], search[1] + ([ids] if minus_one else [])
    if not minus_one:  # searched among the ends: the offsets are what the ends were sliced from, the last end too
        ends = offsets
        if op_name(ends) != "slice" or _slice_range(ends, ends.args[0]) != range(1, shape(ends.args[0])[0]):
            return None
        offsets = ends.args[0]
        if n_bags != shape(offsets)[0] - 1:
            return None
        return offsets, True, True, built + ([ends] if len(ends.users) == 1 else [])
    n_off = shape(offsets)[0]
    if n_bags not in (n_off, n_off - 1):
        return None
    return offsets, n_bags == n_off - 1, False, built


def _slice_range(node: Any, source: fx.Node) -> range | None:
    """The positions a 1-D ``slice`` of ``source`` keeps."""
    if not isinstance(node, fx.Node) or op_name(node) != "slice" or node.args[0] is not source:
        return None
    b = bind(node)
    return range(shape(source)[0])[b["start"]:b["end"]:b["step"]] if b["dim"] in (0, -1) else None


def counts_of(spec: dict, roles: dict, nodes: list[fx.Node], ids: fx.Node | None) -> list[list[fx.Node]]:
    """Per-bag values the graph computes beside the pooling that equal ``end - start`` of each bag: the
    ``bincount(ids, minlength=S)`` of the sorted segment ids ``ids`` (or of the ``repeat_interleave`` under them), or,
    when the offsets hold the last end, their differences however spelled (facts.lengths_of). Each is [count node,
    the nodes under it]; in the kernel they are ``n``."""
    if spec.get("padding_idx") is not None or spec["bags"] not in ("lengths", "offsets"):
        return []
    bags = roles.get("lengths") if spec["bags"] == "lengths" else roles.get("offsets")
    if bags is None:
        return []
    n_bags = shape(bags)[0] - int(spec["bags"] == "offsets" and bool(spec.get("include_last")))
    inside = set(nodes)
    sources = ([ids] if ids is not None and ids in inside else []) \
        + [n for n in nodes if op_name(n) == "repeat_interleave"]
    found = [[u] for src in dict.fromkeys(sources) for u in src.users
             if op_name(u) == "bincount" and bind(u)["weights"] is None and bind(u)["minlength"] == n_bags
             and shape(u) == (n_bags,) and u not in inside]
    if spec["bags"] == "offsets" and spec.get("include_last"):
        for head, between in lengths_near(bags):
            if head not in inside and only_used_within(set(between), head):
                found.append([head, *(n for n in between if n is not head and n not in inside)])
    return found
