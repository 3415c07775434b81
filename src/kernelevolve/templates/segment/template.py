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

        return claim_each(graph, taken, claim)

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
