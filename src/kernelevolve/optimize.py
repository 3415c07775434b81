"""One optimization run end to end: profile, baseline, search, then best.py and report.html."""
from __future__ import annotations

import json
import logging
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import kernelevolve
from kernelevolve.engine import make_pool
from kernelevolve.evaluate import Baseline, EvalConfig, Evaluator, Result, TimingConfig
from kernelevolve.problem import Problem, ProblemError, load_problem
from kernelevolve.propose import make_proposers
from kernelevolve.report import write_report
from kernelevolve.search import SearchConfig, SearchOutcome, best_node, make_selector, run_search
from kernelevolve.store import Store, StoreError, now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimizeConfig:
    device: str = "cpu"
    proposers: tuple[str, ...] = ("template", "inductor")
    selector: str = "greedy"
    max_evals: int = 20
    time_budget_s: float | None = None
    target_speedup: float | None = None
    stall: int | None = 10
    timeout_s: float = 600.0
    workers: int | None = None
    trials: int = 3
    timing_budget_ms: float = 1000.0
    profile: bool = True
    proposer_options: dict[str, Any] = field(default_factory=dict)  # see make_proposers; never holds a key
    executor: str = "local"  # "local" (engine/local.py) or "ray" (engine/ray.py)
    ray_address: str | None = None
    ray_retries: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OptimizeConfig":
        d = dict(d)
        d["proposers"] = tuple(d.get("proposers", ("inductor",)))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class RunOutcome:
    run_id: int
    search: SearchOutcome
    baseline: Baseline | None
    best_result: Result | None
    files: dict[str, Path] = field(default_factory=dict)
    best_why: str = ""  # one line: why best.py is what it is
    phases: dict[str, float] = field(default_factory=dict)  # seconds: profile, baseline, search


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def here(cfg: OptimizeConfig) -> str:
    """Where this process can run the reference: the run's device, or the CPU for a controller without a GPU that
    sends its evaluations to a cluster (the workers run them on the run's device)."""
    if cfg.device == "cuda" and cfg.executor != "local" and not torch.cuda.is_available():
        return "cpu"
    return cfg.device


def device_key(device: str) -> str:
    """What a timing is comparable across: the device model (and index-free)."""
    if device == "cuda":
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"cpu:{platform.machine()}:{platform.processor() or 'cpu'}"


def versions() -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"kernelevolve": kernelevolve.__version__, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version()}


def make_evaluator(problem: Problem, cfg: OptimizeConfig, workdir: Path | None = None) -> Evaluator:
    timing = TimingConfig(budget_ms=cfg.timing_budget_ms)
    return Evaluator(problem, EvalConfig(device=cfg.device, timeout_s=cfg.timeout_s, trials=cfg.trials, timing=timing),
                     workdir)


def optimize(problem_path: str | Path, cfg: OptimizeConfig, store: Store, out_dir: Path, resume: int | str | None = None,
             on_result: Callable[[dict[str, Any], Result], None] | None = None,
             on_stage: Callable[[str], None] = lambda s: None,
             on_run: Callable[[int], None] = lambda run_id: None) -> RunOutcome:
    """Run (or resume) an optimization. Raises ProblemError for a bad problem file, StoreError for a bad run id.
    ``on_run`` gets the run's id as soon as the run exists in the store (created, or taken up again)."""
    if resume is not None:
        run = store.run(resume)
        cfg = OptimizeConfig.from_dict(run["config"])
        problem = load_problem(problem_path, here(cfg))
        if problem.sha != run["problem_sha"]:
            raise ProblemError(problem_path, f"changed since run {run['id']} (hash {problem.short_sha} "
                                             f"!= {run['problem_sha'][:12]}); start a new run")
        run_id = run["id"]
        store.update_run(run_id, status="running")
        pool = make_pool(make_evaluator(problem, cfg, out_dir / ".work" / f"run{run_id}"), cfg.workers, cfg.executor,
                         cfg.ray_address, cfg.ray_retries)
    else:
        problem = load_problem(problem_path, here(cfg))
        make_proposers(list(cfg.proposers), cfg.device, cfg.proposer_options)  # fails before a run is recorded
        (out_dir / ".work").mkdir(parents=True, exist_ok=True)
        pool = make_pool(make_evaluator(problem, cfg, tempfile.mkdtemp(prefix="run-", dir=out_dir / ".work")),
                         cfg.workers, cfg.executor, cfg.ray_address, cfg.ray_retries)
        run_id = store.create_run(problem, cfg.device, pool.device_key(), cfg.to_dict(), versions())
        run = store.run(run_id)
    on_run(run["id"])
    try:
        return _optimize(problem, cfg, store, out_dir, run, pool, on_result, on_stage)
    finally:
        pool.shutdown(wait=False)


