"""One optimization run end to end: profile, baseline, search, then best.py and report.html."""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate, Meta
from kernelevolve.engine import make_pool
from kernelevolve.evaluate import Baseline, Result, make_evaluator
from kernelevolve.evaluate.headtohead import LABELS, HeadToHead
from kernelevolve.evaluate.screen import ScreenConfig
from kernelevolve.problem import Problem, ProblemError, load_problem
from kernelevolve.profile import Profile, ProfileError, profile_problem
from kernelevolve.propose import make_proposers
from kernelevolve.propose.start import NAME as START
from kernelevolve.propose.start import StartProposer
from kernelevolve.machine import here, versions
from kernelevolve.report import write_outputs
from kernelevolve.rows import Node, Run
from kernelevolve.search import SearchConfig, SearchOutcome, make_selector, run_search
from kernelevolve.search.protocols import RunPool
from kernelevolve.settings import BASELINES, OptimizeConfig
from kernelevolve.store import Store, StoreError, now

log = logging.getLogger(__name__)


class StartError(Exception):
    """A start kernel the judge did not verify: the user asked to improve it, and it is wrong (one line)."""


@dataclass
class RunOutcome:
    run_id: int
    search: SearchOutcome
    baseline: Baseline | None
    best_result: Result | None
    files: dict[str, Path] = field(default_factory=dict)
    best_why: str = ""  # one line: why best.py is what it is
    phases: dict[str, float] = field(default_factory=dict)  # seconds: profile, baseline, search
    starts: list[Node] = field(default_factory=list)  # the start kernels, judged
    head_to_head: HeadToHead | None = None  # the winner against the baselines: the speedups the run reports


def optimize(problem_path: str | Path, cfg: OptimizeConfig, store: Store, out_dir: Path, resume: int | str | None = None,
             on_result: Callable[[Node, Result], None] | None = None,
             on_stage: Callable[[str], None] = lambda s: None,
             on_run: Callable[[int], None] = lambda run_id: None,
             on_screen: Callable[[int, int], None] | None = None,
             new_options: dict[str, Any] | None = None) -> RunOutcome:
    """Run (or resume) an optimization. Raises ProblemError for a bad problem file, StoreError for a bad run id.
    ``on_run`` gets the run's id as soon as the run exists in the store (created, or taken up again). A resumed run
    keeps its stored configuration, but for ``new_options``: proposer options given anew (a larger model budget),
    which are stored with it."""
    if resume is not None:
        run = store.run(resume)
        cfg = OptimizeConfig.from_dict(run.config)
        if new_options:
            cfg = replace(cfg, proposer_options={**cfg.proposer_options, **new_options})
            store.update_run(run.id, config=cfg.to_dict())
            run = store.run(run.id)
        problem = load_problem(problem_path, here(cfg.device, cfg.executor))
        if problem.sha != run.problem_sha:
            raise ProblemError(problem_path, f"changed since run {run.id} (hash {problem.short_sha} "
                                             f"!= {run.problem_sha[:12]}); start a new run")
        run_id = run.id
        store.update_run(run_id, status="running")
        pool = make_pool(make_evaluator(problem, cfg, out_dir / ".work" / f"run{run_id}"), cfg.workers, cfg.executor,
                         cfg.ray_address, cfg.ray_retries, _screen_config(cfg))
    else:
        problem = load_problem(problem_path, here(cfg.device, cfg.executor))
        make_proposers(list(cfg.proposers), cfg.device, cfg.proposer_options)  # fails before a run is recorded
        (out_dir / ".work").mkdir(parents=True, exist_ok=True)
        pool = make_pool(make_evaluator(problem, cfg, tempfile.mkdtemp(prefix="run-", dir=out_dir / ".work")),
                         cfg.workers, cfg.executor, cfg.ray_address, cfg.ray_retries, _screen_config(cfg))
        run_id = store.create_run(problem, cfg.device, pool.device_key(), cfg.to_dict(), versions())
        run = store.run(run_id)
    on_run(run.id)
    try:
        return _optimize(problem, cfg, store, out_dir, run, pool, on_result, on_stage, on_screen)
    finally:
        pool.shutdown(wait=False)


