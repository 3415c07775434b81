"""The ``template`` proposer: graph analysis, the Triton template library, and an evolutionary search over configs.

The reference is captured as an ATen graph once per problem. Template families claim regions of it, most specific
first (attention before matmul before reductions before plain pointwise). A genome assigns every region a
configuration from its family's space (and, where the library has a strong vendor kernel to lose to, whether to use
the template at all). Each genome renders to one self-contained candidate file. The population is the run's own
history: the fastest verified genomes are mutated one knob at a time and crossed region by region; the first genomes
come from each family's defaults, a prior from the profile's bound class, and what won before on this device.
"""
from __future__ import annotations

import json
import logging
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from kernelevolve.candidate import Candidate, Genome, Meta, RegionConfig, RegionInfo
from kernelevolve.propose.base import ProposalContext

log = logging.getLogger(__name__)

USE = "_use"
PARENTS = 4  # fastest genomes the search breeds from


@dataclass
class Region:
    template: Any
    match: Any
    space: dict[str, list[Any]]

    @property
    def key(self) -> str:
        return self.match.key

    def default(self) -> dict[str, Any]:
        return {k: v[0] for k, v in self.space.items()}


@dataclass
class Plan:
    graph: Any
    source: str = ""
    regions: list[Region] = field(default_factory=list)
    error: str | None = None
    # input dims that vary between draws, and the plan of a draw where they differ: a candidate keeps those dims out
    # of its guard only when it renders to the same file from both
    dynamic: dict[int, set[int]] = field(default_factory=dict)
    alt: "Plan | None" = None
    skipped: list[str] = field(default_factory=list)  # families that could not handle the graph, and why

    def describe(self) -> list[RegionInfo]:
        return [RegionInfo(key=r.key, family=r.match.family, kind=r.match.kind, nodes=len(r.match.nodes))
                for r in self.regions]


# ATen ops past which a graph is not analysed: the families' matching grows faster than linearly, and a graph this
# large is an unrolled loop (a 6-layer LSTM over 512 steps traces to tens of thousands of ops) that no template covers
MAX_GRAPH_OPS = 5000


def claim_regions(graph: Any, problem: Any, device: str) -> Plan:
    """Let every family claim its regions of ``graph``, most specific first."""
    from kernelevolve.templates.registry import FAMILIES

    taken: set[Any] = set()
    plan = Plan(graph, problem.source)
    if len(graph.calls()) > MAX_GRAPH_OPS:
        plan.error = (f"the graph has {len(graph.calls())} ATen ops, more than the template library analyses "
                      f"({MAX_GRAPH_OPS}): an unrolled loop, left to the other proposers")
        return plan
    for family in FAMILIES:
        t = family.template()
        try:
            found = t.find(graph, taken)
        except Exception as e:  # a family that cannot handle this graph says so; the others go on
            log.debug("template family %s cannot handle this graph: %s: %s", t.family, type(e).__name__, e)
            plan.skipped.append(f"{t.family}: {type(e).__name__}: {str(e)[:200]}")
            continue
        for m in found:
            if taken & set(m.nodes):
                continue
            m.spec.setdefault("allow_tf32", bool(problem.allow_tf32))
            space = dict(t.space(m, device))
            if family.optional:
                space[USE] = [True, False]
            plan.regions.append(Region(t, m, space))
            taken |= set(m.nodes)
    return plan


def plan_problem(problem: Any, device: str) -> Plan:
    """Capture the reference and let every family claim its regions (twice when input shapes vary by draw)."""
    from kernelevolve.analyze.graph import CaptureError, capture, dynamic_dims

    try:
        plan = claim_regions(capture(problem), problem, device)
        dynamic, seed = dynamic_dims(problem)
        if dynamic:
            alt = claim_regions(capture(problem, input_seed=seed), problem, device)
            if [r.key for r in alt.regions] == [r.key for r in plan.regions]:
                plan.dynamic, plan.alt = dynamic, alt
    except CaptureError as e:
        return Plan(None, problem.source, error=f"the reference could not be captured as a graph: {e}")
    return plan


def genome_key(genome: Genome) -> str:
    return json.dumps(genome, sort_keys=True, default=str)


