"""Throughput benchmark: candidates evaluated per minute against the number of workers, per executor.

    PYTHONPATH=src python3 bench/throughput.py --device cuda --workers 1 2 --problems softmax_bf16 --json t.json
    PYTHONPATH=src python3 bench/throughput.py --device cpu --executor local ray --ray-local --workers 1 2 \
        --problems gelu_mlp --proposer inductor --evals 8

Each (executor, workers) point is one optimize run of a fixed number of evaluations (no stall, no time budget) in a
process of its own, with an empty store and empty Triton and Inductor caches, so no point reuses another's compiled
kernels or results. Throughput = evaluations / the search's wall time (from the start of the search to its end, so
the reference's profile and baseline are not counted) x 60. The evaluations are the full harness: a fresh process per
candidate, every correctness check, then timing. ``--ray-local`` starts a Ray head on 127.0.0.1 for the run and stops
it after; ``--ray-address`` uses a running cluster instead.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

import suite  # noqa: E402  (bench/suite.py)


def problem_path(name: str, small: bool, work: Path) -> Path:
    """A bench problem (or examples/NAME.py, or a path), at its SMALL sizes with ``small``."""
    example = ROOT / "examples" / f"{name.removesuffix('.py')}.py"
    path = example if example.is_file() else suite.problem_paths([name])[0]
    return suite.write_small_copy(path, work) if small and "SMALL" in path.read_text() else path


def one_point(args: argparse.Namespace) -> dict[str, Any]:
    """Run one (executor, workers) point in this process and return its row."""
    from kernelevolve.optimize import OptimizeConfig, optimize
    from kernelevolve.store import Store

    work = Path(args.work)
    path = problem_path(args.problems[0], args.small, work / "problem")
    cfg = OptimizeConfig(device=args.device, proposers=tuple(args.proposer.split(",")), max_evals=args.evals,
                         stall=None, workers=args.workers[0], timing_budget_ms=args.timing_budget_ms,
                         executor=args.executor[0], ray_address=args.ray_address,
                         screen_batch=0)  # the judge's throughput, every candidate judged; bench/screen.py: the screen's
    marks: dict[str, float] = {}

    def on_stage(stage: str) -> None:
        marks[stage] = time.monotonic()

    store = Store(work / "ke.db")
    t0 = time.monotonic()
    out = optimize(path, cfg, store, work / "out", on_stage=on_stage)
    end = time.monotonic()
    results = [n.result for n in store.nodes(out.run_id) if not n.cached and n.result is not None]
    start = marks.get("searching", t0)
    walls = [r.wall_s for r in results if r.wall_s]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    search_s = end - start
    return {"problem": path.stem, "executor": cfg.executor, "workers": cfg.workers, "evaluations": len(results),
            "search_s": round(search_s, 2), "setup_s": round(start - t0, 2),
            "per_minute": round(60.0 * len(results) / search_s, 2) if search_s > 0 else None,
            "median_eval_wall_s": round(statistics.median(walls), 3) if walls else None, "statuses": statuses,
            "stop_reason": out.search.stop_reason, "device_key": store.run(out.run_id).device_key}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRay:
    """A Ray head on 127.0.0.1 for the benchmark's lifetime. ``--block`` keeps the starting process in the
    foreground, so terminating it stops exactly what it started (``ray stop`` would stop every Ray instance of this
    user on the machine)."""

    def __init__(self, cpus: int, gpus: int, work: Path):
        exe = Path(sys.executable).with_name("ray")
        ray = [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
        self.port = free_port()
        self.temp = Path(tempfile.mkdtemp(prefix="ke-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))
        log = self.temp / "head.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ray + ["start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                       "--num-cpus", str(cpus), "--num-gpus", str(gpus), "--include-dashboard=false",
                       "--disable-usage-stats", "--temp-dir", str(self.temp)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 120
        while "will now block" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise SystemExit(f"the Ray head did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def run_point(executor: str, workers: int, args: argparse.Namespace, address: str | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"throughput-{executor}-{workers}-", dir=args.out_dir))
    env = dict(os.environ, TRITON_CACHE_DIR=str(work / "triton-cache"),
               TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--point", "--work", str(work), "--device", args.device,
           "--problems", args.problems[0], "--proposer", args.proposer, "--evals", str(args.evals),
           "--workers", str(workers), "--executor", executor, "--timing-budget-ms", str(args.timing_budget_ms)]
    cmd += ["--small"] if args.small else []
    cmd += ["--ray-address", address] if address else []
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.point_timeout)
    row_path = work / "row.json"
    if proc.returncode != 0 or not row_path.exists():
        return {"problem": args.problems[0], "executor": executor, "workers": workers,
                "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"],
                "wall_s": round(time.monotonic() - t0, 1)}
    row = json.loads(row_path.read_text())
    row["wall_s"] = round(time.monotonic() - t0, 1)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return row


def add_scaling(rows: list[dict[str, Any]]) -> None:
    """Each row's throughput over its executor's one-worker throughput on the same problem, from the same run."""
    one = {(r["problem"], r["executor"]): r.get("per_minute") for r in rows if r.get("workers") == 1}
    for r in rows:
        base = one.get((r["problem"], r["executor"]))
        r["scaling"] = round(r["per_minute"] / base, 3) if base and r.get("per_minute") else None


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'problem':24s} {'executor':8s} {'workers':>7} {'evals':>5} {'search s':>8} {'per min':>8} "
          f"{'scaling':>7} {'eval s':>7}  statuses")
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:24s} {r['executor']:8s} {r['workers']:>7} error: {r['error']}")
            continue
        scaling = f"{r['scaling']:.2f}x" if r.get("scaling") else "—"
        print(f"{r['problem']:24s} {r['executor']:8s} {r['workers']:>7} {r['evaluations']:>5} {r['search_s']:>8.1f} "
              f"{r['per_minute']:>8.1f} {scaling:>7} {r['median_eval_wall_s'] or 0:>7.2f}  {r['statuses']}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    ap.add_argument("--problems", nargs="+", default=["softmax_bf16"], help="bench problem stems or examples/ names")
    ap.add_argument("--proposer", default="template")
    ap.add_argument("--evals", type=int, default=16, help="evaluations per point")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--executor", nargs="+", choices=("local", "ray"), default=["local"])
    ap.add_argument("--ray-address", help="a running Ray cluster")
    ap.add_argument("--ray-local", action="store_true", help="start a Ray head on 127.0.0.1 for the ray points")
    ap.add_argument("--timing-budget-ms", type=float, default=300.0)
    ap.add_argument("--small", action="store_true", help="the problems at their SMALL sizes")
    ap.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--point-timeout", type=float, default=1800.0)
    ap.add_argument("--keep", action="store_true", help="keep each point's store and logs")
    ap.add_argument("--point", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.point:
        row = one_point(args)
        (Path(args.work) / "row.json").write_text(json.dumps(row))
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    head = suite.header(suite.SuiteConfig(args.device, tuple(args.proposer.split(",")), 0.0, args.evals,
                                          args.timing_budget_ms, args.small, args.out_dir, args.json or Path("-")))
    head.pop("budget_s", None)
    head.pop("max_evals", None)
    head["evals_per_point"] = args.evals
    rows: list[dict[str, Any]] = []
    ray_head = None
    try:
        for executor in args.executor:
            address = None
            if executor == "ray":
                if args.ray_local and ray_head is None:
                    gpus = max(args.workers) if args.device == "cuda" else 0
                    ray_head = LocalRay(max(args.workers) if args.device == "cpu" else 2, gpus, args.out_dir)
                address = args.ray_address or (ray_head.address if ray_head else None)
                if address is None:
                    raise SystemExit("--executor ray needs --ray-address or --ray-local")
            for problem in args.problems:
                for workers in args.workers:
                    point = argparse.Namespace(**{**vars(args), "problems": [problem]})
                    row = run_point(executor, workers, point, address)
                    rows.append(row)
                    print(f"[{len(rows)}] {problem} {executor} x{workers}: "
                          f"{row.get('per_minute', row.get('error'))} evaluations/min", flush=True)
    finally:
        if ray_head is not None:
            ray_head.stop()
    add_scaling(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**head, "rows": rows}, indent=2, default=str))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
