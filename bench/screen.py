"""Screening throughput, and how the screen's timings agree with the judge's.

    PYTHONPATH=src python3 bench/screen.py --device cuda --problems layernorm_fp32 rmsnorm_residual_bf16 \
        --configs 240 --judge 5 --json out/screen.json

For each problem, distinct configurations of the template library's plan (the default first, then random points of
every region's space, seeded) are rendered to candidates and screened in batches of ``--batch``: each checked once
against the reference and timed briefly, with the cache flushed. Triton's and Inductor's caches start empty
(fresh ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``), so compile time is counted. Throughput = screened
configurations / the screen's wall time x 60: configurations per GPU-minute (one GPU). Then the ``--judge`` fastest by
screen time are judged by the full judge. The row reports both medians per judged kernel, the median ratio of judge
to screen, and Spearman's rank correlation between the two clocks, and for each knob of the plan the fastest screen
time at each of its values (``knob_bests``: for instance whether tf32x3 or the exact FMA dot made the fastest fp32
GEMMs). A problem may be named by its path (a KernelBench file, say) as well as by its suite stem.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
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


def sample_configs(proposer: Any, plan: Any, n: int, seed: int) -> list[tuple[str, str, dict]]:
    """(label, source, genome): the default genome, then up to ``n - 1`` random genomes of the plan's spaces that
    render to distinct kernels."""
    from kernelevolve.propose.template import genome_key

    rng = random.Random(seed)
    default = {r.key: r.default() for r in plan.regions}
    out, seen, kernels, tries = [], set(), set(), 0
    genome = default
    while len(out) < n and tries < 20 * n:
        tries += 1
        key = genome_key(genome)
        if key not in seen:
            seen.add(key)
            label = "defaults" if genome is default else f"sample {len(out)}"
            source = proposer.render(plan, genome, label)
            # distinct kernels: genomes that clip to the same launch (a persistent row ignores BLOCK_C) would
            # compile once and count many times
            kernel = None if source is None else source.replace(f"({label})", "")
            if kernel is not None and kernel not in kernels:
                kernels.add(kernel)
                out.append((label, source, genome))
        genome = {r.key: {k: rng.choice(v) for k, v in r.space.items()} for r in plan.regions}
    return out


def knob_bests(samples: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """For each region and knob that took more than one value among the timed samples: the fastest screen time at
    each value (which precision, tile or schedule the fastest kernels share)."""
    values: dict[str, dict[str, dict[str, float]]] = {}
    for sample in samples:
        if sample["status"] != "ok" or sample["ms"] is None:
            continue
        for region, genes in sample["genome"].items():
            for knob, value in genes.items():
                best = values.setdefault(region, {}).setdefault(knob, {})
                best[str(value)] = min(best.get(str(value), float("inf")), sample["ms"])
    return {region: {knob: dict(sorted(v.items(), key=lambda kv: kv[1])) for knob, v in knobs.items() if len(v) > 1}
            for region, knobs in values.items()}


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    from kernelevolve.report import _spearman

    return _spearman(pairs) if len(pairs) >= 3 else None


def run_problem(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    import statistics

    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
    from kernelevolve.evaluate.screen import ScreenConfig, Screener
    from kernelevolve.problem import load_problem
    from kernelevolve.propose.template import TemplateProposer

    problem = load_problem(path)
    proposer = TemplateProposer(args.device, seed=args.seed)
    plan = proposer.plan(problem)
    row: dict[str, Any] = {"problem": path.stem, "regions": [r.match.kind for r in plan.regions]}
    if plan.error or not plan.regions:
        return dict(row, error=plan.error or "no template family claims this problem")
    configs = sample_configs(proposer, plan, args.configs, args.seed)
    cands = [Candidate(src, proposer="template", language="triton", meta={"label": label})
             for label, src, _ in configs]
    work = Path(tempfile.mkdtemp(prefix=f"screen-{path.stem}-"))
    ev = Evaluator(problem, EvalConfig(device=args.device, timeout_s=args.timeout,
                                       timing=TimingConfig(budget_ms=args.timing_budget_ms)), work)
    screener = Screener(ev, ScreenConfig(timeout_s=args.timeout, template_timeout_s=args.template_timeout,
                                         parallel=args.parallel))
    results, t0 = [], time.monotonic()
    for i in range(0, len(cands), args.batch):
        results += screener.screen(cands[i:i + args.batch])
        done = len(results)
        print(f"  {path.stem}: screened {done}/{len(cands)} in {time.monotonic() - t0:.1f} s", flush=True)
    wall = time.monotonic() - t0
    screener.close()
    stages = list(screener.stats)
    compiles = sorted(r.first_call_s for r in results if r.first_call_s is not None)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    timed = sorted((r.ms, k) for k, r in enumerate(results) if r.ok and r.ms is not None)
    judged = []
    for ms, k in timed[:args.judge]:
        j = ev.evaluate(cands[k])
        judged.append({"label": configs[k][0], "genome": configs[k][2], "screen_ms": ms,
                       "judge_status": j.status.value,
                       "judge_ms": j.runtime_ms if j.ok and j.timed else None, "judge_wall_s": j.wall_s})
    if args.baseline:  # the reference by the judge, eager and under torch.compile, for scale
        base = ev.baseline()
        row.update(eager_ms=base.eager.median_ms if base.eager else None,
                   compile_ms=base.compiled.median_ms if base.compiled else None)
    pairs = [(d["screen_ms"], d["judge_ms"]) for d in judged if d["judge_ms"] is not None]
    samples = [{"genome": g, "status": r.status.value, "ms": r.ms, "first_call_s": r.first_call_s}
               for (_, _, g), r in zip(configs, results)]
    return dict(row, configs=len(cands), screened=len(results), statuses=statuses, screen_wall_s=round(wall, 2),
                per_gpu_minute=round(len(results) / wall * 60, 1) if wall > 0 else None,
                fastest_screen_ms=timed[0][0] if timed else None, judged=judged,
                stage_s={k: round(sum(b[k] for b in stages), 2) for k in ("reference_s", "check_s", "time_s")},
                samples=samples, knob_bests=knob_bests(samples),
                batches=stages, first_call_s=dict(
                    median=statistics.median(compiles) if compiles else None, max=compiles[-1] if compiles else None,
                    over_10s=sum(c > 10 for c in compiles)),
                median_judge_over_screen=statistics.median(j / s for s, j in pairs) if pairs else None,
                spearman=spearman(pairs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--problems", nargs="+", default=["layernorm_fp32"])
    ap.add_argument("--configs", type=int, default=240, help="distinct configurations per problem")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--parallel", type=int, help="check processes (default: from the cores and device memory)")
    ap.add_argument("--judge", type=int, default=5, help="fastest by screen time to judge as well")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--template-timeout", type=float, default=30.0, help="a template candidate's, on the GPU")
    ap.add_argument("--timing-budget-ms", type=float, default=300.0, help="the judge's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", action="store_true", help="judge eager and torch.compile as well, for scale")
    ap.add_argument("--small", action="store_true", help="the problems at their SMALL sizes (for the CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    caches = Path(tempfile.mkdtemp(prefix="screen-caches-"))
    os.environ["TRITON_CACHE_DIR"] = str(caches / "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
    import torch
    import triton

    from kernelevolve.machine import device_key

    paths = suite.problem_paths(args.problems)
    if args.small:
        paths = [suite.write_small_copy(p, caches / "problems") if "SMALL" in p.read_text() else p for p in paths]
    rows = [run_problem(p, args) for p in paths]
    out = {"date": time.strftime("%Y-%m-%d"), "device": device_key(args.device),
           "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
           "torch": torch.__version__, "triton": triton.__version__, "command": " ".join(sys.argv), "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(f"{'problem':<28} {'configs':>7} {'per GPU-min':>11} {'fastest ms':>10} {'judge/screen':>12} "
          f"{'rank corr':>9}  statuses")
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:<28} {r['error']}")
            continue
        fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
        print(f"{r['problem']:<28} {r['screened']:>7} {fmt(r['per_gpu_minute'], '.1f'):>11} "
              f"{fmt(r['fastest_screen_ms'], '.4g'):>10} {fmt(r['median_judge_over_screen'], '.3f'):>12} "
              f"{fmt(r['spearman'], '.2f'):>9}  {r['statuses']}")
        if "eager_ms" in r:
            print(f"{'':<28} eager {fmt(r['eager_ms'], '.4g')} ms, torch.compile {fmt(r['compile_ms'], '.4g')} ms")
        for region, knobs in r["knob_bests"].items():
            for knob, best in knobs.items():
                print(f"{'':<28} fastest by {region} {knob}: "
                      + ", ".join(f"{v} {ms:.4g} ms" for v, ms in list(best.items())[:6]))
        st, fc = r["stage_s"], r["first_call_s"]
        print(f"{'':<28} reference {st['reference_s']:.1f} s, check {st['check_s']:.1f} s, time {st['time_s']:.1f} s;"
              f" first call median {fmt(fc['median'], '.2f')} s, max {fmt(fc['max'], '.1f')} s, "
              f"{fc['over_10s']} over 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
