"""Benchmark suite: every problem in bench/problems timed eager, under torch.compile and max-autotune, then optimized.

    PYTHONPATH=src python3 bench/suite.py --device cuda --gpus 8 --budget-s 300 --json bench/results/suite.json
    TRITON_INTERPRET=1 python3 bench/suite.py --device cpu --small --problems softmax_bf16 layernorm --budget-s 20
    PYTHONPATH=src python3 bench/suite.py --device cuda --budget-s 40 --again-s 120   # two budgets, one set of baselines

All timings come from the project's own Evaluator, so the baselines and the optimized kernels are measured by the same
harness. Each row is written to the JSON as soon as its problem finishes: a run killed by a time limit keeps every
finished row. With --gpus N the problems are split across N processes, one GPU each.
"""
from __future__ import annotations

import argparse
import ast
import datetime as dt
import fnmatch
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBLEMS = HERE / "problems"
EXCLUDE = {"scale_bias_relu.py"}  # the harness-overhead problem, not a benchmark
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
SUSPECT_SPEEDUP = 10.0


class SuiteError(Exception):
    pass


@dataclass(frozen=True)
class SuiteConfig:
    device: str
    proposers: tuple[str, ...]
    budget_s: float
    max_evals: int
    timing_budget_ms: float
    small: bool
    out_dir: Path
    json_path: Path
    again_s: float | None = None  # a second budget, run from the first run's profile and baselines
    defaults: bool = False  # the CLI's own limits instead of the budget: no time budget, --max-evals 20, --stall 10
    max_autotune: bool = True  # judge the max-autotune baseline before each run (its compile costs 20-40 s on a GPU)
    deadline_s: float | None = None  # start no problem after this many seconds (a later call goes on with --resume)
    resume: bool = False  # keep the rows already in the JSON files and run only the problems they lack

    def optimize_config(self, budget_s: float | None) -> Any:
        from kernelevolve.optimize import OptimizeConfig

        # no hardware counters: ncu's replays would add device time to every problem, and the suite measures search
        # the head-to-head meets max-autotune too where the suite times it: every speedup of a row from its rounds
        rivals = ("eager", "compiled", "max_autotune") if self.max_autotune else ("eager", "compiled")
        if self.defaults:
            return OptimizeConfig(device=self.device, proposers=self.proposers, timing_budget_ms=self.timing_budget_ms,
                                  counters=False, rivals=rivals)
        return OptimizeConfig(device=self.device, proposers=self.proposers, max_evals=self.max_evals,
                              time_budget_s=budget_s, stall=None, timing_budget_ms=self.timing_budget_ms,
                              counters=False, rivals=rivals)


_REFERENCE: dict[str, tuple[Any, Any]] = {}  # problem stem -> the max-autotune candidate and its result


# --- problem files ----------------------------------------------------------------------------------------------------
def small_overrides(source: str) -> dict[str, int]:
    """The module-level ``SMALL = {...}`` dict of a problem source (a bench-only convention)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SMALL" for t in node.targets):
            return {str(k): int(v) for k, v in ast.literal_eval(node.value).items()}
    raise SuiteError("defines no SMALL dict")


def small_source(source: str) -> str:
    """The source with each ``NAME = <int>`` module-level line named in SMALL set to its small value."""
    for name, value in small_overrides(source).items():
        source, n = re.subn(rf"^{re.escape(name)}[ \t]*=[ \t]*[0-9_]+[ \t]*(#.*)?$", f"{name} = {value}", source,
                            flags=re.M)
        if n != 1:
            raise SuiteError(f"SMALL names {name}, but there is no single module-level line `{name} = <int>`")
    return source


def write_small_copy(path: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / path.name
    try:
        dest.write_text(small_source(path.read_text()))
    except SuiteError as e:
        raise SuiteError(f"{path}: {e}") from e
    return dest


def gemm_paths() -> list[Path]:
    """The GEMM family's problems (bench/problems/gemm), kept out of the default suite."""
    return sorted((PROBLEMS / "gemm").glob("*.py"))


def problem_paths(patterns: list[str] | None) -> list[Path]:
    """All suite problems, or those named: a path, a file stem, a glob on stems, or a stem prefix."""
    every = sorted(p for p in PROBLEMS.glob("*.py") if p.name not in EXCLUDE)
    if not patterns:
        return every
    every += gemm_paths()  # named, or matched by a pattern: the GEMM family's problems too
    chosen: list[Path] = []
    for pat in patterns:
        if Path(pat).is_file():
            hits = [Path(pat).resolve()]
        else:
            stem = pat.removesuffix(".py")
            hits = ([p for p in every if p.stem == stem] or [p for p in every if fnmatch.fnmatch(p.stem, stem)]
                    or [p for p in every if p.stem.startswith(stem)])
        if not hits:
            raise SuiteError(f"no problem matches {pat!r}; available: {', '.join(p.stem for p in every)}")
        chosen += [p for p in hits if p not in chosen]
    return chosen