class TemplateProposer:
    name = "template"
    # candidates per refill for each one of a slower proposer: a template candidate compiles in seconds, an Inductor
    # configuration with autotuning in tens of seconds
    weight = 3

    def __init__(self, device: str, seed: int | None = None, max_candidates: int | None = None,
                 tensor_core_modes: bool = True):
        self.device = device
        self.rng = random.Random(seed)
        self._plans: dict[str, Plan] = {}
        self.broken: set[str] = set()  # region keys whose rendering failed
        # candidates per run at most (None: no limit): on the CPU, where they are verified but not timed, the default
        # proposers leave the rest of the budget to candidates that can be timed there
        self.max_candidates = max_candidates
        self.proposed = 0
        # False: each region's fp32 product mode stays its default. tf32, tf32x3 and the split modes are tensor-core
        # products, which a run on the CPU neither runs (the interpreter only repeats the default's verdict) nor times
        self.tensor_core_modes = tensor_core_modes

    def plan(self, problem: Any) -> Plan:
        if problem.sha not in self._plans:
            self._plans[problem.sha] = plan_problem(problem, self.device)
            p = self._plans[problem.sha]
            for r in [] if self.tensor_core_modes else p.regions + (p.alt.regions if p.alt else []):
                if "INPUT_PRECISION" in r.space:
                    r.space["INPUT_PRECISION"] = r.space["INPUT_PRECISION"][:1]
            log.info("template plan: %s", p.error or ", ".join(f"{r.match.kind}({len(r.match.nodes)} ops)"
                                                                for r in p.regions) or "no region matched")
        return self._plans[problem.sha]

    # ---- rendering ---------------------------------------------------------------------------------------------

    def render(self, plan: Plan, genome: Genome, label: str) -> str | None:
        from kernelevolve.analyze.pointwise import CodegenError
        from kernelevolve.templates.base import HopelessConfig, TemplateError
        from kernelevolve.templates.program import assemble

        def build(p: Plan, dynamic: dict[int, set[int]]) -> str | None:
            kernels, used = [], []
            for i, r in enumerate(p.regions):
                cfg = genome.get(r.key)
                if cfg is None or not cfg.get(USE, True) or r.key in self.broken:
                    continue
                name = f"k{i}_{r.match.family}"
                try:
                    src = r.template.render(r.match, {k: v for k, v in cfg.items() if k != USE}, name)
                except HopelessConfig as e:  # this configuration only: the region renders with others
                    log.debug("region %s: configuration %s not rendered: %s", r.key, cfg, e)
                    return None
                except (CodegenError, TemplateError, KeyError, ValueError) as e:
                    log.info("region %s cannot render: %s", r.key, e)
                    self.broken.add(r.key)
                    continue
                kernels.append((r.match, name, src))
                used.append(r.match)
            if not kernels:
                return None
            doc = f"Candidate from kernelevolve's template proposer ({label}): " + ", ".join(
                f"{m.kind}" for m in used) + "."
            try:
                return assemble(p.source, p.graph, used, kernels, doc, dynamic)
            except TemplateError as e:
                log.info("cannot assemble a candidate: %s", e)
                return None

        source = build(plan, plan.dynamic)
        if source is not None and plan.alt is not None and build(plan.alt, plan.dynamic) != source:
            # the file bakes in a size that changes between draws: it would only ever run the reference path
            log.info("genome %s depends on input sizes that vary between draws; not proposed", label)
            return None
        return source

    # ---- the search --------------------------------------------------------------------------------------------

    def _seeds(self, plan: Plan, ctx: ProposalContext) -> list[tuple[str, Genome]]:
        base = {r.key: r.default() for r in plan.regions}
        seeds = [("defaults", base)]
        for family_cfg in _experience(ctx):  # what won before on this device, before the generic prior
            g = dict(base)
            for r in plan.regions:
                # the knobs whose winning values this region's space also offers (sizes clip some spaces)
                cfg = {k: v for k, v in (family_cfg.get(r.match.family) or {}).items() if v in r.space.get(k, ())}
                if cfg:
                    g[r.key] = dict(r.default(), **cfg)
            if g != base:
                seeds.append(("experience", g))
        seeds += _precision_seeds(plan, base)
        bound = ctx.profile.bound if ctx.profile else None
        for r in plan.regions:  # the prior: second values of the knobs the bound class cares about first
            for knob in _prior_knobs(bound, r.space):
                if knob != "INPUT_PRECISION" and len(r.space[knob]) > 1:
                    varied = dict(base[r.key], **{knob: r.space[knob][1]})
                    seeds.append((f"prior {r.match.kind} {knob}", dict(base, **{r.key: varied})))
        return seeds

    def _mutate(self, plan: Plan, genome: Genome) -> tuple[str, Genome]:
        r = self.rng.choice(plan.regions)
        knob = self.rng.choice(sorted(r.space))
        cfg = dict(r.default(), **genome.get(r.key, {}))
        choices = [v for v in r.space[knob] if v != cfg.get(knob)]
        if not choices:
            return "noop", genome
        cfg[knob] = self.rng.choice(choices)
        return f"{r.match.kind} {knob}={cfg[knob]}", dict(genome, **{r.key: cfg})

    def _neighbours(self, plan: Plan, genome: Genome) -> list[tuple[str, Genome]]:
        """Every genome one knob away from ``genome`` (the pattern search's step around the best), shuffled."""
        out = []
        for r in plan.regions:
            cfg = dict(r.default(), **genome.get(r.key, {}))
            for knob in sorted(r.space):
                for v in r.space[knob]:
                    if v != cfg.get(knob):
                        out.append((f"{r.match.kind} {knob}={v}", dict(genome, **{r.key: dict(cfg, **{knob: v})})))
        self.rng.shuffle(out)
        return out

    def _cross(self, plan: Plan, a: Genome, b: Genome) -> Genome:
        return {r.key: dict((a if self.rng.random() < 0.5 else b).get(r.key, r.default())) for r in plan.regions}

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        if self.max_candidates is not None:  # a resumed run's earlier candidates count
            self.proposed = max(self.proposed, sum(1 for node in ctx.history if node.proposer == self.name))
            n = min(n, self.max_candidates - self.proposed)
            if n <= 0:
                return []
        plan = self.plan(ctx.problem)
        if plan.error or not plan.regions:
            return []
        mine = [node for node in ctx.history if node.proposer == self.name and "genome" in node.meta]
        tried = {genome_key(node.meta["genome"]) for node in mine}
        parents = _ranked(mine)[:PARENTS]
        pool: list[tuple[str, Genome, int | None]] = [(lbl, g, None) for lbl, g in self._seeds(plan, ctx)]
        if parents:  # the elite's neighbourhood first, then mutations and crosses of the elite
            pool += [(lbl, g, parents[0].id) for lbl, g in self._neighbours(plan, parents[0].meta["genome"])]
        for _ in range(8 * max(n, 1)):
            if parents:
                p = self.rng.choice(parents)
                if len(parents) > 1 and self.rng.random() < 0.3:
                    q = self.rng.choice(parents)
                    label, g = self._mutate(plan, self._cross(plan, p.meta["genome"], q.meta["genome"]))
                    pool.append((f"cross+{label}", g, p.id))
                else:
                    label, g = self._mutate(plan, p.meta["genome"])
                    if self.rng.random() < 0.3:  # a jump of two knobs, past a ridge one knob cannot cross
                        more, g = self._mutate(plan, g)
                        label = f"{label}, {more}"
                    pool.append((label, g, p.id))
            else:
                label, g = self._mutate(plan, {r.key: r.default() for r in plan.regions})
                pool.append((label, g, None))
        out: list[Candidate] = []
        for label, genome, parent in pool:
            key = genome_key(genome)
            if key in tried:
                continue
            tried.add(key)
            source = self.render(plan, genome, label)
            if source is None:
                continue
            configs = [RegionConfig(family=r.match.family, kind=r.match.kind, config=genome[r.key])
                       for r in plan.regions if r.key in genome]
            out.append(Candidate(source, proposer=self.name, language="triton", parent=parent,
                                 meta=Meta(label=label, genome=genome, configs=configs, regions=plan.describe())))
            if len(out) >= n:
                break
        self.proposed += len(out)
        return out


