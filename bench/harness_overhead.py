"""Harness overhead per candidate, apart from the candidate's own run time and its compile time.

For each evaluation:
  wall      the whole evaluation as the parent saw it (process start to verdict)
  loop      the measured timing loop, by the parent's clock (the candidate's run time plus cache flushes)
  compile   the candidate's first call (Triton JIT / Inductor compile)
  overhead  wall - loop - compile: process start, imports, correctness trials, reference outputs, ghost run,
            calibration and warm-up
Throughput is 60 / median(wall) candidates per minute per worker.

    PYTHONPATH=src python3 bench/harness_overhead.py --device cuda --n 8 --json bench/results/overhead.json
    PYTHONPATH=src python3 bench/harness_overhead.py --device cpu --shape 256x1024 --n 5
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from candidates import TORCH, TRITON  # noqa: E402

from kernelevolve.candidate import Candidate  # noqa: E402
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402


def measure(evaluator: Evaluator, source: str, n: int) -> dict:
    rows = []
    for i in range(n):
        # A distinct comment makes each source distinct, as the store would see new candidates.
        r = evaluator.evaluate(Candidate(f"{source}\n# variant {i} {time.time_ns()}\n"))
        loop = r.details.get("parent_wall_s", 0.0)
        compile_s = r.compile_s or 0.0
        rows.append({"status": r.status.value, "reason": r.reason, "wall_s": r.wall_s, "loop_s": loop,
                     "compile_s": compile_s, "overhead_s": r.wall_s - loop - compile_s,
                     "runtime_ms": r.runtime_ms, "timed": r.timed, "phases_s": r.details.get("phases_s", {})})
    ok = [x for x in rows if x["status"] == "ok"]
    med = lambda k: statistics.median(x[k] for x in ok) if ok else None  # noqa: E731
    return {"n": n, "ok": len(ok), "median_wall_s": med("wall_s"), "median_loop_s": med("loop_s"),
            "median_compile_s": med("compile_s"), "median_overhead_s": med("overhead_s"),
            "max_overhead_s": max((x["overhead_s"] for x in ok), default=None),
            "candidates_per_min": 60 / med("wall_s") if ok else None, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--problem", default=str(HERE / "problems" / "scale_bias_relu.py"))
    ap.add_argument("--shape", help="ROWSxCOLS replacing the problem's size (e.g. 256x1024 for a CPU)")
    ap.add_argument("--timing-budget-ms", type=float, default=1000.0)
    ap.add_argument("--json")
    args = ap.parse_args()

    problem_path = Path(args.problem)
    if args.shape:
        rows, cols = (int(v) for v in args.shape.lower().split("x"))
        text = re.sub(r"^ROWS, COLS = .*$", f"ROWS, COLS = {rows}, {cols}", problem_path.read_text(), flags=re.M)
        problem_path = Path(tempfile.mkdtemp()) / problem_path.name
        problem_path.write_text(text)
    problem = load_problem(problem_path, args.device)
    evaluator = Evaluator(problem, EvalConfig(device=args.device, timeout_s=300,
                                              timing=TimingConfig(budget_ms=args.timing_budget_ms)))
    evaluator.evaluate(Candidate(TORCH + "\n# warm the fork server\n"))
    sources = {"torch": TORCH, "triton": TRITON}
    results = {name: measure(evaluator, src, args.n) for name, src in sources.items()}
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    out = {
        "date": dt.date.today().isoformat(), "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
        "command": " ".join(["python3"] + sys.argv), "timing_budget_ms": args.timing_budget_ms,
        "problem": Path(args.problem).name, "shape": args.shape, "results": results,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"{'candidate':<8} {'ok':>4} {'wall s':>8} {'loop s':>8} {'compile s':>10} {'overhead s':>11} "
          f"{'max ovh s':>10} {'cand/min':>9}")
    for name, r in results.items():
        f = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{name:<8} {r['ok']:>2}/{r['n']:<1} {f(r['median_wall_s']):>8} {f(r['median_loop_s']):>8} "
              f"{f(r['median_compile_s']):>10} {f(r['median_overhead_s']):>11} {f(r['max_overhead_s']):>10} "
              f"{f(r['candidates_per_min']):>9}")


if __name__ == "__main__":
    main()
