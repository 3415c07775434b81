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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import CANDIDATE, HeadToHead, LABELS
from kernelevolve.model.compose import Chosen, compose
from kernelevolve.model.plan import MIN_SHARE, ModelPlan, RegionOutcome, optimize_regions, plan_model

log = logging.getLogger(__name__)

MODEL_RIVALS = ("eager", "compiled", "max_autotune")


@dataclass
class ModelOutcome:
    plan: ModelPlan
    regions: list[RegionOutcome]
    kept: list[str]  # the problems whose kernels are in best_model.py
    dropped: list[str] = field(default_factory=list)  # one line each: a kernel that left the composition, and why
    status: str = ""  # the composition's verdict (the last one judged)
    head_to_head: HeadToHead | None = None
    best_model: Path | None = None
    why: str = ""  # one line: what best_model.py is

    def to_dict(self) -> dict[str, Any]:
        h = self.head_to_head
        return {"plan": self.plan.to_dict(), "regions": [r.__dict__ | {"best": str(r.best) if r.best else None}
                                                         for r in self.regions],
                "kept": self.kept, "dropped": self.dropped, "status": self.status,
                "head_to_head": h.to_dict() if h is not None else None,
                "best_model": str(self.best_model) if self.best_model else None, "why": self.why}


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
                   on_plan: Callable[[ModelPlan], None] = lambda p: None) -> ModelOutcome:
    """Plan, optimize, compose and judge ``path``'s model; best_model.py and model_report.json go into ``out_dir``
    beside the problem files. Raises ProblemError for a bad file, ModelError for a model that cannot be captured."""
    from kernelevolve.evaluate import Status
    from kernelevolve.optimize import make_evaluator
    from kernelevolve.report import reference_candidate

    plan = plan_model(path, cfg.device, out_dir, budget_s, min_share, on_stage)
    on_plan(plan)
    outcomes = optimize_regions(plan, cfg, store, on_stage)
    chosen = _chosen(plan, outcomes)
    source = plan.problem.source
    evaluator = make_evaluator(plan.problem, replace(cfg, timeout_s=max(cfg.timeout_s, 600.0)),
                               out_dir / ".work" / "model")
    result = ModelOutcome(plan, outcomes, [c.name for c in chosen])
    doc = f"kernelevolve: {Path(plan.problem.path).name} with its regions' kernels"
    while chosen:
        text, skipped = compose(source, plan.graph, chosen, doc, plan.dynamic, plan.alt)
        on_stage(f"judging the model with {len(chosen)} region kernels")
        verdict = evaluator.evaluate(Candidate(text, proposer="compose"))
        result.status = verdict.status.value
        if verdict.status is not Status.OK:
            worst = min(chosen, key=lambda c: _gain(c, plan, outcomes))
            result.dropped.append(f"{worst.name}: the composition was {verdict.status.value} "
                                  f"({verdict.reason[:120]})")
            chosen.remove(worst)
            continue
        if not cfg.head_to_head or cfg.device != "cuda" and not verdict.timed:
            result.why = f"the model with {len(chosen)} region kernels, verified (not timed on {cfg.device})"
            return _finish(result, text, chosen, skipped)
        on_stage("timing it head to head against the whole model")
        h = evaluator.head_to_head(Candidate(text, proposer="compose"), list(rivals))
        result.head_to_head = h
        if h.wins:
            result.why = f"the model with {len(chosen)} region kernels; {h.line()}"
            return _finish(result, text, chosen, skipped)
        worst = min(chosen, key=lambda c: _gain(c, plan, outcomes))
        result.dropped.append(f"{worst.name}: the composition did not beat {LABELS.get(h.best_baseline)} "
                              f"({h.line()[:160]})")
        chosen.remove(worst)
    h = result.head_to_head
    side = h.best_baseline if h is not None and h.answer and h.answer != CANDIDATE else "eager"
    why = "no region kernel made the whole model faster"
    if side == "eager":
        text = reference_candidate(source, why)
    else:
        from kernelevolve.propose.inductor import render
        from kernelevolve.evaluate.headtohead import COMPILE_OPTIONS

        text = render(source, COMPILE_OPTIONS[side], LABELS[side])
    result.why = f"{why}: best_model.py is {'the model itself' if side == 'eager' else LABELS[side] + ' of it'}"
    return _finish(result, text, [], [])


def _finish(result: ModelOutcome, text: str, chosen: list[Chosen], skipped: list[str]) -> ModelOutcome:
    out = result.plan.out_dir
    result.kept = [c.name for c in chosen]
    result.dropped += skipped
    header = f"# {result.why}\n# kept: {', '.join(result.kept) or 'none'}\n"
    path = out / "best_model.py"
    path.write_text(header + text)
    result.best_model = path
    (out / "model_report.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result