# --- one problem ------------------------------------------------------------------------------------------------------
def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _seconds_between(start: str, end: str) -> float:
    return (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()


def max_autotune_baseline(problem: Any, opt: Any, workdir: Path, store: Any) -> tuple[float | None, str]:
    """The reference under torch.compile max-autotune (no CUDA graphs), judged and timed as a candidate.

    The result is stored under a baseline run: the search's inductor proposer renders the identical file, and the
    store hands it this result instead of compiling and timing it a second time."""
    from kernelevolve.candidate import Candidate
    from kernelevolve.optimize import make_evaluator
    from kernelevolve.propose.inductor import SEEDS, render

    options = dict(SEEDS)[MAX_AUTOTUNE]
    cand = Candidate(render(problem.source, options, MAX_AUTOTUNE), proposer="inductor",
                     meta={"label": MAX_AUTOTUNE, "options": options})
    result = make_evaluator(problem, opt, workdir).evaluate(cand)
    _REFERENCE[problem.name] = (cand, result)
    register_max_autotune(store, problem, opt.device, cand, result)
    ms = result.runtime_ms if result.ok and result.timed else None
    return ms, f"{result.status.value}: {result.reason}"


def register_max_autotune(store: Any, problem: Any, device: str, cand: Any, result: Any) -> None:
    from kernelevolve.machine import device_key, versions
    from kernelevolve.store import now

    key = device_key(device)
    run = store.create_run(problem, device, key, {"baseline": MAX_AUTOTUNE}, versions())
    node = store.add_node(run, problem.sha, key, cand)
    store.save_result(node.id, result)
    store.update_run(run, status="finished", finished=now(), stop_reason=f"baseline: {MAX_AUTOTUNE}")


def best_found(store: Any, run_id: int) -> dict[str, Any]:
    """The fastest verified timed node of a run, when it was found and how many candidates were evaluated."""
    from kernelevolve.search import best_node

    run = store.run(run_id)
    nodes = store.nodes(run_id)
    best, _ = best_node(nodes)
    out: dict[str, Any] = {"evals": store.count_evaluated(run_id), "screened": store.count_screened(run_id),
                           "stop_reason": run.stop_reason}
    out["candidates"] = [{"proposer": n.proposer, "label": n.label, "cached": n.cached,
                          "status": n.result.status.value if n.result else (
                              "screened out" if n.screened_out else "pending"),
                          "screen_ms": n.screen.ms if n.screen else None,
                          "ms": n.result.runtime_ms if n.result and n.result.timed else None,
                          # host launch time and start of each timing: to explain a judge far from its screen
                          "screen_host_ms": n.screen.host_ms if n.screen else None,
                          "host_ms": n.result.details.get("host_ms") if n.result else None,
                          # what else the CPU did meanwhile (timing.cpu_share): why a host time may have grown
                          "screen_cpu": n.screen.details.get("cpu") if n.screen else None,
                          "cpu": n.result.details.get("cpu") if n.result else None,
                          "screen_at": n.screen.timed_at if n.screen else None,
                          # "not judged": a backup finalist its batch's judged first finalist made unneeded
                          "backup": n.screen.details.get("backup") if n.screen else None,
                          "judged_at": n.result.details.get("timed_at") if n.result else None,
                          "reason": (n.result.reason or "")[:160] if n.result else ""}
                         for n in nodes]
    if best is None or best.runtime_ms is None:
        return out
    row = store.db.execute("SELECT created FROM results WHERE candidate_id = ?", (best.candidate_id,)).fetchone()
    found = max(best.created, row[0]) if row else best.created
    out.update(kernelevolve_ms=best.runtime_ms, best_proposer=best.proposer, best_label=best.label,
               time_to_best_s=_seconds_between(run.created, found))
    if best.result.timing is not None:  # the judged winner's clocks: call, device, host, graph replay
        out["clocks"] = best.result.timing.clocks()
    return out


def fill_speedups(row: dict[str, Any]) -> None:
    """Speedups of the best kernel over each baseline, its fraction of the roofline floor, and the suspect flag. Only a
    floor from datasheet ceilings is a hard limit (measured CPU ceilings are beaten by cache-resident ops)."""
    have = {k: row[f"{k}_ms"] for k in ("eager", "compile", "max_autotune") if row.get(f"{k}_ms") is not None}
    row["best_baseline"] = min(have, key=have.get) if have else None
    row["best_baseline_ms"] = min(have.values()) if have else None
    ke, floor = row.get("kernelevolve_ms"), row.get("floor_ms")
    for key in ("eager", "compile", "max_autotune", "best_baseline"):
        row[f"speedup_{key}"] = _ratio(row.get(f"{key}_ms"), ke)
    row["floor_fraction"] = _ratio(floor, ke)
    hard_floor = floor if row.get("floor_source", "table") == "table" else None
    row["suspect"] = bool(ke is not None and ((hard_floor and ke < hard_floor)
                                              or (row["speedup_eager"] or 0) > SUSPECT_SPEEDUP))


def row_device(device: str) -> str:
    """The card a row is measured on."""
    import torch
    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else device


def run_problem(path: Path, cfg: SuiteConfig, store: Any) -> dict[str, Any]:
    from kernelevolve.optimize import optimize
    from kernelevolve.problem import load_problem

    t0 = time.monotonic()
    # the code and the card that wrote the row (rows of one file may come from several resumed calls, on different
    # cards): BENCH_COMMIT, as bench/gpu_all.sh sets it
    row: dict[str, Any] = {"problem": path.stem, "status": "error", "notes": [],
                           "commit": os.environ.get("BENCH_COMMIT"), "device_name": row_device(cfg.device)}
    try:
        src = write_small_copy(path, cfg.out_dir / "small") if cfg.small else path
        problem = load_problem(src, cfg.device)
        row["dtype"] = problem.output_dtypes[0] if problem.output_dtypes else None
        opt = cfg.optimize_config(cfg.budget_s)
        work = cfg.out_dir / path.stem
        t1 = time.monotonic()
        if cfg.max_autotune:
            row["max_autotune_ms"], row["max_autotune_status"] = max_autotune_baseline(problem, opt,
                                                                                        work / ".max-autotune", store)
        else:
            row["max_autotune_ms"], row["max_autotune_status"] = None, "skipped: --no-max-autotune"
        t2 = time.monotonic()
        outcome = optimize(src, opt, store, work)
        # where the wall time went: loading the problem, the max-autotune baseline, then the run's own phases
        row["phases"] = {"load_s": round(t1 - t0, 1), "max_autotune_s": round(t2 - t1, 1),
                         "run_s": round(time.monotonic() - t2, 1)}
        fill_row(row, store, outcome.run_id)
        row["phases"].update({k: round(v, 1) for k, v in store.run(outcome.run_id).phases.items()})
        if cfg.device == "cuda":
            t3 = time.monotonic()
            check_clock(row, src, outcome.files["best"])
            row["phases"]["do_bench_s"] = round(time.monotonic() - t3, 1)
    except Exception as e:  # one problem's failure is recorded and the suite goes on
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def run_again(path: Path, cfg: SuiteConfig, store: Any, first: dict[str, Any], first_store: Any) -> dict[str, Any]:
    """The problem once more with the budget ``cfg.again_s``, in a store of its own (no result or experience of the
    first run is reused), from the first run's profile, eager and torch.compile baselines and max-autotune result:
    what differs between the two rows is the search alone."""
    from kernelevolve.machine import device_key, versions
    from kernelevolve.optimize import optimize
    from kernelevolve.problem import load_problem

    t0 = time.monotonic()
    row: dict[str, Any] = {"problem": path.stem, "status": "error", "notes": ["profile and baselines of the first run"]}
    try:
        if first.get("run_id") is None or path.stem not in _REFERENCE:
            raise SuiteError("the first run has no baselines to start from")
        src = write_small_copy(path, cfg.out_dir / "small") if cfg.small else path
        problem = load_problem(src, cfg.device)
        row["dtype"] = first.get("dtype")
        opt = cfg.optimize_config(cfg.again_s)
        cand, result = _REFERENCE[path.stem]
        register_max_autotune(store, problem, cfg.device, cand, result)
        row["max_autotune_ms"], row["max_autotune_status"] = first["max_autotune_ms"], first["max_autotune_status"]
        old = first_store.run(first["run_id"])
        run_id = store.create_run(problem, cfg.device, device_key(cfg.device), opt.to_dict(), versions())
        store.update_run(run_id, baseline=old.baseline, profile=old.profile)
        outcome = optimize(src, opt, store, cfg.out_dir / f"{path.stem}-{cfg.again_s:g}s", resume=run_id)
        fill_row(row, store, outcome.run_id)
    except Exception as e:  # one problem's failure is recorded and the suite goes on
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


# A row whose speedup over eager by the run differs from do_bench's by more than this is marked.
CLOCK_AGREEMENT = 0.05


def check_clock(row: dict[str, Any], problem: Path, best: Path, timeout_s: float = 600.0) -> None:
    """The returned file and eager timed again in a fresh process with triton.testing.do_bench (bench/dobench.py):
    its speedup over eager beside the run's, and the row marked where they differ by more than CLOCK_AGREEMENT."""
    cmd = [sys.executable, str(HERE / "dobench.py"), str(problem), str(best)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent / "src"),
                                                                      os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise SuiteError((done.stderr.strip().splitlines() or ["no output"])[-1][:300])
        got = json.loads(lines[-1])
    except (subprocess.TimeoutExpired, SuiteError, ValueError) as e:
        row["do_bench"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        row["notes"].append(f"no do_bench check: {e}"[:300])
        return
    row["do_bench"] = {k: got.get(k) for k in ("eager_ms", "kernel_ms", "speedup_eager")}
    ours, theirs = row.get("speedup_eager"), got.get("speedup_eager")
    row["clock_ratio"] = ours / theirs if ours and theirs else None
    row["clocks_disagree"] = bool(row["clock_ratio"] and abs(row["clock_ratio"] - 1) > CLOCK_AGREEMENT)
    if row["clocks_disagree"]:
        row["notes"].append(f"clocks disagree: {ours:.3f}x eager by the run, {theirs:.3f}x by do_bench")


def fill_head_to_head(row: dict[str, Any], run: Any) -> None:
    """The row's answer and speedups from the run's head-to-head, where it was held: every speedup then comes from
    the same interleaved rounds, and the judge's own figures are kept beside them (judge_*)."""
    h2h = run.head_to_head
    if h2h is None:
        return
    row["head_to_head"] = h2h.line()
    if not h2h.answer:
        return
    keys = {"eager": "eager", "compiled": "compile", "max_autotune": "max_autotune"}
    row.update(judge_ms=row.get("kernelevolve_ms"), **{f"judge_speedup_{k}": row.get(f"speedup_{k}")
                                                        for k in (*keys.values(), "best_baseline")})
    row["kernelevolve_ms"] = h2h.ms[h2h.answer]
    for side, key in keys.items():
        row[f"speedup_{key}"] = h2h.speedup.get(side)
    row["best_baseline"] = keys.get(h2h.best_baseline, h2h.best_baseline)
    row["speedup_best_baseline"] = h2h.speedup.get(h2h.best_baseline)
    row["rounds_ms"] = h2h.ms
    if not h2h.wins:
        row.update(best_proposer="baseline", best_label=h2h.answer)
        row["notes"].append(h2h.line())
        baseline_clocks(row, run.baseline, h2h.answer)


def baseline_side(name: str) -> str:
    """A row's baseline name (``best_baseline`` says ``compile``) as the head-to-head and ``Baseline`` name it."""
    return {"compile": "compiled"}.get(name, name)


def baseline_clocks(row: dict[str, Any], base: Any, side: str) -> None:
    """Where a baseline answers, the row's clocks are that baseline's (eager and torch.compile were timed by the same
    rule as the candidates); the judged candidate's stay beside them. max-autotune's figure has no clocks of its own."""
    if "fastest_candidate_clocks" not in row and row.get("clocks"):
        row["fastest_candidate_clocks"] = row["clocks"]
    timing = getattr(base, baseline_side(side), None)  # a Baseline has no max_autotune
    row["clocks"] = timing.clocks() if timing is not None else None


def fill_row(row: dict[str, Any], store: Any, run_id: int) -> None:
    """The row's baselines, profile, search counts and speedups from the finished run ``run_id``."""
    run = store.run(run_id)
    base, prof = run.baseline, run.profile
    row.update(eager_ms=base.eager.median_ms if base and base.eager else None,
               compile_ms=base.compiled.median_ms if base and base.compiled else None,
               compile_s=base.compile_s if base else None, floor_ms=prof.floor_ms if prof else None,
               floor_source=prof.ceilings_source if prof else None, bound=prof.bound if prof else None,
               dtype=prof.dtype if prof else row["dtype"], run_id=run_id)
    row.update(best_found(store, run_id))
    if row.get("time_to_best_s") is not None:  # from the search's start: less the profile and the baselines
        row["search_to_best_s"] = round(max(0.0, row["time_to_best_s"] - run.phases.get("profile_s", 0.0)
                                                 - run.phases.get("baseline_s", 0.0)), 1)
    timed = {k: row[f"{k}_ms"] for k in ("eager", "compile") if row.get(f"{k}_ms")}
    if row.get("kernelevolve_ms") is not None and timed and row["kernelevolve_ms"] > min(timed.values()):
        # without a head-to-head the run returns the best baseline's kernel when no candidate beats it (best.py
        # says so)
        side = min(timed, key=timed.__getitem__)
        row.update(kernelevolve_ms=timed[side], best_proposer="baseline", best_label=side,
                   fastest_candidate_ms=row["kernelevolve_ms"])
        baseline_clocks(row, base, side)
        row["notes"].append(f"no candidate beat {side}: the run returned its kernel")
    fill_speedups(row)
    fill_head_to_head(row, run)
    row["status"] = "ok" if row.get("kernelevolve_ms") is not None else "no verified timed kernel"
    if base and base.error:
        row["notes"].append(f"baseline: {base.error}")
    if row["max_autotune_ms"] is None:
        row["notes"].append(f"max-autotune {row['max_autotune_status']}"[:300])
    if row["suspect"]:
        row["notes"].append("suspect: faster than the roofline floor or >10x over eager")


# --- the suite --------------------------------------------------------------------------------------------------------
def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """fast_1: the fraction of all problems with a verified kernel strictly faster than that baseline."""
    n = len(rows)
    got = lambda key: [r[key] for r in rows if r.get(key) is not None]  # noqa: E731
    return {"problems": n, "verified": len(got("kernelevolve_ms")),
            "errors": sum(r.get("status") == "error" for r in rows),
            "suspect": sum(bool(r.get("suspect")) for r in rows),
            "geomean_speedup_best_baseline": geomean(got("speedup_best_baseline")),
            "geomean_speedup_compile": geomean(got("speedup_compile")),
            "fast_1_eager": sum(v > 1.0 for v in got("speedup_eager")) / n if n else None,
            "fast_1_compile": sum(v > 1.0 for v in got("speedup_compile")) / n if n else None,
            "at_least_best_baseline": sum(v >= 1.0 for v in got("speedup_best_baseline")),
            "do_bench_checked": len(got("clock_ratio")),
            "clocks_disagree": sum(bool(r.get("clocks_disagree")) for r in rows),
            "geomean_speedup_eager": geomean(got("speedup_eager")),
            "geomean_do_bench_speedup_eager": geomean([r["do_bench"]["speedup_eager"] for r in rows
                                                       if (r.get("do_bench") or {}).get("speedup_eager")])}


def header(cfg: SuiteConfig, device_name: str | None = None) -> dict[str, Any]:
    """The run's metadata. Pass ``device_name`` to keep this process from initialising CUDA."""
    import torch

    from kernelevolve.machine import versions

    v = versions()
    name = device_name or (torch.cuda.get_device_name(0) if cfg.device == "cuda"
                           else platform.processor() or platform.machine())
    return {"date": dt.date.today().isoformat(), "device": cfg.device, "device_name": name, "torch": v["torch"],
            "triton": v["triton"], "python": v["python"], "command": " ".join(["python3"] + sys.argv),
            "budget_s": None if cfg.defaults else cfg.budget_s, "max_evals": cfg.optimize_config(cfg.budget_s).max_evals,
            "defaults": cfg.defaults,
            "proposers": list(cfg.proposers), "small": cfg.small}


def write_json(path: Path, head: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Rewrite the whole file atomically, so a kill never leaves it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**head, "rows": rows, "summary": summarize(rows)}, indent=2, default=str))
    os.replace(tmp, path)


