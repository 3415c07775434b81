"""A whole model's plan: where its time goes, the problems its regions make, and each problem's share of the budget.

``plan_model`` captures the model once (each op with its module path and source line), cuts the graph into regions,
profiles every op on the device, writes one problem file per distinct region into the output folder (beside a copy
of the model's file, which they read) and places each on its roofline. ``optimize_regions`` then runs the operator
loop on each problem that matters, with its share of the budget.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.analyze.graph import CaptureError, CapturedGraph, capture, dynamic_dims
from kernelevolve.model.budget import MIN_SHARE, Claim, Pacer, Share, allocate, run_overhead_s
from kernelevolve.model.partition import Partition, Region, partition, resign
from kernelevolve.model.profile import OpTimes, attribute, hot_regions, op_times
from kernelevolve.model.regionfile import SAVE_STATE_BYTES, STATE_FILE, save_state, state_bytes, write_region
from kernelevolve.problem import Problem, ProblemError, load_problem

log = logging.getLogger(__name__)


class ModelError(Exception):
    """A model that cannot be planned: one line naming the file and the cause."""


@dataclass
class ProblemGroup:
    """Regions with one signature: one problem file, optimized once, its kernel used at every instance."""
    regions: list[Region]
    path: Path
    ms: float  # all instances, one call of the model
    floor_ms: float | None = None  # all instances
    share: Share | None = None

    @property
    def name(self) -> str:
        return self.regions[0].name

    @property
    def kind(self) -> str:
        return self.regions[0].kind

    def row(self, total_ms: float) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "file": self.path.name, "where": self.regions[0].where,
                "instances": [r.where for r in self.regions], "ops": self.regions[0].ops(), "ms": self.ms,
                "share": self.ms / total_ms if total_ms else None, "floor_ms": self.floor_ms,
                "budget_s": self.share.budget_s if self.share else None, "why": self.share.why if self.share else ""}


@dataclass
class ModelPlan:
    problem: Problem
    graph: CapturedGraph
    partition: Partition
    times: OpTimes
    groups: list[ProblemGroup]
    out_dir: Path
    notes: list[str] = field(default_factory=list)
    # input dims whose sizes vary by draw, and the graph and regions of a draw where they differ
    dynamic: dict[int, set[int]] = field(default_factory=dict)
    alt: tuple[CapturedGraph, list[Region]] | None = None

    def to_dict(self) -> dict[str, Any]:
        total = self.times.total_ms
        return {"model": self.problem.path, "device": self.times.device, "total_ms": total,
                "graph_ms": self.times.graph_ms, "model_ms": self.times.model_ms,
                "ops": len(self.graph.calls()), "regions": len(self.partition.regions),
                "problems": [g.row(total) for g in self.groups],
                "hot": [h.__dict__ for h in hot_regions(self.partition, self.times)], "notes": self.notes}


def plan_model(path: str | Path, device: str, out_dir: Path, budget_s: float = 0.0, min_share: float = MIN_SHARE,
               on_stage: Callable[[str], None] = lambda s: None, overhead_s: float = 0.0) -> ModelPlan:
    """Profile, cut and write the model's problems into ``out_dir``; with a budget, share what the plan left of it
    among them, ``overhead_s`` counted for each run beyond its search (budget.py)."""
    from kernelevolve.profile import profile_problem

    t0 = time.monotonic()
    problem = load_problem(path, device)
    on_stage("capturing the model's graph")
    try:
        graph = capture(problem, origins=True)
    except CaptureError as e:
        at = f" (stopped at {e.where})" if e.where else ""
        raise ModelError(f"{path}: the model could not be captured as a graph{at}: {str(e)[:300]}") from e
    on_stage("cutting it into regions")
    part = partition(graph, problem, device)
    dynamic, seed = dynamic_dims(problem)
    alt = None
    if dynamic:
        try:
            alt_graph = capture(problem, input_seed=seed, origins=True)
            alt = (alt_graph, partition(alt_graph, problem, device).regions)
            resign(part, *alt)
        except CaptureError as e:
            log.info("a second draw could not be captured: %s", e)
    on_stage(f"profiling {len(graph.calls())} ops on {device}")
    times = op_times(graph, device)
    attribute(part, times)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(problem.path).name
    shutil.copy(problem.path, out_dir / source)
    if state_bytes(graph) >= SAVE_STATE_BYTES:
        on_stage(f"saving the model's {state_bytes(graph) / 2**30:.2f} GB of weights for its problem files")
        save_state(out_dir, source)
    else:
        (out_dir / STATE_FILE).unlink(missing_ok=True)  # an earlier plan's, of another model file
    groups, notes = [], list(part.skipped)
    for regions in part.groups().values():
        first = regions[0]
        doc = (f"Region {first.name} of {source}: {first.kind} at {first.where}"
               + (f", and {len(regions) - 1} more alike ({', '.join(r.where for r in regions[1:])[:200]})"
                  if len(regions) > 1 else "") + ".")
        try:
            file = write_region(graph, first, out_dir, source, doc)
        except Exception as e:  # a region that cannot be written stays with the reference; the others go on
            notes.append(f"{first.name} ({first.kind} at {first.where}) not written: {type(e).__name__}: {e}"[:300])
            continue
        groups.append(ProblemGroup(regions, file, sum(r.time_ms for r in regions)))
    # the floor only shares the budget among problems that matter: loading a region file builds the whole model, so
    # the many small problems of a long model (an unrolled RNN's 256 time steps) are not loaded for it
    big = [g for g in groups if times.total_ms > 0 and g.ms / times.total_ms >= min_share]
    on_stage(f"placing {len(big)} problems on the roofline")
    for g in big:
        try:
            g.floor_ms = profile_problem(load_problem(g.path, device), device).floor_ms * len(g.regions)
        except (ProblemError, Exception) as e:  # a region whose file fails to load is a bug: say so, go on
            notes.append(f"{g.name}: {type(e).__name__}: {str(e)[:200]}")
    left = max(budget_s - (time.monotonic() - t0), 0.0) if budget_s > 0 else 0.0
    shares = allocate([Claim(g.name, g.ms, g.floor_ms) for g in groups], times.total_ms, left, min_share,
                      overhead_s=overhead_s)
    for g, s in zip(groups, shares):
        g.share = s
    groups.sort(key=lambda g: -g.ms)
    plan = ModelPlan(problem, graph, part, times, groups, out_dir, notes, dynamic, alt)
    (out_dir / "model_plan.json").write_text(json.dumps(plan.to_dict(), indent=1, default=str))
    return plan


@dataclass(frozen=True)
class RegionOutcome:
    name: str
    run_id: int | None
    best: Path | None  # the problem's best.py
    speedup: float | None  # against the problem's best baseline, from its head-to-head
    why: str
    answer: str = ""  # what best.py is: "candidate", a baseline's name, or "" where nothing ran
    budget_s: float | None = None  # the search budget its run was given as it started
    wall_s: float | None = None  # its run's whole time


def region_config(cfg: Any, budget_s: float, head_to_head: bool = False) -> Any:
    """A problem's run inside a model: its share of the budget, no hardware counters (two ncu passes a problem that
    the model's answer does not use; run a problem file alone with ``kernelevolve optimize`` for them) and, unless
    ``head_to_head``, no head-to-head of its own: the judge's verdict picks the region's kernel, and the whole
    model's head-to-head decides whether it stays (a region's head-to-head costs about as much as its search)."""
    return replace(cfg, time_budget_s=budget_s, counters=False, head_to_head=head_to_head and cfg.head_to_head)


def region_overhead_s(cfg: Any, head_to_head: bool = False) -> float:
    """The first estimate of what a problem's run inside a model (region_config's) spends beyond its search."""
    return run_overhead_s(cfg.device, region_config(cfg, 0.0, head_to_head).head_to_head)


def optimize_regions(plan: ModelPlan, cfg: Any, store: Any, on_stage: Callable[[str], None] = lambda s: None,
                     resume: bool = False, deadline: float | None = None,
                     head_to_head: bool = False) -> list[RegionOutcome]:
    """The operator loop on every problem with a budget, largest first; in parallel over the local GPUs or a Ray
    cluster where there are several (lanes.py). With a ``deadline`` (a time.monotonic() time: the end of the
    model's budget), each run's budget is shared again from what is left as it starts (budget.Pacer).
    ``head_to_head``: each run also holds its own head-to-head (region_config)."""
    from kernelevolve.model.lanes import run_all

    ran = [g for g in plan.groups if g.share is not None and g.share.budget_s > 0]
    jobs = [(g.name, g.path, region_config(cfg, g.share.budget_s, head_to_head), plan.out_dir / g.name) for g in ran]
    labels = {g.name: f"{g.name} ({g.kind} at {g.regions[0].where})" for g in plan.groups}
    pacer = None
    if deadline is not None:
        pacer = Pacer([Claim(g.name, g.ms, g.floor_ms) for g in ran], plan.times.total_ms, deadline,
                      region_overhead_s(cfg, head_to_head))
    done = run_all(jobs, cfg, store, on_stage, labels, resume, pacer)
    out = []
    for g in plan.groups:
        if g.name not in done:
            out.append(RegionOutcome(g.name, None, None, None, g.share.why if g.share else "not planned"))
            continue
        f = done[g.name]
        out.append(RegionOutcome(g.name, f["run_id"], Path(f["best"]) if f["best"] else None, f["speedup"], f["why"],
                                 f["answer"], f.get("budget_s"), f.get("wall_s")))
    return out
