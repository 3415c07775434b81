"""A whole model in, a verified faster model out.

``optimize_model`` plans the model (plan.py), runs the operator loop on each problem that matters with its share of
the budget, puts the kernels that won back into the model (compose.py) and judges the whole as one candidate against
the model itself: correctness on fresh inputs, the cheat checks, then a head-to-head against the model in eager,
under torch.compile and under max-autotune. Where the composition does not win, the region kernel with the smallest
gain leaves it and the rest is judged again; where none is left, the answer is the best baseline's kernel of the
whole model. The answer is never slower than the best of the three.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import LABELS, HeadToHead, carried
from kernelevolve.model.budget import closing_s
from kernelevolve.model.compose import HOSTS, Chosen, compose
from kernelevolve.model.outcome import ModelOutcome, Record, fallback, finish, lost_line, settle_baselines
from kernelevolve.model.plan import (MIN_SHARE, ModelError, ModelPlan, RegionOutcome, optimize_regions, plan_model,
                                     region_overhead_s)

log = logging.getLogger(__name__)

MODEL_RIVALS = ("eager", "compiled", "max_autotune")


def _chosen(plan: ModelPlan, outcomes: list[RegionOutcome]) -> list[Chosen]:
    """The problems whose run answered with a kernel faster than the region's own code."""
    by_name = {g.name: g for g in plan.groups}
    out = []
    for o in outcomes:
        if o.best is None or o.answer in (None, "", "eager"):
            continue
        g = by_name[o.name]
        out.append(Chosen(o.name, g.regions, o.best.read_text(),
                          f"run {o.run_id}, {LABELS.get(o.answer, o.answer)}, "
                          f"{o.speedup:.2f}x its best baseline" if o.speedup else f"run {o.run_id}"))
    return out


def _gain(c: Chosen, plan: ModelPlan, outcomes: list[RegionOutcome]) -> float:
    """The time a kernel saves the model, by its run's own figures: the region's time less it over its speedup."""
    o = next(o for o in outcomes if o.name == c.name)
    g = next(g for g in plan.groups if g.name == c.name)
    return g.ms * (1 - 1 / o.speedup) if o.speedup else 0.0


