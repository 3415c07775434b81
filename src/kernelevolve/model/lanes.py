"""A model's problems in parallel: one lane per local GPU, or several runs at once on a Ray cluster.

On a machine with several GPUs each problem runs as ``kernelevolve optimize`` would, in a process of its own that
sees one GPU only (``CUDA_VISIBLE_DEVICES``): its profile, baseline, screen, judge and head-to-head all stay on that
GPU, so runs on different GPUs do not disturb each other's clocks. With ``--executor ray`` the runs share the
cluster (Ray places each evaluation on a GPU), several at once from this process. Everywhere else, and for a single
problem, they run one after the other. Each run is a run in the store, as ``optimize`` writes it.

    python -m kernelevolve.model.lanes PROBLEM.py OUT_DIR DB CONFIG_JSON [RUN]   # one lane's run; prints a JSON line
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from kernelevolve.model.budget import Pacer

MAX_RAY_RUNS = 8  # runs at once on a Ray cluster


def lane_devices(cfg: Any, problems: int) -> list[str | None]:
    """The lanes: a CUDA_VISIBLE_DEVICES value for each local GPU (None: a run in this process, on a Ray cluster);
    a single lane means one run after another."""
    if problems < 2:
        return [None]
    if cfg.executor == "ray":
        return [None] * min(problems, cfg.workers or MAX_RAY_RUNS, MAX_RAY_RUNS)
    if cfg.device != "cuda":
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g for g in visible.split(",") if g.strip()]
    else:
        import torch

        gpus = [str(i) for i in range(torch.cuda.device_count())]
    return gpus if len(gpus) > 1 else [None]


def _fields(run_id: int, best: Path | None, h: Any, best_result: Any, why: str) -> dict[str, Any]:
    """What a model needs from a problem's run: its id, best.py, its speedup over its best baseline and what best.py
    is (from the head-to-head where one was held, else the judge's verdict)."""
    speedup, answer = None, ""
    if h is not None and h.answer:
        speedup, answer = h.speedup.get(h.best_baseline), h.answer
    elif best_result is not None and "the reference itself" not in why:
        answer = "candidate"  # no head-to-head held: the judge's verdict stands, against the baselines it timed
        timed = [x for x in (best_result.speedup_eager, best_result.speedup_compile) if x]
        speedup = min(timed) if timed else None
    return {"run_id": run_id, "best": str(best) if best else None, "speedup": speedup, "why": why, "answer": answer}


def outcome_fields(result: Any) -> dict[str, Any]:
    """_fields of a run just made (optimize's RunOutcome), with how long it searched."""
    return _fields(result.run_id, result.files.get("best"), result.head_to_head, result.best_result,
                   result.best_why) | {"search_s": (getattr(result, "phases", None) or {}).get("search_s")}


def earlier_run(store: Any, path: Path, device: str) -> Any:
    """The latest run in the store of this very problem file (its hash) on ``device``, or None."""
    from kernelevolve.problem import load_problem

    sha = load_problem(path, "cpu").sha
    runs = [r for r in store.runs() if r.problem_sha == sha and r.device == device]
    return max(runs, key=lambda r: r.id) if runs else None


def finished_fields(store: Any, run_id: int, out_dir: Path) -> dict[str, Any]:
    """outcome_fields of a run that finished earlier, from the store (its best.py written again)."""
    from kernelevolve.report import write_outputs
    from kernelevolve.search import best_node

    run = store.run(run_id)
    files, why = write_outputs(store, run_id, out_dir)
    node, _ = best_node(store.nodes(run_id))
    result = None
    if node is not None and node.result is not None:
        result = node.result.with_baseline(run.baseline) if run.baseline is not None else node.result
    return _fields(run_id, files["best"], run.head_to_head, result, why)


def run_in_lane(path: Path, cfg: Any, db: Path, out_dir: Path, device: str | None,
                resume: int | None = None) -> dict[str, Any]:
    """One problem's run in a process of its own that sees the GPU ``device`` only."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device} if device is not None else dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    config = replace(cfg, workers=1).to_dict()
    proc = subprocess.run([sys.executable, "-m", "kernelevolve.model.lanes", str(path), str(out_dir), str(db),
                           json.dumps(config), str(resume or "")], capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"run_id": None, "best": None, "speedup": None, "answer": "",
                "why": f"the run failed (exit {proc.returncode}): {tail[-1][:200] if tail else 'no output'}"}
    return json.loads(lines[-1])


def run_all(jobs: list[tuple[str, Path, Any, Path]], cfg: Any, store: Any, on_stage: Callable[[str], None],
            labels: dict[str, str] | None = None, resume: bool = False,
            pacer: Pacer | None = None) -> dict[str, dict[str, Any]]:
    """Each job (name, problem file, its config, its output folder) run in the lanes; the fields by name, with the
    run's wall time. ``labels``: what the progress line calls each job (default: its name). With ``resume``, a
    problem whose run finished earlier (the same file, in the same store) keeps that run's answer, and one whose run
    stopped goes on from where it stopped. With a ``pacer``, each new run's search budget is its share of what is
    left of the model's budget as it starts, and a run whose share has run out does not start."""
    from kernelevolve.optimize import optimize

    lanes = lane_devices(cfg, len(jobs))
    free: list[str | None] = list(lanes)
    lock = threading.Lock()

    earlier: dict[str, Any] = {}
    if resume:
        for name, path, _, out in jobs:
            run = earlier_run(store, path, cfg.device)
            if run is not None and run.status == "finished":
                on_stage(f"{(labels or {}).get(name, name)}: run {run.id} finished earlier, its answer kept")
                earlier[name] = finished_fields(store, run.id, out)
            elif run is not None:
                earlier[name] = run.id
    done = {k: v for k, v in earlier.items() if isinstance(v, dict)}
    jobs = [j for j in jobs if j[0] not in done]

    if pacer is not None:
        pacer.lanes = len(lanes)

    def one(job: tuple[str, Path, Any, Path]) -> tuple[str, dict[str, Any]]:
        name, path, job_cfg, out = job
        again = earlier.get(name)
        label = (labels or {}).get(name, name)
        if pacer is not None and not again:
            share = pacer.start(name)
            if share.budget_s <= 0:
                on_stage(f"{label}: {share.why}")
                return name, {"run_id": None, "best": None, "speedup": None, "answer": "", "why": share.why}
            job_cfg = replace(job_cfg, time_budget_s=share.budget_s)
        with lock:
            device = free.pop(0)
        t0 = time.monotonic()
        fields: dict[str, Any] = {}
        try:
            on_stage(f"{label}: {job_cfg.time_budget_s:.0f} s"
                     + (f" on GPU {device}" if device is not None else "") + (f", run {again} resumed" if again else ""))
            if device is not None:
                fields = run_in_lane(path, job_cfg, store.path, out, device, again)
            else:
                own = store if len(lanes) == 1 else type(store)(store.path)  # a connection per thread
                fields = outcome_fields(optimize(path, job_cfg, own, out, resume=again))
            return name, fields | {"wall_s": round(time.monotonic() - t0, 1), "budget_s": job_cfg.time_budget_s}
        finally:
            if pacer is not None:
                pacer.finish(name, fields.get("search_s"))
            with lock:
                free.append(device)

    if len(lanes) == 1:
        return done | dict(one(job) for job in jobs)
    with ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="kernelevolve-lane") as pool:
        return done | dict(pool.map(one, jobs))


def main(argv: list[str] | None = None) -> int:
    from kernelevolve.optimize import OptimizeConfig, optimize
    from kernelevolve.store import Store

    args = list(argv if argv is not None else sys.argv[1:])
    path, out, db, config = args[:4]
    resume = int(args[4]) if len(args) > 4 and args[4] else None
    cfg = OptimizeConfig.from_dict(json.loads(config))
    result = optimize(Path(path), cfg, Store(db), Path(out), resume=resume)
    print(json.dumps(outcome_fields(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