def run_serial(paths: list[Path], cfg: SuiteConfig, db: Path) -> list[dict[str, Any]]:
    from kernelevolve.store import Store

    for suffix in ("", "-wal", "-shm"):  # a fresh store per invocation: no result is reused from an earlier one
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    head, rows, store = header(cfg), [], Store(db)
    again = again_store = None
    if cfg.again_s is not None:
        again_db = db.with_name(f"{db.stem}-{cfg.again_s:g}s{db.suffix}")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{again_db}{suffix}").unlink(missing_ok=True)
        again, again_store = [], Store(again_db)
        again_head = dict(head, budget_s=cfg.again_s, first_budget_s=cfg.budget_s)
    if cfg.resume:
        rows, again, paths = resumed(paths, cfg, head, again)
        if again is not None:
            again_head["commands"] = head["commands"]
    began = time.monotonic()
    for i, path in enumerate(paths, 1):
        if past_deadline(began, cfg.deadline_s, len(paths) - i + 1, "problem"):
            break
        print(f"[{i}/{len(paths)}] {path.stem} ...", flush=True)
        rows.append(run_problem(path, cfg, store))
        write_json(cfg.json_path, head, rows)
        print(f"[{i}/{len(paths)}] {path.stem}: {progress_line(rows[-1])}", flush=True)
        if again is not None:
            again.append(run_again(path, cfg, again_store, rows[-1], store))
            write_json(again_path(cfg), again_head, again)
            print(f"[{i}/{len(paths)}] {path.stem} at {cfg.again_s:g} s: {progress_line(again[-1])}", flush=True)
    store.close()
    if again_store is not None:
        again_store.close()
        print_table(again, summarize(again))
        print(f"rows at {cfg.again_s:g} s: {again_path(cfg)}")
    return rows


