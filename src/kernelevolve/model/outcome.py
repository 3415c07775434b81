"""What a whole-model run answers, and how it is kept: ``ModelOutcome``, the model's own run in the store
(``Record``: each composition judged a node), best_model.py and the report written (``finish``), and the answer
where no composition won (``fallback``: the best baseline's kernel of the whole model)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import CANDIDATE, LABELS, HeadToHead
from kernelevolve.model.plan import ModelPlan, RegionOutcome
from kernelevolve.model.report import write_model_report


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
    # seconds: plan_s, problems_s (their runs), whole_s (judging the compositions), total_s; and the budget given
    phases: dict[str, float] = field(default_factory=dict)
    budget_s: float | None = None
    started: float | None = None  # time.monotonic() as the run began

    def apply(self, model: Any) -> Any:
        """For a live model's run (``kernelevolve.optimize_model(model, inputs)``): best_model.py around ``model``,
        sharing its parameters and buffers."""
        from kernelevolve.problem import import_module_from_path

        if self.best_model is None:
            raise ValueError("the run wrote no best_model.py")
        module = import_module_from_path(self.best_model,
                                         f"_kernelevolve_live_{abs(hash(str(Path(self.best_model).resolve())))}")
        new = module.ModelNew()
        new.model = model  # the saved copy it loaded goes; every kernel reads the live model's tensors
        return new.train(model.training)

    def to_dict(self) -> dict[str, Any]:
        h = self.head_to_head
        return {"run_id": self.run_id, "plan": self.plan.to_dict() if self.plan else None, "parts": self.parts, "regions": [r.__dict__ | {"best": str(r.best) if r.best else None}
                                                         for r in self.regions],
                "kept": self.kept, "dropped": self.dropped, "status": self.status,
                "head_to_head": h.to_dict() if h is not None else None,
                "best_model": str(self.best_model) if self.best_model else None, "why": self.why,
                "waterfall": [asdict(s) for s in self.waterfall],
                "report": str(self.report) if self.report else None, "notes": self.notes,
                "phases": self.phases, "budget_s": self.budget_s}

    def time_line(self) -> str:
        """One line: where the run's time went, against the budget."""
        p = self.phases
        parts = [f"{label} {p[k]:.0f} s" for k, label in (("plan_s", "plan"), ("problems_s", "problem runs"),
                                                         ("whole_s", "judging the whole")) if k in p]
        budget = f" (budget {self.budget_s:.0f} s)" if self.budget_s else ""
        return f"time: {', '.join(parts)}; {p.get('total_s', 0):.0f} s in all{budget}" if parts else ""


class Record:
    """The model's own run in the store, so that show, report, approve and export read it as any run: the
    problem is the model, each composition judged a node (proposer ``compose``), the head-to-head the run's."""

    def __init__(self, store: Any, problem: Any, out_dir: Path, cfg: Any, runs: dict[str, int | None]):
        from kernelevolve.machine import device_key, versions

        self.store, self.problem, self.key = store, problem, device_key(cfg.device)
        config = cfg.to_dict() | {"model": {"report": str(out_dir / "model_report.json"), "regions": runs}}
        self.run_id = store.create_run(problem, cfg.device, self.key, config, versions())
        self.phases: dict[str, float] = {}

    def head_to_head(self, evaluator: Any, candidate: Candidate, rivals: tuple[str, ...], result: ModelOutcome,
                     on_stage: Callable[[str], None], what: str) -> HeadToHead:
        from kernelevolve.evaluate.evaluator import HeadToHeadError

        on_stage(f"timing {what} head to head against the whole model")
        t0 = time.monotonic()
        try:
            h = evaluator.head_to_head(candidate, list(rivals))
        except HeadToHeadError as e:  # a side that cannot be built or timed: the judge's timings stand
            h = HeadToHead.failed(evaluator.config.timing.clock, str(e))
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

    def finish(self, result: ModelOutcome) -> None:
        from kernelevolve.store import now

        fields: dict[str, Any] = {"status": "finished", "finished": now(), "stop_reason": result.why,
                                  "phases": self.phases}
        if result.head_to_head is not None:
            fields["head_to_head"] = result.head_to_head
        self.store.update_run(self.run_id, **fields)


def lost_line(name: str, h: HeadToHead) -> str:
    return f"{name}: the composition did not beat {LABELS.get(h.best_baseline)} ({h.line()[:160]})"


def settle_baselines(result: ModelOutcome, source: str, record: Record, evaluator: Any, rivals: tuple[str, ...],
                     on_stage: Callable[[str], None]) -> None:
    """Where no composition met the whole model head to head (none was chosen, or none verified), the model itself
    meets its torch.compile and max-autotune builds, so that ``fallback`` answers with the fastest of them."""
    from kernelevolve.report import reference_candidate

    if result.head_to_head is not None:
        return
    candidate = Candidate(reference_candidate(source, "the model itself"), proposer="reference",
                          meta={"label": "the model itself"})
    h = record.head_to_head(evaluator, candidate, rivals, result, on_stage, "the model itself")
    if h.error:
        result.notes.append(f"the model's builds were not timed head to head: {h.error[:200]}")
        result.head_to_head = None


def fallback(result: ModelOutcome, source: str, record: Record, why: str) -> ModelOutcome:
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
    return finish(result, text, [], [], record)


def finish(result: ModelOutcome, text: str, chosen: list[Any], skipped: list[str],
           record: Record) -> ModelOutcome:
    """best_model.py (with a header saying what it is), model_report.html and model_report.json."""
    if result.started is not None:
        total = time.monotonic() - result.started
        result.phases["total_s"] = round(total, 1)
        if "problems_s" in result.phases:
            result.phases["whole_s"] = round(max(total - result.phases["plan_s"] - result.phases["problems_s"], 0), 1)
    record.finish(result)
    out = result.out_dir
    result.kept = [c.name for c in chosen]
    result.dropped += skipped
    header = f"# {result.why}\n# kept: {', '.join(result.kept) or 'none'}\n"
    path = out / "best_model.py"
    path.write_text(header + text)
    result.best_model = path
    result.report, result.waterfall, note = write_model_report(result)
    if note:
        result.notes.append(note)
    (out / "model_report.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result
