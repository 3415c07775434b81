"""A whole model's graph cut into regions a kernel can replace.

The template families claim what they know over the whole graph (GEMMs with their epilogues, norms, attention,
interactions, segment reductions); the ops no family claims form the chains between the claims, each connected run of
them one region (convex, so one call can compute it). Views and other ops that move no data are not regions on their
own. Regions that compute the same ops on the same shapes and dtypes (twelve identical blocks) share one signature and
are optimized once.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, convex_core, dtype, op_name, origin, region_io, shape

# ops that compute nothing on their own: a chain of them alone is no region
FREE_OPS = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze",
            "slice", "select", "alias", "detach", "getitem", "as_strided", "split", "split_with_sizes", "unbind",
            "lift_fresh_copy", "clone", "_to_copy", "contiguous", "sym_size", "full", "scalar_tensor", "zeros",
            "ones", "empty", "arange"}
GLUE = "glue"  # the kind of a region no family claims


@dataclass(eq=False)
class Region:
    """A convex set of the graph's nodes, computed by one kernel call (or left as it is)."""
    index: int
    kind: str  # a template family's name, or GLUE
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    signature: str = ""
    modules: list[str] = field(default_factory=list)  # the module paths its ops came from, in graph order
    lines: list[int] = field(default_factory=list)  # the model file's lines they came from
    time_ms: float = 0.0  # device time of its ops in the reference, one call of the model

    @property
    def name(self) -> str:
        return f"r{self.index:02d}"

    @property
    def where(self) -> str:
        """The region's place in the model, for people: its module paths' common prefix and the lines."""
        mods = [m for m in self.modules if m] or [""]
        common = mods[0]
        for m in mods[1:]:
            while common and not (m == common or m.startswith(common + ".")):
                common = common.rpartition(".")[0]
        lines = sorted(set(self.lines))
        span = "" if not lines else f" (line {lines[0]})" if len(lines) == 1 else f" (lines {lines[0]}-{lines[-1]})"
        return (common or "<root>") + span

    def ops(self) -> list[str]:
        return [op_name(n) for n in self.nodes]


@dataclass(eq=False)
class Partition:
    graph: CapturedGraph
    regions: list[Region]
    skipped: list[str] = field(default_factory=list)  # families that could not read the graph, and why

    def groups(self) -> dict[str, list[Region]]:
        """Regions by signature, in graph order of their first instance: each group is one problem."""
        out: dict[str, list[Region]] = {}
        for r in self.regions:
            out.setdefault(r.signature, []).append(r)
        return out


def signature(graph: CapturedGraph, nodes: list[fx.Node], inputs: list[fx.Node]) -> str:
    """The same ops in the same order on the same shapes, dtypes and constants: one problem. Names of nodes and
    where the inputs come from do not count; whether an input is the model's state (a weight) does."""
    return _digest(_sig_parts(graph, nodes, inputs))


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _sig_parts(graph: CapturedGraph, nodes: list[fx.Node], inputs: list[fx.Node]) -> list[Any]:
    state = set(graph.placeholders()[:len(graph.state_names)])
    local = {n: f"i{k}" for k, n in enumerate(inputs)}
    local.update({n: f"n{k}" for k, n in enumerate(nodes)})

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return local[a]
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        return repr(a)

    parts: list[Any] = [["in", "w" if n in state else "x", list(shape(n) or ()), str(dtype(n))] for n in inputs]
    for n in nodes:
        parts.append([str(n.target), arg(list(n.args)), {k: arg(v) for k, v in n.kwargs.items()},
                      list(shape(n) or ()), str(dtype(n))])
    return parts


def _wild(a: Any, b: Any) -> Any:
    """``a`` with what differs from ``b`` as '*': lists element by element where their lengths agree."""
    if a == b:
        return a
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_wild(x, y) for x, y in zip(a, b)]
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {k: _wild(a[k], b[k]) for k in a}
    return "*"


def resign(part: "Partition", alt_graph: CapturedGraph, alt_regions: list[Region]) -> int:
    """Signatures in which the sizes that change from draw to draw (a jagged total, a bag count) count as any size,
    from a second draw's graph and regions: regions that differ only there become one problem (ten embedding tables
    of one size, each fed its own number of ids). Only where the ops' arguments are the same in both draws: a region
    whose ops hold a size of the draw keeps its own signature. Returns how many regions changed signature; none
    where the second draw was not cut alike."""
    by_index = {r.index: r for r in alt_regions}
    if len(by_index) != len(part.regions):
        return 0
    changed = 0
    for r in part.regions:
        o = by_index.get(r.index)
        if o is None or o.kind != r.kind or len(o.nodes) != len(r.nodes) or len(o.inputs) != len(r.inputs):
            return changed
        mine, theirs = _sig_parts(part.graph, r.nodes, r.inputs), _sig_parts(alt_graph, o.nodes, o.inputs)
        # only the shapes may differ: an op whose arguments hold a size of the draw computes that draw alone
        if mine == theirs or any(a[:3] != b[:3] for a, b in zip(mine[len(r.inputs):], theirs[len(r.inputs):])):
            continue
        r.signature = _digest(_wild(mine, theirs))
        changed += 1
    return changed


def _computes(nodes: list[fx.Node]) -> bool:
    return any(op_name(n) not in FREE_OPS for n in nodes)


def _components(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """Connected runs of ``nodes`` (through data edges between them), each split further until it is convex."""
    inside = set(nodes)
    order = {n: i for i, n in enumerate(nodes)}
    seen: set[fx.Node] = set()
    runs: list[list[fx.Node]] = []
    for start in nodes:
        if start in seen:
            continue
        comp, stack = set(), [start]
        while stack:
            n = stack.pop()
            if n in comp:
                continue
            comp.add(n)
            stack.extend(a for a in n.all_input_nodes if a in inside and a not in comp)
            stack.extend(u for u in n.users if u in inside and u not in comp)
        seen |= comp
        while comp:
            core = convex_core(comp)
            if not core:  # cannot happen for a non-empty set (a single node is convex); guard the loop anyway
                core = {min(comp, key=order.__getitem__)}
            runs.append(sorted(core, key=order.__getitem__))
            comp -= core
    return sorted(runs, key=lambda r: order[r[0]])


def partition(graph: CapturedGraph, problem: Any, device: str) -> Partition:
    """The families' claims over the whole graph and the glue between them, in graph order."""
    from kernelevolve.propose.template import claim_regions

    plan = claim_regions(graph, problem, device)
    order = {n: i for i, n in enumerate(graph.graph.nodes)}
    claimed = [(r.match.family, list(r.match.nodes)) for r in plan.regions]
    taken = {n for _, nodes in claimed for n in nodes}
    loose = [n for n in graph.calls() if n not in taken]
    sets = claimed + [(GLUE, run) for run in _components(loose) if _computes(run)]
    sets.sort(key=lambda kn: order[kn[1][0]])
    regions = []
    path = getattr(problem, "path", None)
    for kind, nodes in sets:
        nodes = sorted(nodes, key=order.__getitem__)
        inputs, outputs = region_io(nodes)
        where = [origin(n, path) for n in nodes]
        regions.append(Region(len(regions), kind, nodes, inputs, outputs, signature(graph, nodes, inputs),
                               [m for m, _ in where], [line for _, line in where if line is not None]))
    return Partition(graph, regions, plan.skipped + ([plan.error] if plan.error else []))