def _optimize(problem: Problem, cfg: OptimizeConfig, store: Store, out_dir: Path, run: dict[str, Any], pool: Any,
              on_result: Callable[[dict[str, Any], Result], None] | None,
              on_stage: Callable[[str], None]) -> RunOutcome:
    run_id = run["id"]
    proposers = make_proposers(list(cfg.proposers), cfg.device, cfg.proposer_options)
    phases = dict(run.get("phases") or {})  # seconds; a resumed run keeps its earlier profile and baseline times
    profile = run.get("profile")
    if profile is None and cfg.profile and here(cfg) != cfg.device:
        log.warning("no profile: the reference runs on %s workers, and this machine has no %s", cfg.device, cfg.device)
    elif profile is None and cfg.profile:
        on_stage("profiling the reference")
        t0 = time.monotonic()
        profile = _profile(problem, cfg.device)
        phases["profile_s"] = round(time.monotonic() - t0, 3)
        if profile is not None:
            store.update_run(run_id, profile=_json(profile))
    baseline = Baseline.from_json(_json(run["baseline"])) if run.get("baseline") else None
    if baseline is None:
        on_stage("timing the reference: eager and torch.compile")
        t0 = time.monotonic()
        baseline = pool.baseline()
        phases["baseline_s"] = round(time.monotonic() - t0, 3)
        store.update_run(run_id, baseline=baseline.to_json())
    store.update_run(run_id, phases=_json(phases))
    on_stage("searching")
    t0 = time.monotonic()
    try:
        outcome = run_search(store, run_id, problem, cfg.device, run["device_key"], pool,
                             proposers, make_selector(cfg.selector),
                             SearchConfig(cfg.max_evals, cfg.time_budget_s, cfg.target_speedup, cfg.stall), baseline,
                             profile, on_result)
    except KeyboardInterrupt:
        store.update_run(run_id, status="interrupted", stop_reason="interrupted; resume with --resume")
        pool.shutdown(wait=False)
        raise
    pool.shutdown()
    phases["search_s"] = round(phases.get("search_s", 0.0) + time.monotonic() - t0, 3)
    if outcome.first_proposal_s is not None:
        phases["first_proposal_s"] = outcome.first_proposal_s
    store.update_run(run_id, status="finished", finished=now(), stop_reason=outcome.stop_reason, phases=_json(phases))
    store.record_experience(run_id)
    best = outcome.best["result"].with_baseline(baseline) if outcome.best else None
    files, why = write_outputs(store, run_id, out_dir)
    return RunOutcome(run_id, outcome, baseline, best, files, why, phases)


def _json(value: Any) -> str:
    return json.dumps(value)


def _profile(problem: Problem, device: str) -> dict[str, Any] | None:
    from kernelevolve.profile import ProfileError, profile_problem

    try:
        return profile_problem(problem, device).to_dict()
    except (ProfileError, RuntimeError) as e:
        log.warning("profiling failed: %s", e)
        return None


def report_view(store: Store, run_id: int | str) -> dict[str, Any]:
    """Everything the HTML report shows, from the store alone."""
    run = store.run(run_id)
    problem = store.problem_source(run["problem_sha"])
    baseline = Baseline.from_json(_json(run["baseline"])) if run.get("baseline") else None
    history = store.nodes(run["id"])
    best, why = best_node(history)
    nodes = [_node_view(n, baseline) for n in history]
    versions_ = run.get("versions") or {}
    return {
        "run": {"id": run["id"], "device": run["device_key"], "status": run["status"], "created": run["created"],
                "finished": run["finished"], "config": run["config"], "stop_reason": run.get("stop_reason"),
                "kernelevolve_version": versions_.get("kernelevolve"), "torch_version": versions_.get("torch"),
                "triton_version": versions_.get("triton")},
        "problem": {"name": problem["name"], "path": problem["path"], "sha": problem["sha"], "source": problem["source"]},
        "profile": run.get("profile"),
        "baseline": None if baseline is None else {
            "eager_ms": baseline.eager.median_ms if baseline.eager else None,
            "compile_ms": baseline.compiled.median_ms if baseline.compiled else None,
            "compile_s": baseline.compile_s, "error": baseline.error},
        "best": _best_view(best, why, baseline, problem["source"], history, run.get("stop_reason")),
        "phases": run.get("phases") or {},
        "nodes": nodes,
        "llm_usage": store.llm_usage(run["id"]),
        "approvals": store.approvals(run["id"]),
    }