def _ranked(nodes: list[Any]) -> list[Any]:
    """The parents to breed from, fastest first, on the screen's clock: its time where the screen timed the node,
    else the judge's time divided by the median judge-to-screen ratio of the nodes both timed (the two clocks differ
    by a kernel's launch pattern, so they are not compared as they are); a node the judge failed is never a parent.
    Then the verified or screened nodes that have no time (the CPU interpreter)."""
    def screen_ms(n: Any) -> float | None:
        return n.screen.ms if n.screen is not None and n.screen.ok and n.screen.ms else None

    both = [n.runtime_ms / screen_ms(n) for n in nodes
            if not n.failed and n.runtime_ms is not None and screen_ms(n) is not None]
    ratio = statistics.median(both) if both else 1.0

    def ms(n: Any) -> float | None:
        if n.failed:
            return None
        if screen_ms(n) is not None:
            return screen_ms(n)
        return None if n.runtime_ms is None else n.runtime_ms / ratio

    timed = sorted((n for n in nodes if ms(n) is not None), key=ms)
    return timed or [n for n in nodes if n.ok or (n.result is None and n.screen is not None and n.screen.ok)]


def _precision_seeds(plan: Plan, base: Genome) -> list[tuple[str, Genome]]:
    """One seed for each tensor-core fp32 product mode (the exact FMA dot, where it is not the default, is the
    slowest), in every region that offers it at once: the fp32 GEMMs of one problem share its tolerance, and a
    problem with one GEMM left on the FMA dot (a SwiGLU's down projection, two of a DCN's three cross layers) runs at
    that GEMM's pace whatever the others do. Which mode is fastest depends on the shape and the Triton."""
    regions = [r for r in plan.regions if len(r.space.get("INPUT_PRECISION", ())) > 1]
    modes: list[str] = []
    for r in regions:
        modes += [v for v in r.space["INPUT_PRECISION"][1:] if v != "ieee" and v not in modes]
    seeds = []
    for mode in modes:
        having = [r for r in regions if mode in r.space["INPUT_PRECISION"]]
        genome = dict(base, **{r.key: dict(base[r.key], **_tensor_core_prior(r, mode), INPUT_PRECISION=mode)
                               for r in having})
        kinds = "+".join(dict.fromkeys(r.match.kind for r in having))
        second = all(r.space["INPUT_PRECISION"][1] == mode for r in having)
        seeds.append((f"prior {kinds} INPUT_PRECISION" + ("" if second else f"={mode}"), genome))
    return seeds


