"""Whole models end to end: the ads-ranking models of bench/models and level-3 KernelBench problems, each through
`kernelevolve optimize-model`, its best_model.py then timed again in a fresh process with do_bench.

    PYTHONPATH=src python3 bench/models.py --device cuda --budget-s 240 --level3-seed 36 --json out/models.json

The level-3 problems are drawn per category (MLPs, attention, RNNs, convolutional nets, other) with the seed given,
so the draw is fixed before any result is seen: ``--level3-seed 36`` draws the counts in ``DRAW``. Each row holds the
head-to-head of the whole model (call latency) against eager, torch.compile and max-autotune, the time by region
before and after (the report's waterfall), the region problems and their answers, and ``do_bench``'s figures; a row
whose judge and do_bench speedups over eager differ by more than 5% is marked. ``--small`` runs the models of
bench/models at their SMALL sizes (a CPU smoke run; its times mean nothing). Rows are kept across calls
(``--deadline-s`` stops starting models, a later call goes on).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.record import record, write  # noqa: E402

MODELS = ROOT / "bench" / "models"
LEVEL3 = ROOT.parent / "shared" / "kernelbench" / "level3"
# level 3 by what the models are, every file of the folder in one category
CATEGORIES = {
    "mlp": ["2_ShallowWideMLP"],
    "attention": ["28_VisionTransformer", "29_SwinMLP", "30_SwinTransformerV2", "32_ConvolutionalVisionTransformer"],
    "rnn": ["33_VanillaRNN", "34_VanillaRNNHidden", "36_LSTMHn", "37_LSTMCn", "38_LSTMBidirectional", "39_GRU",
            "40_GRUHidden", "41_GRUBidirectional", "42_GRUBidirectionalHidden"],
    "conv": ["4_LeNet5", "5_AlexNet", "6_GoogleNetInceptionModule", "7_GoogleNetInceptionV1", "9_ResNet18",
             "10_ResNet101", "11_VGG16", "12_VGG19", "13_DenseNet121TransitionLayer", "14_DenseNet121DenseBlock",
             "15_DenseNet121", "16_DenseNet201", "17_SqueezeNetFireModule", "18_SqueezeNet", "19_MobileNetV1",
             "20_MobileNetV2", "21_EfficientNetMBConv", "22_EfficientNetB0", "23_EfficientNetB1",
             "24_EfficientNetB2", "25_ShuffleNetUnit", "26_ShuffleNet", "27_RegNet", "45_UNetSoftmax"],
    "other": ["47_NetVladNoGhostClusters", "49_Mamba2ReturnFinalState"],
}
DRAW = {"mlp": 1, "attention": 2, "rnn": 3, "conv": 5, "other": 1}  # 12 in all
AGREE = 0.05  # judge and do_bench speedups over eager within 5%


def draw_level3(root: Path, seed: int) -> list[Path]:
    """DRAW's counts from each category, by ``seed``; a category's files missing from ``root`` are not drawn."""
    rng = random.Random(seed)
    out = []
    for category, names in CATEGORIES.items():
        present = [n for n in names if (root / f"{n}.py").exists()]
        out += [root / f"{n}.py" for n in rng.sample(present, min(DRAW[category], len(present)))]
    return out


def category(path: Path) -> str:
    if path.parent == MODELS:
        return "ads-ranking" if path.stem != "transformer_block_bf16" else "transformer"
    return next((c for c, names in CATEGORIES.items() if path.stem in names), "level3")


def small_copy(path: Path, folder: Path) -> Path:
    """The model file with its SMALL sizes (the bench/models convention)."""
    from tests.benchsuite import load_suite

    return load_suite().write_small_copy(path, folder / path.stem)


def run_model(path: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One model through the CLI in a process of its own; the row from its model_report.json."""
    cmd = [sys.executable, "-m", "kernelevolve.cli", "optimize-model", str(path), "--device", args.device,
           "--time-budget", str(args.budget_s), "--out", str(out), "--db", str(args.out_dir / "models.db"),
           "--proposer", args.proposer, "--timing-budget-ms", str(args.timing_budget_ms), "--timing", args.timing]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    # the run's output goes to run.log as it comes, each line with the seconds since the start, so that a run past
    # --timeout still tells how far it got and where its time went; a session of its own, so that such a run goes
    # with its screen and judge processes
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "run.log"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)

    def copy() -> None:
        with log_path.open("w") as log_file:
            for line in proc.stdout or ():
                log_file.write(f"{time.monotonic() - t0:7.1f}  {line}")
                log_file.flush()

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    try:
        code: int | None = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    copier.join(timeout=10)
    tail = log_path.read_text(errors="replace")[-3000:]
    if code is None:
        tail += f"\ntimed out after {args.timeout:.0f} s"
    row: dict[str, Any] = {"exit": code, "wall_s": round(time.monotonic() - t0, 1)}
    report = out / "model_report.json"
    if not report.exists():
        return row | {"status": "failed", "why": tail.strip().splitlines()[-1][:300] if tail.strip() else ""}
    rep = json.loads(report.read_text())
    h = rep.get("head_to_head") or {}
    plan = rep["plan"]
    water = rep.get("waterfall") or []
    row |= {"status": rep.get("status") or "ok", "why": rep.get("why"), "model_run": rep.get("run_id"),
            "kept": rep.get("kept"), "dropped": rep.get("dropped"), "answer": h.get("answer"),
            "speedup": h.get("speedup") or {}, "rounds": h.get("rounds"),
            "total_ms": plan.get("total_ms"), "ops": plan.get("ops"), "regions": plan.get("regions"),
            "hot": [{k: r[k] for k in ("name", "kind", "where", "ms", "share")} for r in plan.get("hot", [])[:5]],
            "problems": [{k: p.get(k) for k in ("name", "kind", "where", "ms", "share", "budget_s", "why")}
                         for p in plan.get("problems", [])],
            "region_answers": [{k: r.get(k) for k in ("name", "run_id", "speedup", "answer", "why", "budget_s",
                                                      "wall_s")}
                               for r in rep.get("regions", [])],
            "phases": rep.get("phases") or {},
            "waterfall": water}
    return row