def optimize_model(path: str | Path, cfg: Any, store: Any, out_dir: Path, budget_s: float,
                   min_share: float = MIN_SHARE, rivals: tuple[str, ...] = MODEL_RIVALS,
                   on_stage: Callable[[str], None] = lambda s: None,
                   on_plan: Callable[[ModelPlan], None] = lambda p: None,
                   hosts: tuple[str, ...] | None = None, resume: bool = False,
                   region_head_to_head: bool = False) -> ModelOutcome:
    """Plan, optimize, compose and judge ``path``'s model; best_model.py and model_report.json go into ``out_dir``
    beside the problem files. ``hosts``: the compositions judged each round (compose.HOSTS; by default both on a
    GPU, eager on the CPU), the faster verified one going on to the head-to-head. A model that cannot be captured
    as one graph is optimized by its parts that can (parts.py). With ``resume``, problems whose runs finished
    earlier in ``store`` keep their answers and stopped ones go on (lanes.run_all). ``region_head_to_head``: each
    problem's run holds a head-to-head of its own too (plan.region_config). Raises ProblemError for a bad file, ModelError for
    a model of which no part can be captured."""
    from kernelevolve.optimize import make_evaluator

    t0 = time.monotonic()
    hosts = hosts or default_hosts(cfg.device)
    unknown = [h for h in hosts if h not in HOSTS]
    if unknown:
        raise ValueError(f"unknown host {', '.join(unknown)}: one of {', '.join(HOSTS)}")
    # judging the whole comes out of the budget too: its estimate is kept back from the problems
    closing = min(closing_s(cfg.device, len(hosts), cfg.head_to_head), budget_s)
    try:
        plan = plan_model(path, cfg.device, out_dir, budget_s - closing, min_share, on_stage,
                          region_overhead_s(cfg, region_head_to_head))
    except ModelError as e:  # not one graph: by its parts that are, where there are some
        from kernelevolve.model.parts import optimize_parts

        return optimize_parts(path, cfg, store, out_dir, budget_s, min_share, rivals, on_stage, hosts, e, resume,
                              functools.partial(optimize_model, region_head_to_head=region_head_to_head))
    on_plan(plan)
    phases = {"plan_s": round(time.monotonic() - t0, 1)}
    if closing:
        on_stage(f"{closing:.0f} s of the {budget_s:.0f} s budget kept for judging the whole model")
    outcomes = optimize_regions(plan, cfg, store, on_stage, resume=resume, deadline=t0 + budget_s - closing,
                                head_to_head=region_head_to_head)
    phases["problems_s"] = round(time.monotonic() - t0 - phases["plan_s"], 1)
    chosen = _chosen(plan, outcomes)
    source = plan.problem.source
    evaluator = make_evaluator(plan.problem, replace(cfg, timeout_s=max(cfg.timeout_s, 600.0)),
                               out_dir / ".work" / "model")
    result = ModelOutcome(plan, outcomes, [c.name for c in chosen], out_dir=out_dir, device=cfg.device,
                          phases=phases, budget_s=budget_s, started=t0)
    record = Record(store, plan.problem, out_dir, cfg, {o.name: o.run_id for o in outcomes})
    result.run_id = record.run_id
    doc = f"kernelevolve: {Path(plan.problem.path).name} with its regions' kernels"
    judge = functools.partial(_judge_hosts, source, plan, doc=doc, hosts=hosts, evaluator=evaluator, record=record,
                              result=result, cfg=cfg, on_stage=on_stage)
    own_ms: dict[str, float] = {}  # the model's own forward by the profiler, once a run (_where_it_lost)
    # after a loss, later compositions meet the fastest build of the first head-to-head alone (the others carried)
    first: HeadToHead | None = None
    try:
        judged: tuple[str, Candidate, Any, list[str]] | str | None = None
        while chosen:
            judged = judged or judge(chosen)
            if isinstance(judged, str):  # no host verified: find the kernels that break the model
                chosen, judged = _isolate(chosen, judged, judge, lambda c: _gain(c, plan, outcomes), result)
                continue
            host, candidate, verdict, skipped = judged
            what = f"the model with {len(chosen)} region kernels"
            if not cfg.head_to_head or cfg.device != "cuda" and not verdict.timed:
                result.why = f"{what}, verified (not timed on {cfg.device}), {host} host"
                return finish(result, candidate.source, chosen, skipped, record)
            h = record.head_to_head(evaluator, candidate, (first.best_baseline,) if first else rivals, result,
                                    on_stage, f"it ({host} host)")
            if first is not None:
                h = result.head_to_head = carried(h, first)
            if h.error:
                result.why = f"{what}, verified, {host} host; the head-to-head could not be held ({h.error[:160]})"
                result.head_to_head = None
                return finish(result, candidate.source, chosen, skipped, record)
            if h.wins:
                result.why = f"{what}, {host} host; {h.line()}"
                return finish(result, candidate.source, chosen, skipped, record)
            result.notes.append(_where_it_lost(candidate, chosen, out_dir, cfg.device, own_ms, h.ms))
            if first is None:
                first = h
            worst = min(chosen, key=lambda c: (_gain(c, plan, outcomes), c.name))
            result.dropped.append(lost_line(worst.name, h))
            chosen.remove(worst)
            judged = None
    except BaseException:
        store.update_run(record.run_id, status="interrupted", stop_reason="stopped while the model was judged")
        raise
    if cfg.head_to_head:
        settle_baselines(result, source, record, evaluator, rivals, on_stage)
    return fallback(result, source, record, "no region kernel made the whole model faster")