def _optimize(problem: Problem, cfg: OptimizeConfig, store: Store, out_dir: Path, run: Run, pool: RunPool,
              on_result: Callable[[Node, Result], None] | None,
              on_stage: Callable[[str], None], on_screen: Callable[[int, int], None] | None = None) -> RunOutcome:
    run_id = run.id
    proposers = make_proposers(list(cfg.proposers), cfg.device, cfg.proposer_options)
    if cfg.starts and not any(p.name == START for p in proposers):
        proposers.append(StartProposer(cfg.device))
    phases = dict(run.phases)  # seconds; a resumed run keeps its earlier profile and baseline times
    profile = run.profile
    if profile is None and cfg.profile and here(cfg.device, cfg.executor) != cfg.device:
        log.warning("no profile: the reference runs on %s workers, and this machine has no %s", cfg.device, cfg.device)
    elif profile is None and cfg.profile:
        on_stage("profiling the reference")
        t0 = time.monotonic()
        profile = _profile(problem, cfg.device)
        phases["profile_s"] = round(time.monotonic() - t0, 3)
        if profile is not None:
            store.update_run(run_id, profile=profile)
    starts = _judge_starts(problem, cfg, store, run, pool, on_stage, on_result)  # a wrong one ends the run at once
    baseline = run.baseline
    if baseline is None:
        on_stage("timing the reference: eager and torch.compile")
        t0 = time.monotonic()
        baseline = pool.baseline()
        phases["baseline_s"] = round(time.monotonic() - t0, 3)
        store.update_run(run_id, baseline=baseline)
    store.update_run(run_id, phases=phases)
    starts = [replace(n, result=n.result.with_baseline(baseline)) for n in starts]
    profile = _diagnose(problem, cfg, profile, [("reference", None), *((f"start: {n.meta['start']}", n.source)
                                                                          for n in starts)], on_stage)
    if profile is not None:
        store.update_run(run_id, profile=profile)
    on_stage("searching")
    t0 = time.monotonic()
    try:
        outcome = run_search(store, run_id, problem, cfg.device, run.device_key, pool,
                             proposers, make_selector(cfg.selector),
                             SearchConfig(cfg.max_evals, cfg.time_budget_s, cfg.target_speedup, cfg.stall,
                                          screen_batch=cfg.screen_size(), finalists=cfg.finalists,
                                          backup_agree=cfg.backup_agree, max_screened=cfg.max_screened,
                                          screen_share=cfg.screen_share,
                                          closing=cfg.closing), baseline,
                             profile, on_result, on_screen)
    except KeyboardInterrupt:
        store.update_run(run_id, status="interrupted", stop_reason="interrupted; resume with --resume")
        pool.shutdown(wait=False)
        raise
    phases["search_s"] = round(phases.get("search_s", 0.0) + time.monotonic() - t0, 3)
    if outcome.first_proposal_s is not None:
        phases["first_proposal_s"] = outcome.first_proposal_s
    h2h = None
    if cfg.head_to_head:
        t0 = time.monotonic()
        h2h = _head_to_head(outcome.best, baseline, cfg.rivals, pool, on_stage)
        if h2h is not None:
            phases["head_to_head_s"] = round(time.monotonic() - t0, 3)
            store.update_run(run_id, head_to_head=h2h)
    pool.shutdown()
    if outcome.best is not None and not outcome.best.meta.get("start"):
        lost = h2h is not None and not h2h.error and not h2h.wins  # best.py is then a baseline's kernel
        label = Profile.counters_key(outcome.best.id, lost)
        profile = _diagnose(problem, cfg, profile, [(label, outcome.best.source)], on_stage)
        if profile is not None:
            store.update_run(run_id, profile=profile)
    store.update_run(run_id, status="finished", finished=now(), stop_reason=outcome.stop_reason, phases=phases)
    store.record_experience(run_id)
    best = outcome.best.result.with_baseline(baseline) if outcome.best and outcome.best.result else None
    files, why = write_outputs(store, run_id, out_dir)
    return RunOutcome(run_id, outcome, baseline, best, files, why, phases, starts, h2h)


