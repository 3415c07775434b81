"""A whole model in, a verified faster model out.

``optimize_model`` plans the model (plan.py), runs the operator loop on each problem that matters with its share of
the budget, puts the kernels that won back into the model (compose.py) and judges the whole as one candidate against
the model itself: correctness on fresh inputs, the cheat checks, then a head-to-head against the model in eager,
under torch.compile and under max-autotune. Where the composition does not win, the region kernel with the smallest
gain leaves it and the rest is judged again; where none is left, the answer is the best baseline's kernel of the
whole model. The answer is never slower than the best of the three.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import CANDIDATE, HeadToHead, LABELS
from kernelevolve.model.compose import HOSTS, Chosen, compose
from kernelevolve.model.plan import MIN_SHARE, ModelError, ModelPlan, RegionOutcome, optimize_regions, plan_model

log = logging.getLogger(__name__)

MODEL_RIVALS = ("eager", "compiled", "max_autotune")


@dataclass
class ModelOutcome:
    plan: ModelPlan | None  # None where the model was optimized by its parts (parts.py)
    regions: list[RegionOutcome]  # each problem's answer; by parts, each part's
    kept: list[str]  # the problems whose kernels are in best_model.py
    dropped: list[str] = field(default_factory=list)  # one line each: a kernel that left the composition, and why
    status: str = ""  # the composition's verdict (the last one judged)
    head_to_head: HeadToHead | None = None
    best_model: Path | None = None
    why: str = ""  # one line: what best_model.py is
    run_id: int | None = None  # the model's own run in the store: each composition judged is one of its nodes
    baseline: Any = None  # the whole model timed in eager and under torch.compile, where it was timed
    waterfall: list[Any] = field(default_factory=list)  # report.Step rows: time by region, before and after
    report: Path | None = None  # model_report.html
    notes: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    device: str = "cpu"
    parts: list[dict[str, Any]] = field(default_factory=list)  # by parts: each part's paths, time and answer

    def apply(self, model: Any) -> Any:
        """For a live model's run (``kernelevolve.optimize_model(model, inputs)``): best_model.py around ``model``,
        sharing its parameters and buffers."""
        from kernelevolve.model.live import apply

        if self.best_model is None:
            raise ValueError("the run wrote no best_model.py")
        return apply(self.best_model, model)

    def to_dict(self) -> dict[str, Any]:
        h = self.head_to_head
        return {"run_id": self.run_id, "plan": self.plan.to_dict() if self.plan else None, "parts": self.parts, "regions": [r.__dict__ | {"best": str(r.best) if r.best else None}
                                                         for r in self.regions],
                "kept": self.kept, "dropped": self.dropped, "status": self.status,
                "head_to_head": h.to_dict() if h is not None else None,
                "best_model": str(self.best_model) if self.best_model else None, "why": self.why,
                "waterfall": [asdict(s) for s in self.waterfall],
                "report": str(self.report) if self.report else None, "notes": self.notes}


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
                   hosts: tuple[str, ...] | None = None, resume: bool = False) -> ModelOutcome:
    """Plan, optimize, compose and judge ``path``'s model; best_model.py and model_report.json go into ``out_dir``
    beside the problem files. ``hosts``: the compositions judged each round (compose.HOSTS; by default both on a
    GPU, eager on the CPU), the faster verified one going on to the head-to-head. A model that cannot be captured
    as one graph is optimized by its parts that can (parts.py). With ``resume``, problems whose runs finished
    earlier in ``store`` keep their answers and stopped ones go on (lanes.run_all). Raises ProblemError for a bad file, ModelError for
    a model of which no part can be captured."""
    from kernelevolve.optimize import make_evaluator

    hosts = hosts or default_hosts(cfg.device)
    unknown = [h for h in hosts if h not in HOSTS]
    if unknown:
        raise ValueError(f"unknown host {', '.join(unknown)}: one of {', '.join(HOSTS)}")
    try:
        plan = plan_model(path, cfg.device, out_dir, budget_s, min_share, on_stage)
    except ModelError as e:  # not one graph: by its parts that are, where there are some
        from kernelevolve.model.parts import optimize_parts

        return optimize_parts(path, cfg, store, out_dir, budget_s, min_share, rivals, on_stage, hosts, e, resume)
    on_plan(plan)
    outcomes = optimize_regions(plan, cfg, store, on_stage, resume=resume)
    chosen = _chosen(plan, outcomes)
    source = plan.problem.source
    evaluator = make_evaluator(plan.problem, replace(cfg, timeout_s=max(cfg.timeout_s, 600.0)),
                               out_dir / ".work" / "model")
    result = ModelOutcome(plan, outcomes, [c.name for c in chosen], out_dir=out_dir, device=cfg.device)
    record = _Record(store, plan.problem, out_dir, cfg, {o.name: o.run_id for o in outcomes})
    result.run_id = record.run_id
    doc = f"kernelevolve: {Path(plan.problem.path).name} with its regions' kernels"
    try:
        while chosen:
            judged = _judge_hosts(source, plan, chosen, doc, hosts, evaluator, record, result, cfg, on_stage)
            if isinstance(judged, str):  # no host verified: the kernel with the smallest gain goes
                worst = min(chosen, key=lambda c: _gain(c, plan, outcomes))
                result.dropped.append(f"{worst.name}: the composition was {judged}")
                chosen.remove(worst)
                continue
            host, candidate, verdict, skipped = judged
            what = f"the model with {len(chosen)} region kernels"
            if not cfg.head_to_head or cfg.device != "cuda" and not verdict.timed:
                result.why = f"{what}, verified (not timed on {cfg.device}), {host} host"
                return _finish(result, candidate.source, chosen, skipped, record)
            h = record.head_to_head(evaluator, candidate, rivals, result, on_stage, f"it ({host} host)")
            if h.wins:
                result.why = f"{what}, {host} host; {h.line()}"
                return _finish(result, candidate.source, chosen, skipped, record)
            worst = min(chosen, key=lambda c: _gain(c, plan, outcomes))
            result.dropped.append(lost_line(worst.name, h))
            chosen.remove(worst)
    except BaseException:
        store.update_run(record.run_id, status="interrupted", stop_reason="stopped while the model was judged")
        raise
    return fallback(result, source, record, "no region kernel made the whole model faster")


def fallback(result: ModelOutcome, source: str, record: "_Record", why: str) -> ModelOutcome:
    """best_model.py as the best baseline's kernel of the whole model (the model itself where eager is)."""
    from kernelevolve.report import reference_candidate

    h = result.head_to_head
    side = h.best_baseline if h is not None and h.answer and h.answer != CANDIDATE else "eager"
    if side == "eager":
        text = reference_candidate(source, why)
    else:
        from kernelevolve.propose.inductor import render
        from kernelevolve.evaluate.headtohead import COMPILE_OPTIONS

        text = render(source, COMPILE_OPTIONS[side], LABELS[side])
    result.why = f"{why}: best_model.py is {'the model itself' if side == 'eager' else LABELS[side] + ' of it'}"
    return _finish(result, text, [], [], record)