def dobench(problem: Path, best: Path, timeout: float) -> dict[str, Any]:
    """bench/dobench.py on the pair, in a fresh process."""
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dobench.py"), str(problem), str(best)],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as e:  # the row keeps the judge's figures; the independent clock says why it is missing
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ads = [r for r in rows if r.get("category") in ("ads-ranking", "transformer")]
    l3 = [r for r in rows if r not in ads]
    ok = [r for r in rows if r.get("status") == "ok"]
    below = [r["model"] for r in rows if r.get("speedup") and min(r["speedup"].values()) < 1.0 - 1e-9]
    return {"models": len(rows), "verified": len(ok), "below_a_baseline": below,
            "ads_geomean_vs_max_autotune": geomean([r["speedup"].get("max_autotune") for r in ads
                                                    if r.get("speedup")]),
            "level3_geomean_vs_best_of_eager_compile": geomean(
                [min(r["speedup"].get("eager", math.inf), r["speedup"].get("compiled", math.inf)) for r in l3
                 if r.get("speedup")]),
            # what the kernels add: each model against the best of its three builds (the model itself, answered
            # where eager beats Inductor's builds, reads 1.00x here however far it beats max-autotune)
            "ads_geomean_vs_best_baseline": geomean([min(r["speedup"].values()) for r in ads if r.get("speedup")]),
            "with_kernels": [r["model"] for r in rows if r.get("kept")],
            "clock_disagreements": [r["model"] for r in rows if r.get("clock_disagrees")]}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'model':<32} {'status':<9} {'kept':>4} {'eager':>7} {'compile':>8} {'max-at':>7} {'do_bench':>9} "
          f"{'before':>9} {'after':>9} {'wall s':>7}")
    for r in rows:
        s = r.get("speedup") or {}
        water = {w["name"]: w for w in r.get("waterfall") or []}
        whole = water.get("the whole model", {})

        def x(v: Any) -> str:
            return "—" if v is None else f"{v:.2f}x"

        def ms(v: Any) -> str:
            return "—" if v is None else f"{v:.3f}"
        print(f"{r['model'][:32]:<32} {r.get('status', '')[:9]:<9} {len(r.get('kept') or []):>4} "
              f"{x(s.get('eager')):>7} {x(s.get('compiled')):>8} {x(s.get('max_autotune')):>7} "
              f"{x((r.get('do_bench') or {}).get('speedup_eager')):>9}{'*' if r.get('clock_disagrees') else ' '}"
              f"{ms(whole.get('before_ms')):>9} {ms(whole.get('after_ms')):>9} {r.get('wall_s') or 0:>7.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--models", nargs="*", help="names of bench/models files (default: all)")
    ap.add_argument("--level3-seed", type=int, help="draw DRAW's counts of level-3 problems with this seed")
    ap.add_argument("--level3-root", type=Path, default=LEVEL3)
    ap.add_argument("--level3", nargs="*", default=[], help="level-3 stems to run instead of a draw")
    ap.add_argument("--small", action="store_true", help="bench/models at their SMALL sizes (a CPU smoke run)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="each model's whole budget (--time-budget)")
    ap.add_argument("--proposer", default="template,inductor")
    ap.add_argument("--timing-budget-ms", type=float, default=300.0)
    ap.add_argument("--timing", choices=("call", "graph"), default="call",
                    help="the clock that ranks kernels and judges the whole: call latency, or CUDA graph replay")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for one model's whole run")
    ap.add_argument("--no-dobench", action="store_true", help="skip the independent clock (on the CPU: always)")
    ap.add_argument("--deadline-s", type=float, help="start no model after this many seconds (resume later)")
    ap.add_argument("--json", type=Path, default=Path("out/models/models.json"))
    ap.add_argument("--out-dir", type=Path, default=Path("out/models"))
    args = ap.parse_args(argv)
    paths = [MODELS / f"{m}.py" for m in args.models] if args.models else sorted(MODELS.glob("*.py"))
    if args.level3:
        paths += [args.level3_root / f"{n}.py" for n in args.level3]
    elif args.level3_seed is not None:
        paths += draw_level3(args.level3_root, args.level3_seed)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        ap.error(f"no such model file: {', '.join(missing)}")
    rows = json.loads(args.json.read_text())["rows"] if args.json.exists() else []
    done = {r["model"] for r in rows}
    t0 = time.monotonic()
    for path in paths:
        name = path.stem if path.parent == MODELS else f"level3/{path.stem}"
        if name in done:
            continue
        if args.deadline_s is not None and time.monotonic() - t0 > args.deadline_s:
            print(f"deadline: {name} and the rest left for a later call", flush=True)
            break
        out = args.out_dir / name.replace("/", "_")
        problem = small_copy(path, args.out_dir / "small") if args.small and path.parent == MODELS else path
        print(f"{name}: optimize-model, {args.budget_s:.0f} s", flush=True)
        row = {"model": name, "category": category(path), "file": str(path), "small": args.small and
               path.parent == MODELS, "timing": args.timing} | run_model(problem, args, out)
        best = out / "best_model.py"
        if args.device == "cuda" and not args.no_dobench and best.exists():
            row["do_bench"] = db = dobench(problem, best, 600.0)
            judge = (row.get("speedup") or {}).get("eager")
            if judge and db.get("speedup_eager"):
                row["clock_disagrees"] = abs(db["speedup_eager"] / judge - 1) > AGREE
        rows.append(row)
        write(args.json, record("models.py", rows, device=args.device, summary=summarize(rows)))
    print_table(rows)
    print(json.dumps(summarize(rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