def _where_it_lost(candidate: Candidate, chosen: list[Chosen], out_dir: Path, device: str,
                   own: dict[str, float], call_ms: dict[str, float] | None = None) -> str:
    """One line on a composition that lost its head-to-head: its kernels' time in one call by the profiler (device
    time on a GPU), the whole's and each chosen problem's, beside the model's own forward in the same file (``own``,
    filled on the first loss and kept for the next). Less device time than the model with a slower call (the
    head-to-head's medians, ``call_ms``: its "candidate" and the model's "eager") is a loss on the host (launches,
    Python); more is the kernels'."""
    from kernelevolve.model.profile import WHOLE, composed_times

    path = out_dir / ".work" / "lost.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(candidate.source)
    region_of = {f"_ke_{r.name}": c.name for c in chosen for r in c.regions}
    what = "device time" if device == "cuda" else "CPU time"
    try:
        new = composed_times(path, region_of, device)
        if WHOLE not in own:
            own[WHOLE] = composed_times(path, {}, device, cls="Model").get(WHOLE, 0.0)
    except Exception as e:  # a note the less, never a failed run
        return f"the composition that lost could not be profiled: {type(e).__name__}: {str(e)[:160]}"
    kernels = ", ".join(f"{c.name} {new.get(c.name, 0.0):.4f} ms" for c in chosen)
    line = (f"the composition that lost, by the profiler: {new.get(WHOLE, 0.0):.4f} ms of {what} a call against "
            f"{own.get(WHOLE, 0.0):.4f} ms for the model's own forward (its kernels: {kernels})")
    calls = call_ms or {}
    if device == "cuda" and 0 < new.get(WHOLE, 0.0) < own.get(WHOLE, 0.0) and \
            calls.get("candidate", 0.0) > calls.get("eager", float("inf")):
        line += (f"; its call took {calls['candidate']:.4f} ms against the model's {calls['eager']:.4f} ms: less "
                 "device time and a slower call, so it lost on the host (launches, Python), not in its kernels")
    return line


def _isolate(chosen: list[Chosen], failed: str, judge: Callable[[list[Chosen]], Any],
             gain: Callable[[Chosen], float], result: ModelOutcome) -> tuple[list[Chosen], Any]:
    """The composition of every chosen kernel failed (``failed`` says how): the kernels go back one at a time, the
    largest gain first, and each stays only if the composition with it still verifies. A kernel that breaks the
    model goes, and no other goes with it. Returns the kernels kept and the verdict of their composition (None where
    none is kept)."""
    if len(chosen) == 1:
        result.dropped.append(f"{chosen[0].name}: the composition was {failed}")
        return [], None
    kept: list[Chosen] = []
    last = None
    for c in sorted(chosen, key=lambda c: (-gain(c), c.name)):
        judged = judge([x for x in chosen if x in kept or x is c])  # in the plan's order
        if isinstance(judged, str):
            result.dropped.append(f"{c.name}: the composition was {judged}")
        else:
            kept.append(c)
            last = judged
    return [c for c in chosen if c in kept], last


def default_hosts(device: str) -> tuple[str, ...]:
    """Both hosts on a GPU; on the CPU eager only (compiling the whole model twice more costs more than it tells)."""
    return HOSTS if device == "cuda" else ("eager",)


def _label(chosen: list[Chosen], host: str) -> str:
    return f"the model with {len(chosen)} region kernels, {host} host ({', '.join(c.name for c in chosen)})"


def _judge_hosts(source: str, plan: ModelPlan, chosen: list[Chosen], doc: str, hosts: tuple[str, ...],
                 evaluator: Any, record: Record, result: ModelOutcome, cfg: Any,
                 on_stage: Callable[[str], None]) -> tuple[str, Candidate, Any, list[str]] | str:
    """Each host's composition judged (a node each); the verified one with the fastest call goes on, else a line
    saying what went wrong with the first."""
    from kernelevolve.evaluate import Status

    passed, failed = [], []
    for host in hosts:
        text, skipped = compose(source, plan.graph, chosen, doc, plan.dynamic, plan.alt, host)
        on_stage(f"judging the model with {len(chosen)} region kernels ({host} host)")
        candidate = Candidate(text, proposer="compose", meta={"label": _label(chosen, host)})
        verdict = evaluator.evaluate(candidate)
        if verdict.status is Status.OK and verdict.timed and cfg.head_to_head and result.baseline is None:
            on_stage("timing the whole model: eager and torch.compile")
            result.baseline = record.baseline(evaluator)
        record.node(candidate, verdict, result.baseline)
        if verdict.status is Status.OK:
            passed.append((host, candidate, verdict, skipped))
        else:
            failed.append((verdict.status.value, f"{verdict.status.value} with the {host} host "
                                                 f"({verdict.reason[:120]})"))
    result.status = "ok" if passed else failed[0][0]
    if not passed:
        return failed[0][1]
    result.notes += [f"the composition was {line}" for _, line in failed]
    return min(passed, key=lambda p: p[2].runtime_ms if p[2].timed and p[2].runtime_ms else float("inf"))