def earlier_rows(path: Path, head: dict[str, Any], want: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an earlier call's JSON at ``path`` (none where there is no file), which must have been written
    with the settings ``want``; ``head["commands"]`` starts with that call's commands. For --resume here and in
    bench/experience.py."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    for key, value in want.items():
        if data.get(key) != value:
            raise SuiteError(f"--resume: {path} has {key} {data.get(key)!r}, this run {value!r}")
    head.setdefault("commands", data.get("commands") or [data.get("command")])
    return data["rows"]


def past_deadline(began: float, deadline_s: float | None, left: int, what: str) -> bool:
    """Whether ``deadline_s`` seconds have passed since ``began`` (and then says so, with how many are left)."""
    if deadline_s is None or time.monotonic() - began <= deadline_s:
        return False
    print(f"--deadline-s {deadline_s:g} reached: {left} {what}(s) left; run again with --resume to go on", flush=True)
    return True


def resumed(paths: list[Path], cfg: SuiteConfig, head: dict[str, Any],
            again: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, list[Path]]:
    """The rows already in the JSON files (at both budgets, with --again-s) and the problems still to run: a problem
    counts as done only with a row in each file; one cut off between its two runs runs again from the start."""
    want = {key: head[key] for key in ("budget_s", "proposers", "small", "device_name")}
    first = earlier_rows(cfg.json_path, head, want)
    second = earlier_rows(again_path(cfg), head, dict(want, budget_s=cfg.again_s)) if again is not None else None
    done = {r["problem"] for r in first}
    if second is not None:
        done &= {r["problem"] for r in second}
    todo = [p for p in paths if p.stem not in done]
    head["commands"] = [*head.get("commands", []), head["command"]]  # every call that wrote these rows
    print(f"--resume: {len(paths) - len(todo)} problem(s) already in {cfg.json_path.name}, {len(todo)} to run",
          flush=True)
    first = [r for r in first if r["problem"] in done]
    return first, None if second is None else [r for r in second if r["problem"] in done], todo


def again_path(cfg: SuiteConfig) -> Path:
    """Where the rows of the second budget go: beside the first JSON, named for the budget."""
    return cfg.json_path.with_name(f"{cfg.json_path.stem}-{cfg.again_s:g}s{cfg.json_path.suffix}")


def progress_line(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"error: {row['error'][:200]}"
    return (f"{row['status']}, {_fmt_ms(row.get('kernelevolve_ms'))} ms, {_fmt_x(row.get('speedup_best_baseline'))} "
            f"vs best baseline, {row.get('evals')} evals, {row.get('screened', 0)} screened, {row['wall_s']} s")


def run_sharded(paths: list[Path], cfg: SuiteConfig, gpus: int, argv: list[str]) -> list[dict[str, Any]]:
    """One process per GPU, pinned with CUDA_VISIBLE_DEVICES before torch starts, each writing its own JSON; their rows
    are merged into ours as they appear."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(gpus)]
    if len(devices) < gpus:
        raise SuiteError(f"--gpus {gpus}, but CUDA_VISIBLE_DEVICES lists {len(devices)}")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    shards = [cfg.out_dir / f"shard{i}.json" for i in range(gpus)]
    procs = []
    for i, shard in enumerate(shards):
        shard.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--shard", f"{i}/{gpus}", "--json", str(shard)]
        with open(cfg.out_dir / f"shard{i}.log", "w") as log:  # the child keeps its own copy of the descriptor
            procs.append(subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": devices[i]}, stdout=log,
                                          stderr=subprocess.STDOUT))
    head, seen = header(cfg, "unknown"), set()
    again_head = dict(head, budget_s=cfg.again_s, first_budget_s=cfg.budget_s)
    rank = {p.stem: k for k, p in enumerate(paths)}
    while True:
        finished = all(p.poll() is not None for p in procs)
        rows, name = read_shards(shards)
        head["device_name"] = again_head["device_name"] = name or head["device_name"]
        if cfg.again_s is not None:  # each shard's rows at the second budget, beside its JSON
            again, _ = read_shards([again_path(replace(cfg, json_path=shard)) for shard in shards])
            again.sort(key=lambda r: rank.get(r["problem"], len(rank)))
            write_json(again_path(cfg), again_head, again)
        for r in rows:
            if r["problem"] not in seen:
                seen.add(r["problem"])
                print(f"[{len(seen)}/{len(paths)}] {r['problem']}: {progress_line(r)}", flush=True)
        if finished:
            rows += [{"problem": path.stem, "status": "error", "notes": [],
                      "error": f"not run: shard {i} exited with code {p.returncode} (see shard{i}.log)"}
                     for i, p in enumerate(procs) for path in paths[i::gpus] if path.stem not in seen]
        rows.sort(key=lambda r: rank.get(r["problem"], len(rank)))
        write_json(cfg.json_path, head, rows)
        if finished:
            return rows
        time.sleep(5)


def read_shards(shards: list[Path]) -> tuple[list[dict[str, Any]], str | None]:
    """The rows the shards' JSON files hold so far (a file not written yet holds none), and the device's name."""
    rows, name = [], None
    for shard in shards:
        try:
            data = json.loads(shard.read_text())
        except (OSError, ValueError):
            continue
        rows += data["rows"]
        name = data.get("device_name", name)
    return rows, name


# --- output -----------------------------------------------------------------------------------------------------------
def _fmt_ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def _fmt_x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 160  # rich's default of 80 columns would cut the names in a log file
    table = Table(title="kernelevolve suite (times in ms; x: speedup of the kernelevolve kernel)")
    for col in ("problem", "dtype", "eager", "compile", "max-at", "kevolve", "x best", "x compile", "x eager",
                "do_bench x", "device", "host", "graph", "%floor", "judged", "by"):
        table.add_column(col, justify="left" if col in ("problem", "dtype", "by") else "right", no_wrap=True)
    for r in rows:
        if r.get("error"):
            console.print(f"[red]{r['problem']}[/]: {r['error'][:300]}")
        by = r.get("best_proposer") or ("[red]error[/]" if r.get("status") == "error" else "—")
        clocks = r.get("clocks") or {}
        host = _fmt_ms(clocks.get("host_ms")) + ("!" if clocks.get("launch_bound") else "")
        dobench = _fmt_x((r.get("do_bench") or {}).get("speedup_eager")) + (" [red]≠[/]" if r.get("clocks_disagree")
                                                                               else "")
        table.add_row(r["problem"] + (" [red]SUSPECT[/]" if r.get("suspect") else ""),
                      DTYPES.get(r.get("dtype"), str(r.get("dtype") or "—")),
                      *(_fmt_ms(r.get(f"{k}_ms")) for k in ("eager", "compile", "max_autotune", "kernelevolve")),
                      _fmt_x(r.get("speedup_best_baseline")), _fmt_x(r.get("speedup_compile")),
                      _fmt_x(r.get("speedup_eager")), dobench, _fmt_ms(clocks.get("device_ms")), host,
                      _fmt_ms(clocks.get("graph_ms")), _pct(r.get("floor_fraction")), str(r.get("evals", "—")), by)
    console.print(table)
    s = summary
    console.print(f"verified {s['verified']}/{s['problems']}, errors {s['errors']}, suspect {s['suspect']}; geomean "
                  f"{_fmt_x(s['geomean_speedup_best_baseline'])} vs the best baseline, "
                  f"{_fmt_x(s['geomean_speedup_compile'])} vs torch.compile; fast_1 {_pct(s['fast_1_eager'])} vs "
                  f"eager, {_pct(s['fast_1_compile'])} vs torch.compile; {s['at_least_best_baseline']} at >= 1.0x the "
                  f"best baseline; do_bench checked {s['do_bench_checked']}, {s['clocks_disagree']} disagree by more "
                  f"than {CLOCK_AGREEMENT:.0%} (geomean over eager {_fmt_x(s['geomean_speedup_eager'])} by the run, "
                  f"{_fmt_x(s['geomean_do_bench_speedup_eager'])} by do_bench)")


def merged_rows(paths: list[Path]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each problem's row with its file's header, from several suite JSONs; a later file's row replaces an earlier one
    of the same problem."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        head = {k: v for k, v in data.items() if k not in ("rows", "summary")}
        for r in data["rows"]:
            out[r["problem"]] = (r, head)
    return [out[k] for k in sorted(out)]


def markdown_table(paths: list[Path]) -> str:
    """The rows of suite JSONs as a markdown table for bench/results/README.md: the answer, its call latency, the
    run's and do_bench's speedups over eager and their ratio, the speedup over the best baseline, the answer's device,
    host and graph times, and the card and commit of each row; the summary of the rows below it."""
    sys.path.insert(0, str(HERE.parent / "src"))
    from kernelevolve.evaluate.headtohead import LABELS

    pairs = merged_rows(paths)
    lines = ["| problem | answer | ms | x eager (run) | x eager (do_bench) | ratio | x best baseline | device | host | "
             "graph | launch-bound | card | commit |", "|" + "---|" * 13]
    for r, head in pairs:
        c = r.get("clocks") or {}
        if r.get("best_proposer") == "baseline":
            side = baseline_side(r.get("best_label") or "")
            answer = "the reference" if side == "eager" else f"{LABELS.get(side, side)}'s kernel"
        else:
            answer = r.get("best_proposer") or r.get("status") or "—"
        ratio = r.get("clock_ratio")
        ratio_s = "—" if ratio is None else (f"**{ratio:.3f}**" if r.get("clocks_disagree") else f"{ratio:.3f}")
        best = r.get("speedup_best_baseline")
        best_s = "—" if best is None else f"{best:.2f} ({(r.get('best_baseline') or '').replace('_', '-')})"
        card = (r.get("device_name") or head.get("device_name") or "—").replace("NVIDIA ", "")
        lines.append(f"| {r['problem']} | {answer} | {_fmt_ms(r.get('kernelevolve_ms'))} | "
                     f"{_fmt_x(r.get('speedup_eager'))} | {_fmt_x((r.get('do_bench') or {}).get('speedup_eager'))} | "
                     f"{ratio_s} | {best_s} | {_fmt_ms(c.get('device_ms'))} | {_fmt_ms(c.get('host_ms'))} | "
                     f"{_fmt_ms(c.get('graph_ms'))} | {'yes' if c.get('launch_bound') else ''} | {card} | "
                     f"{r.get('commit') or '—'} |")
    s = summarize([r for r, _ in pairs])
    lines += ["", f"{s['problems']} problems: {s['verified']} verified, {s['at_least_best_baseline']} at >= 1.00x the "
              f"best baseline; geomean {_fmt_x(s['geomean_speedup_best_baseline'])} over the best baseline, "
              f"{_fmt_x(s['geomean_speedup_compile'])} over torch.compile, {_fmt_x(s['geomean_speedup_eager'])} over "
              f"eager by the runs and {_fmt_x(s['geomean_do_bench_speedup_eager'])} by do_bench; "
              f"{s['clocks_disagree']} of {s['do_bench_checked']} differ by more than {CLOCK_AGREEMENT:.0%}"]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"))
    ap.add_argument("--problems", nargs="+", help="file stems, globs on stems, stem prefixes or paths")
    ap.add_argument("--proposer", default="template,inductor", help="comma-separated proposer names")
    ap.add_argument("--budget-s", type=float, default=60.0, help="search time per problem")
    ap.add_argument("--again-s", type=float, help="run each problem once more with this budget, from the first run's "
                    "profile and baselines, in a store of its own (rows in JSON-<budget>s.json)")
    ap.add_argument("--max-evals", type=int, default=40)
    ap.add_argument("--defaults", action="store_true", help="each run with the CLI's own limits (no time budget, "
                    "--max-evals 20, --stall 10) instead of --budget-s and --max-evals: what a default run costs")
    ap.add_argument("--gpus", type=int, default=1, help="split the problems across N GPUs, one process each")
    ap.add_argument("--json", type=Path, help="default: OUT_DIR/suite.json")
    ap.add_argument("--out-dir", type=Path, default=Path("out/suite"))
    ap.add_argument("--timing-budget-ms", type=float, default=300.0)
    ap.add_argument("--small", action="store_true", help="run each problem at the sizes of its SMALL dict")
    ap.add_argument("--deadline-s", type=float, help="start no problem after this many seconds")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --json (and, with --again-s, in "
                    "its second file) and run only the problems they lack")
    ap.add_argument("--markdown", nargs="+", type=Path, metavar="JSON", help="print the rows of these suite JSONs "
                    "as one markdown table (a later file's row replaces an earlier one's); run nothing")
    ap.add_argument("--shard", help=argparse.SUPPRESS)  # I/N: run every N-th problem from I (set by --gpus)
    return ap.parse_args(argv)


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv without the named single-value flags, in either ``--flag v`` or ``--flag=v`` form."""
    out, skip = [], False
    for a in argv:
        if not skip and a not in flags and not a.startswith(tuple(f + "=" for f in flags)):
            out.append(a)
        skip = a in flags
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.markdown:
        print(markdown_table(args.markdown))
        return 0
    sys.path.insert(0, str(HERE.parent / "src"))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out_dir = args.out_dir.resolve()
    cfg = SuiteConfig(device, tuple(p for p in args.proposer.split(",") if p), args.budget_s, args.max_evals,
                      args.timing_budget_ms, args.small, out_dir, (args.json or out_dir / "suite.json").resolve(),
                      args.again_s, args.defaults, deadline_s=args.deadline_s, resume=args.resume)
    from kernelevolve.propose import ProposerError, make_proposers

    try:
        make_proposers(list(cfg.proposers), device)  # a bad name fails here, not once per problem
        paths = problem_paths(args.problems)
        if args.defaults and args.again_s is not None:
            raise SuiteError("--defaults runs without a time budget: --again-s has no budget to replace")
        if args.resume and args.gpus > 1 and device == "cuda":
            raise SuiteError("--resume goes on from one JSON: run it on one GPU (without --gpus)")
        if args.shard:
            i, n = (int(v) for v in args.shard.split("/"))
            run_serial(paths[i::n], cfg, out_dir / f"suite-shard{i}.db")
            return 0
        if args.gpus > 1 and device == "cuda":  # with --again-s, each GPU runs its problems at both budgets
            rows = run_sharded(paths, cfg, args.gpus, _without(argv, ("--gpus", "--json")))
        else:
            rows = run_serial(paths, cfg, out_dir / "suite.db")
    except (SuiteError, ProposerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(rows, summarize(rows))
    print(f"rows: {cfg.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