REFERENCE_CANDIDATE = '''"""The reference itself: {why}."""
{source}


class ModelNew(Model):
    pass
'''


UNBEATEN = "no candidate of this run beat eager PyTorch on this device"


def reference_candidate(source: str, why: str = UNBEATEN) -> str:
    """A candidate file that is the problem's reference itself (``class ModelNew(Model)``)."""
    return REFERENCE_CANDIDATE.format(why=why, source=source.rstrip())


def _best_view(best: dict[str, Any] | None, why: str, baseline: Baseline | None, source: str,
               history: Sequence[dict[str, Any]] = (), stop_reason: str | None = None) -> dict[str, Any]:
    """The best node, or the reference itself when no candidate was verified or the fastest is slower than eager:
    every run answers with a kernel, and says why in one line."""
    if best is None:
        judged = [n for n in history if n["result"] is not None]
        if judged:
            counts: dict[str, int] = {}
            for n in judged:
                counts[n["result"].status.value] = counts.get(n["result"].status.value, 0) + 1
            what = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            why = f"no candidate was verified ({len(judged)} evaluated: {what})"
        else:
            why = "no candidate was evaluated" + (f" (stopped: {stop_reason})" if stop_reason else "")
        return {"node": None, "reference": True, "why": f"{why}: best.py is the reference itself",
                "source": reference_candidate(source, why)}
    eager = baseline.eager.median_ms if baseline is not None and baseline.eager else None
    r = best["result"]
    if eager is not None and r.timed and r.runtime_ms is not None and r.runtime_ms > eager:
        return {"node": None, "reference": True, "source": reference_candidate(source),
                "why": f"no candidate beat eager ({eager:.4g} ms; the fastest took {r.runtime_ms:.4g} ms, node "
                       f"{best['id']}): best.py is the reference itself"}
    return {"node": best["id"], "source": best["source"], "why": why}


def _node_view(node: dict[str, Any], baseline: Baseline | None) -> dict[str, Any]:
    r = node["result"].with_baseline(baseline) if node["result"] else None
    return {"id": node["id"], "parent": node["parent"], "proposer": node["proposer"], "language": node["language"],
            "sha": node["sha"], "status": r.status.value if r else "pending", "reason": _reason(r),
            "runtime_ms": r.runtime_ms if r else None, "timed": bool(r and r.timed),
            "speedup_eager": r.speedup_eager if r else None, "speedup_compile": r.speedup_compile if r else None,
            "compile_s": r.compile_s if r else None, "load_s": r.load_s if r else None,
            "wall_s": r.wall_s if r else None, "created": node["created"], "cached": node["cached"],
            "meta": node["meta"], "error": (r.error if r else "") or "", "source": node["source"]}


def _reason(r: Result | None) -> str:
    if r is None:
        return ""
    suspect = r.details.get("suspect")
    return f"{r.reason}; SUSPECT: {suspect}" if suspect else r.reason


def write_outputs(store: Store, run_id: int, out_dir: Path) -> tuple[dict[str, Path], str]:
    """Write best.py (the best verified candidate, else the reference itself) and report.html into ``out_dir``;
    return the files and the one line that says why best.py is what it is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    view = report_view(store, run_id)
    files = {"report": write_report(view, out_dir / "report.html")}
    best = view["best"]
    path = out_dir / "best.py"
    path.write_text(best["source"])
    files["best"] = path
    return files, best["why"]


__all__ = ["OptimizeConfig", "RunOutcome", "StoreError", "default_device", "optimize", "report_view",
           "write_outputs"]