def _head_to_head(best: Node | None, baseline: Baseline | None, rivals: tuple[str, ...], pool: RunPool,
                  on_stage: Callable[[str], None]) -> HeadToHead | None:
    """The winner and its rivals in interleaved rounds, where there is a timed winner and a timed baseline."""
    timed = [b for b in BASELINES if baseline is not None and getattr(baseline, b) is not None]
    sides = [b for b in rivals if b in timed or b not in BASELINES]
    if not timed:
        return None
    if best is None or best.result is None or not best.result.timed or not sides:
        return None
    on_stage("head to head: the winner against " + " and ".join(LABELS[b] for b in sides))
    h2h = pool.head_to_head(best.candidate(), sides)
    log.info("%s", h2h.line())
    return h2h


def _diagnose(problem: Problem, cfg: OptimizeConfig, profile: Profile | None,
              targets: list[tuple[str, str | None]], on_stage: Callable[[str], None]) -> Profile | None:
    """The profile with the hardware counters of each target (label, candidate source or None for the reference)
    added, on CUDA with ncu; a target ncu cannot read gets its one-line reason instead. Without ncu the profile says
    so once and is otherwise unchanged."""
    from kernelevolve.counters import CountersError, diagnose, ncu_path

    if not cfg.counters or cfg.device != "cuda" or profile is None:
        return profile
    counters = dict(profile.counters)
    if ncu_path() is None:
        note = "ncu is not on the PATH: no hardware counters (the torch profiler's profile stands)"
        return profile if note in profile.notes else replace(profile, notes=[*profile.notes, note])
    import torch

    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else None
    for label, source in targets:
        if label in counters:  # a resumed run read it already
            continue
        on_stage(f"reading hardware counters: {label}")
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            if source is not None:
                f.write(source)
        try:
            kernels = diagnose(problem.path, "cuda", f.name if source is not None else None, major=major)
            counters[label] = {"kernels": [k.to_dict() for k in kernels]}
        except CountersError as e:
            counters[label] = {"error": str(e)}
        finally:
            Path(f.name).unlink(missing_ok=True)
    return replace(profile, counters=counters)


def _judge_starts(problem: Problem, cfg: OptimizeConfig, store: Store, run: Run, pool: RunPool,
                  on_stage: Callable[[str], None], on_result: Callable[[Node, Result], None] | None) -> list[Node]:
    """Judge each start kernel before the baselines and the search (a resumed run's are judged already): each
    becomes a root of the tree. One that fails the judge ends the run with StartError."""
    if not cfg.starts:
        return []
    on_stage("judging the start kernels")
    # this run's own start nodes (a resumed run's), by name and source: never a kernel seeded from another run
    known = {(n.meta["start"], n.sha): n for n in store.nodes(run.id)
             if n.proposer == START and n.meta.get("start") and not n.meta.get("reused")}
    roots = []
    for start in cfg.starts:
        node = known.get((start["name"], Candidate(start["source"]).sha))
        if node is None:
            cand = Candidate(start["source"], proposer=START, meta=Meta(label=f"start: {start['name']}",
                                                                        start=start["name"]))
            node = store.add_node(run.id, problem.sha, run.device_key, cand)
        if node.result is None:  # not judged here before, nor this source elsewhere for this problem and device
            node = replace(node, result=pool.submit(node.candidate()).result())
            store.save_result(node.id, node.result)
            if on_result is not None:
                on_result(node, node.result)
        result = node.result
        if not result.ok:
            why = f"{start['name']}: the start kernel failed the judge: {result.status.value}: {result.reason}"
            store.update_run(run.id, status="failed", finished=now(), stop_reason=why)
            raise StartError(why.splitlines()[0][:500])
        roots.append(node)
    return roots


def _screen_config(cfg: OptimizeConfig) -> ScreenConfig:
    return ScreenConfig(timeout_s=cfg.screen_timeout_s)


def _profile(problem: Problem, device: str) -> Profile | None:
    try:
        return profile_problem(problem, device)
    except (ProfileError, RuntimeError) as e:
        log.warning("profiling failed: %s", e)
        return None


__all__ = ["OptimizeConfig", "RunOutcome", "StartError", "StoreError", "make_evaluator", "optimize"]