def lost_line(name: str, h: HeadToHead) -> str:
    return f"{name}: the composition did not beat {LABELS.get(h.best_baseline)} ({h.line()[:160]})"


def default_hosts(device: str) -> tuple[str, ...]:
    """Both hosts on a GPU; on the CPU eager only (compiling the whole model twice more costs more than it tells)."""
    return HOSTS if device == "cuda" else ("eager",)


def _label(chosen: list[Chosen], host: str) -> str:
    return f"the model with {len(chosen)} region kernels, {host} host ({', '.join(c.name for c in chosen)})"


def _judge_hosts(source: str, plan: ModelPlan, chosen: list[Chosen], doc: str, hosts: tuple[str, ...],
                 evaluator: Any, record: "_Record", result: "ModelOutcome", cfg: Any,
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


class _Record:
    """The model's own run in the store, so that show, report, approve and export read it as any run: the
    problem is the model, each composition judged a node (proposer ``compose``), the head-to-head the run's."""

    def __init__(self, store: Any, problem: Any, out_dir: Path, cfg: Any, runs: dict[str, int | None]):
        from kernelevolve.machine import device_key, versions

        self.store, self.problem, self.key = store, problem, device_key(cfg.device)
        config = cfg.to_dict() | {"model": {"report": str(out_dir / "model_report.json"), "regions": runs}}
        self.run_id = store.create_run(problem, cfg.device, self.key, config, versions())
        self.phases: dict[str, float] = {}

    def head_to_head(self, evaluator: Any, candidate: Candidate, rivals: tuple[str, ...], result: "ModelOutcome",
                     on_stage: Callable[[str], None], what: str) -> HeadToHead:
        on_stage(f"timing {what} head to head against the whole model")
        t0 = time.monotonic()
        h = evaluator.head_to_head(candidate, list(rivals))
        self.phases["head_to_head_s"] = round(self.phases.get("head_to_head_s", 0.0) + time.monotonic() - t0, 3)
        result.head_to_head = h
        return h

    def baseline(self, evaluator: Any) -> Any:
        t0 = time.monotonic()
        baseline = evaluator.baseline()
        self.phases["baseline_s"] = round(time.monotonic() - t0, 3)
        self.store.update_run(self.run_id, baseline=baseline)
        return baseline

    def node(self, candidate: Candidate, verdict: Any, baseline: Any) -> None:
        node = self.store.add_node(self.run_id, self.problem.sha, self.key, candidate)
        self.store.save_result(node.id, verdict.with_baseline(baseline) if baseline is not None else verdict)

    def finish(self, result: "ModelOutcome") -> None:
        from kernelevolve.store import now

        fields: dict[str, Any] = {"status": "finished", "finished": now(), "stop_reason": result.why,
                                  "phases": self.phases}
        if result.head_to_head is not None:
            fields["head_to_head"] = result.head_to_head
        self.store.update_run(self.run_id, **fields)


def _finish(result: ModelOutcome, text: str, chosen: list[Chosen], skipped: list[str],
            record: _Record) -> ModelOutcome:
    record.finish(result)
    out = result.out_dir
    result.kept = [c.name for c in chosen]
    result.dropped += skipped
    header = f"# {result.why}\n# kept: {', '.join(result.kept) or 'none'}\n"
    path = out / "best_model.py"
    path.write_text(header + text)
    result.best_model = path
    from kernelevolve.model.report import write_model_report

    result.report, result.waterfall, note = write_model_report(result)
    if note:
        result.notes.append(note)
    (out / "model_report.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result