def _tensor_core_prior(r: Region, mode: str) -> dict[str, Any]:
    """The knobs a region's template sets for a tensor-core fp32 mode (its tile, where the defaults serve the exact
    FMA dot), or none."""
    hook = getattr(r.template, "tensor_core_prior", None)
    return {} if mode == "ieee" or hook is None else hook(r.match, r.space)


def _prior_knobs(bound: str | None, space: dict[str, list[Any]]) -> list[str]:
    """Knobs worth a first variation: schedule (the persistent TMA GEMM) and tile shape when compute-bound,
    parallelism when memory- or latency-bound. fp32 products come first whatever the bound: on H200 the exact-FMA dot
    of the fp32 DLRM interaction and DCN templates ran 1.9x slower than cuBLAS, and tf32x3 moves them onto tensor
    cores at about fp32 accuracy."""
    if bound == "compute":
        order = ["SCHEDULE", "BLOCK_M", "BLOCK_N", "num_stages"]
    elif bound == "latency":
        order = ["num_warps", "BLOCK_R", "BLOCK"]
    else:
        order = ["PERSISTENT", "BLOCK_R", "BLOCK", "num_warps", "BLOCK_N"]
    return [k for k in ["INPUT_PRECISION", *order] if k in space]


def _experience(ctx: ProposalContext) -> list[dict[str, dict[str, Any]]]:
    """Per-family configs of the winners of earlier runs on this device, most similar problems first."""
    out = []
    for entry in ctx.experience:
        fam: dict[str, dict[str, Any]] = {}
        for c in entry.meta.get("configs", []):
            fam.setdefault(c["family"], c["config"])
        if fam:
            out.append(fam)
    return out[:4]
