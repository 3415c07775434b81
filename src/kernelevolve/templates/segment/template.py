"""SegmentTemplate: claims a pooling and the [bag, D] epilogue that consumes it, and gives its config space."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, is_convex, op_name, shape
from kernelevolve.analyze.pointwise import can_emit
from kernelevolve.templates.base import Match, claim_each, make_match
from kernelevolve.templates.graphutil import closed, pow2, whole_slice
from kernelevolve.templates.segment.render import render_segment
from kernelevolve.templates.segment.sinks import BAG_OPS, normalise, sink
from kernelevolve.templates.segment.sources import counts_of

FAMILY = "segment"
SPACE = {"BLOCK_D": [128, 64, 256, 32], "BLOCK_L": [16, 32, 64, 8], "num_warps": [4, 2, 8], "num_stages": [1, 2, 3]}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


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
    if op_name(node) in ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze") or whole_slice(node) \
            or can_emit(node):
        out = [node]
        for a in node.all_input_nodes:
            if math.prod(shape(a)) not in (1, n_bags):
                return []
            out += _row_prologue(a, n_bags, taken, inside | {node})
        return out
    return []


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


# what differs between bags that one kernel pools together: their own inputs, names and bag counts
_OWN = ("roles", "pooled", "S", "tile")


def _group_key(match: Match) -> str | None:
    """Bags that one kernel can pool together share this key: embedding bags by offsets, each with nothing fused
    after it, whose tables have one width and dtype. None for a match that pools alone."""
    spec = match.spec
    if (spec.get("bags") != "offsets" or "table" not in spec["roles"] or "psw" in spec["roles"] or spec["epilogue"]
            or spec["sides"] or spec["counts"] or spec.get("padding_idx") is not None or len(spec["tile"]) != 2):
        return None
    table = match.inputs[spec["roles"]["table"]]
    return repr(sorted((k, v) for k, v in spec.items() if k not in _OWN)) + f"{dtype(table)}{dtype(match.outputs[0])}"


def grouped(matches: list[Match]) -> list[Match]:
    """Matches with the same group key (two or more) as one match, rendered as one launch, where their nodes together
    are convex (no bag feeds another); the rest as they were. The first of a group stands where the group's bags were
    in the list."""
    keys = [_group_key(m) for m in matches]
    out: list[Match] = []
    done: set[int] = set()
    for i, m in enumerate(matches):
        if i in done:
            continue
        members = [j for j in range(i, len(matches)) if keys[j] is not None and keys[j] == keys[i]]
        group = _group(matches[j] for j in members) if len(members) > 1 else None
        if group is None:
            out.append(m)
            continue
        out.append(group)
        done |= set(members)
    return out


def _group(members: Any) -> Match | None:
    members = list(members)
    match = make_match(FAMILY, [n for m in members for n in m.nodes], kind="segment_reduction")
    if match is None:
        return None
    pooled = [m.outputs[0] for m in members]
    if set(match.outputs) != set(pooled) or any(m.inputs[v] not in match.inputs for m in members
                                                for v in m.spec["roles"].values()):
        return None  # a bag that reads another's pooled rows (as its table, say) pools after it, not beside it
    match.outputs = pooled
    specs = [dict(m.spec, roles={k: match.inputs.index(m.inputs[v]) for k, v in m.spec["roles"].items()})
             for m in members]
    match.spec = dict({k: v for k, v in members[0].spec.items() if k not in _OWN}, group=specs,
                      S=max(m.spec["S"] for m in members))
    return match


class SegmentTemplate:
    """Embedding bags and segment reductions; see the package docstring."""

    family = FAMILY

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        def claim(node: fx.Node, used: set[fx.Node]) -> Match | None:
            # offset-built ids as offsets, with the bag counts beside them; then without the counts; then as ids
            for offsets, counts in ((True, True), (True, False), (False, False)):
                match = self._claim(node, graph.gm, used, offsets, counts)
                if match is not None:
                    return match
            return None

        return grouped(claim_each(graph, taken, claim))

    def _claim(self, node: fx.Node, gm: fx.GraphModule, used: set[fx.Node], offsets: bool,
               counts: bool) -> Match | None:
        found = sink(node, gm, offsets)
        if found is None:
            return None
        spec, roles, nodes = found
        ids = spec.pop("ids_node", None)
        normalise(spec, roles, nodes, gm)
        found_counts = counts_of(spec, roles, nodes, ids) if counts else []
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
            if sides is None or any(v not in match.inputs for v in roles.values()):
                continue  # a conflict, or a role the region computes itself (the kernel reads roles as inputs)
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
        return render_segment(match, config, name)
