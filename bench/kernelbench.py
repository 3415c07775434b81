"""KernelBench through kernelevolve's own harness: a level, or a list of problems, one row each as it finishes.

    PYTHONPATH=src python3 bench/kernelbench.py --level 1 --judge-only --json bench/results/kb-l1-judge.json
    PYTHONPATH=src python3 bench/kernelbench.py --problems 19_ReLU 2_Standard --budget-s 60 --json out/kb.json
    PYTHONPATH=src python3 bench/kernelbench.py --level 1 2 --matched bench/results/2026-12-02-kernelbench-coverage.json

The problems are read in place from ../shared/kernelbench (``--root``), at the sizes KernelBench sets. Every row is
written to the JSON as soon as its problem finishes, and a run started again with the same ``--json`` skips the
problems already there (``--fresh`` starts over), so a pass can be spread over several calls.

``--judge-only`` judges the three baselines as candidates: the reference itself (eager), torch.compile, and
torch.compile max-autotune. No genuine baseline should fail the judge; the rows give each one's status and reason,
its time, and the judge's own seconds for it against the problem's size. Without it, each problem is optimized with
the suite's settings (bench/suite.py) and the rows give correctness, fast_0 and fast_1 against eager and against
torch.compile as KernelBench defines them: the fraction of all problems whose kernel is correct and more than p times
faster than that baseline.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parent.parent / "shared" / "kernelbench"
BASELINES = ("eager", "compile", "max_autotune")
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"


class KernelBenchError(Exception):
    pass


# --- problems ---------------------------------------------------------------------------------------------------------
def problem_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def _kb_order(row: dict[str, Any]) -> tuple[str, int, str]:
    """Rows in KernelBench's order (level, then problem number), whichever call added them."""
    level, _, stem = str(row.get("problem", "")).rpartition("/")
    return level, _number(Path(stem)), stem


def _number(path: Path) -> int:
    head = path.stem.split("_", 1)[0]
    return int(head) if head.isdigit() else 10**6


def select_problems(root: Path, levels: list[int], names: list[str] | None) -> list[Path]:
    """The problems of the given levels, in KernelBench's numeric order; or those named by stem, stem prefix, number
    or ``levelN/stem``."""
    if not root.is_dir():
        raise KernelBenchError(f"{root}: no KernelBench folder (pass --root)")
    every = [p for level in levels for p in sorted((root / f"level{level}").glob("*.py"), key=_number)]
    if not names:
        return every
    chosen: list[Path] = []
    for name in names:
        hits = [p for p in every if name in (p.stem, problem_id(p), str(_number(p)))] or \
               [p for p in every if p.stem.startswith(name)]
        if not hits:
            raise KernelBenchError(f"no problem of level(s) {levels} matches {name!r}")
        chosen += [p for p in hits if p not in chosen]
    return chosen


def draw(paths: list[Path], n: int, seed: int) -> list[Path]:
    """``n`` of ``paths`` drawn at random with ``seed`` (the same draw for the same seed and corpus), in KernelBench's
    order: a sample of what users will meet, not of what a family already matches."""
    chosen = set(random.Random(seed).sample(range(len(paths)), min(n, len(paths))))
    return [p for i, p in enumerate(paths) if i in chosen]


def matched_problems(paths: list[Path], coverage: Path, families: list[str] | None = None,
                     min_share: float = 0.0) -> list[Path]:
    """Those of ``paths`` that a template family matches in a coverage table (bench/coverage.py --json), with at least
    one region of ``families`` when given, and at least ``min_share`` of their ATen ops claimed."""
    try:
        rows = {r["problem"]: r for r in json.loads(coverage.read_text())["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KernelBenchError(f"{coverage}: not a coverage table ({type(e).__name__}: {e})") from e
    known = {r.get("family") for row in rows.values() for r in row.get("regions") or []}
    unknown = sorted(set(families or []) - known)
    if unknown:
        raise KernelBenchError(f"no region of family {', '.join(unknown)} in {coverage}; its families: "
                               f"{', '.join(sorted(f for f in known if f))}")
    keep = []
    for p in paths:
        row = rows.get(problem_id(p), {})
        regions = row.get("regions") or []
        if regions and (not families or any(r.get("family") in families for r in regions)) \
                and (row.get("claimed_share") or 0.0) >= min_share:
            keep.append(p)
    return keep


# --- judge-only: the three baselines as candidates ----------------------------------------------------------------------
def baseline_candidates(source: str) -> dict[str, Any]:
    from kernelevolve.candidate import Candidate
    from kernelevolve.report import reference_candidate
    from kernelevolve.propose.inductor import SEEDS, render

    seeds = dict(SEEDS)
    return {"eager": Candidate(reference_candidate(source, "the eager baseline"), proposer="reference"),
            "compile": Candidate(render(source, seeds["default"], "default"), proposer="inductor",
                                 language="inductor"),
            "max_autotune": Candidate(render(source, seeds[MAX_AUTOTUNE], MAX_AUTOTUNE), proposer="inductor",
                                      language="inductor")}


def judge_problem(path: Path, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Judge eager, then (when eager is under --max-eager-ms) torch.compile and max-autotune."""
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
    from kernelevolve.problem import load_problem

    row: dict[str, Any] = {"problem": problem_id(path), "mode": "judge-only"}
    t0 = time.monotonic()
    try:
        problem = load_problem(path, device)
        row["load_s"] = round(time.monotonic() - t0, 2)
        cfg = EvalConfig(device=device, timeout_s=args.timeout, trials=args.trials,
                         timing=TimingConfig(budget_ms=args.timing_budget_ms))
        evaluator = Evaluator(problem, cfg, args.out_dir / "work" / path.stem)
        for key, cand in baseline_candidates(problem.source).items():
            eager_ms = row.get("eager_ms")
            if key != "eager" and (eager_ms is None or eager_ms > args.max_eager_ms):
                row[f"{key}_status"] = "skipped"
                row[f"{key}_reason"] = ("eager failed" if eager_ms is None else
                                        f"eager takes {eager_ms:.4g} ms > --max-eager-ms {args.max_eager_ms:g}")
                continue
            r = evaluator.evaluate(cand)
            memory = r.details.get("memory") or {}
            row.update({f"{key}_status": r.status.value, f"{key}_reason": r.reason[:300],
                        f"{key}_ms": r.runtime_ms if r.ok and r.timed else None,
                        f"{key}_judge_s": round(r.wall_s or 0.0, 2), f"{key}_phases_s": r.details.get("phases_s"),
                        f"{key}_peak_device_bytes": r.details.get("peak_device_bytes"),
                        f"{key}_input_sets": r.details.get("input_sets")})
            if not r.ok:
                row[f"{key}_log"] = (r.error or r.log or "")[-800:]
            if memory.get("input_bytes") is not None:
                row.setdefault("input_bytes", memory["input_bytes"])
                row.setdefault("output_bytes", memory["output_bytes"])
            if r.details.get("memory"):
                row[f"{key}_memory"] = {k: memory.get(k) for k in ("keep_on_host", "in_place", "call_bytes")}
        row["status"] = "ok"
    except Exception as e:  # one problem's failure is recorded and the pass goes on
        row.update(status="error", error=f"{type(e).__name__}: {e}"[:1000])
    finally:
        _release(device)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


# --- optimize: correctness and fast_p -----------------------------------------------------------------------------------
def optimize_problem(path: Path, args: argparse.Namespace, device: str, store: Any) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import suite

    cfg = suite.SuiteConfig(device, tuple(p for p in args.proposer.split(",") if p), args.budget_s, args.max_evals,
                            args.timing_budget_ms, False, args.out_dir, args.json, max_autotune=not args.no_max_autotune)
    row = suite.run_problem(path, cfg, store)
    row["problem"], row["mode"] = problem_id(path), "optimize"
    row["correct"] = row.get("kernelevolve_ms") is not None
    _release(device)
    return row


# --- summary ----------------------------------------------------------------------------------------------------------
def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def failed(row: dict[str, Any]) -> bool:
    """A row that did not run through, or in which a judged candidate was not ok."""
    if row.get("status") == "error":
        return True
    if row.get("mode") == "judge-only":
        return any(row.get(f"{k}_status") not in ("ok", "skipped", None) for k in BASELINES)
    return not row.get("correct")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    out: dict[str, Any] = {"problems": n, "errors": sum(r.get("status") == "error" for r in rows)}
    judged = [r for r in rows if r.get("mode") == "judge-only"]
    if judged:
        for key in BASELINES:
            counts: dict[str, int] = {}
            for r in judged:
                status = r.get(f"{key}_status", "error")
                counts[status] = counts.get(status, 0) + 1
            out[f"{key}_statuses"] = counts
        out["genuine_failed"] = sum(r.get(f"{k}_status") not in ("ok", "skipped", None)
                                    for r in judged for k in BASELINES)
        for key in ("compile", "max_autotune"):
            ratios = [_ratio(r.get("eager_ms"), r.get(f"{key}_ms")) for r in judged]
            out[f"geomean_{key}_over_eager"] = geomean([x for x in ratios if x])
    tuned = [r for r in rows if r.get("mode") == "optimize"]
    if tuned:
        m = len(tuned)
        out["correct"] = sum(bool(r.get("correct")) for r in tuned) / m
        for base in ("eager", "compile", "best_baseline"):
            speedups = [r.get(f"speedup_{base}") if r.get("correct") else None for r in tuned]
            out[f"fast_0_{base}"] = sum(s is not None for s in speedups) / m
            out[f"fast_1_{base}"] = sum((s or 0) > 1.0 for s in speedups) / m
            out[f"geomean_speedup_{base}"] = geomean([s for s in speedups if s])
        out["below_best_baseline"] = sum((r.get("speedup_best_baseline") or 1.0) < 1.0 for r in tuned)
        out["do_bench_checked"] = sum(r.get("clock_ratio") is not None for r in tuned)
        out["clocks_disagree"] = sum(bool(r.get("clocks_disagree")) for r in tuned)
    return out


def header(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from kernelevolve.machine import versions

    v = versions()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return {"date": dt.date.today().isoformat(), "device": device, "device_name": name, "torch": v["torch"],
            "triton": v["triton"], "python": v["python"], "command": " ".join(["python3"] + sys.argv),
            "mode": "judge-only" if args.judge_only else "optimize", "timing_budget_ms": args.timing_budget_ms,
            "max_eager_ms": args.max_eager_ms, "kernelbench": str(args.root)}


def write_json(path: Path, head: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**head, "rows": rows, "summary": summarize(rows)}, indent=2, default=str))
    os.replace(tmp, path)


def load_rows(path: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(path.read_text())["rows"])
    except (OSError, ValueError, KeyError):
        return []


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.0f}"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 170
    judged = [r for r in rows if r.get("mode") == "judge-only"]
    if judged:
        table = Table(title="judge-only: each baseline judged as a candidate (ms; judge s)")
        for col in ("problem", "in+out MB", "eager", "compile", "max-at", "judge s e/c/m", "failed"):
            table.add_column(col, justify="left" if col in ("problem", "failed") else "right", no_wrap=True)
        for r in judged:
            failed = [f"{k}: {r.get(f'{k}_status')}" for k in BASELINES
                      if r.get(f"{k}_status") not in ("ok", "skipped", None)]
            size = (r.get("input_bytes") or 0) + (r.get("output_bytes") or 0) if r.get("input_bytes") else None
            judge = "/".join(f"{r[f'{k}_judge_s']:.0f}" if r.get(f"{k}_judge_s") is not None else "—"
                             for k in BASELINES)
            table.add_row(r["problem"], _mb(size), *(_ms(r.get(f"{k}_ms")) for k in BASELINES), judge,
                          r.get("error", "")[:60] or "; ".join(failed)[:60])
        console.print(table)
    s = summarize(rows)
    console.print(json.dumps(s, default=str), markup=False)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as markdown tables (for bench/results/README.md): judge-only rows, then optimized ones with the
    summary (correctness, fast_1 and the geomean against eager and torch.compile)."""
    tables = [t for t in (_judge_table(rows), _optimize_table(rows)) if t]
    return "\n\n".join(tables)


def _optimize_table(rows: list[dict[str, Any]]) -> str:
    tuned = [r for r in rows if r.get("mode") == "optimize"]
    if not tuned:
        return ""
    lines = ["| problem | correct | eager ms | compile ms | kernelevolve ms | vs eager | vs compile | vs best | "
             "do_bench vs eager | device / host / graph ms | winner |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tuned:
        def x(v: Any) -> str:
            return f"{v:.2f}x" if v else "—"
        why = (r.get("error") or "").replace("|", "/")[:60]
        c = r.get("clocks") or {}
        clocks = " / ".join(_ms(c.get(k)) for k in ("device_ms", "host_ms", "graph_ms"))
        flag = " (differs)" if r.get("clocks_disagree") else ""
        lines.append(f"| {r['problem'].split('/')[-1]} | {'yes' if r.get('correct') else 'no'} | "
                     f"{_ms(r.get('eager_ms'))} | {_ms(r.get('compile_ms'))} | {_ms(r.get('kernelevolve_ms'))} | "
                     f"{x(r.get('speedup_eager'))} | {x(r.get('speedup_compile'))} | "
                     f"{x(r.get('speedup_best_baseline'))} | "
                     f"{x((r.get('do_bench') or {}).get('speedup_eager'))}{flag} | "
                     f"{clocks}{' launch-bound' if c.get('launch_bound') else ''} | "
                     f"{r.get('best_proposer') or '—'} {(r.get('best_label') or '')[:30]}{'; ' + why if why else ''} |")
    s = summarize(rows)
    lines.append("")
    lines.append(f"{len(tuned)} problems: correct {s.get('correct', 0):.2f}; fast_1 against eager "
                 f"{s.get('fast_1_eager', 0):.2f}, against torch.compile {s.get('fast_1_compile', 0):.2f}; geomean "
                 f"{s.get('geomean_speedup_eager') or 0:.2f}x over eager, {s.get('geomean_speedup_compile') or 0:.2f}x "
                 f"over torch.compile, {s.get('geomean_speedup_best_baseline') or 0:.2f}x over the best baseline; "
                 f"{s.get('below_best_baseline', 0)} below the best baseline; do_bench checked "
                 f"{s.get('do_bench_checked', 0)}, {s.get('clocks_disagree', 0)} differ by more than 5%")
    return "\n".join(lines)


def _judge_table(rows: list[dict[str, Any]]) -> str:
    if not any(r.get("mode") == "judge-only" for r in rows):
        return ""
    lines = ["| problem | in+out GB | eager ms | compile ms | max-at ms | judge s (eager / compile / max-at) "
             "| input sets | child peak GB | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("mode") != "judge-only":
            continue
        size = (r.get("input_bytes") or 0) + (r.get("output_bytes") or 0)
        judge = " / ".join(f"{r[f'{k}_judge_s']:.1f}" if r.get(f"{k}_judge_s") is not None else "—"
                           for k in BASELINES)
        peak = max((r.get(f"{k}_peak_device_bytes") or 0 for k in BASELINES), default=0)
        bad = [f"{k}: {r.get(f'{k}_status')}" for k in BASELINES if r.get(f"{k}_status") not in ("ok", "skipped", None)]
        why = (r.get("error") or "; ".join(bad) or "").replace("|", "/")[:80]
        lines.append(f"| {r['problem'].split('/')[-1]} | {size / 1e9:.2f} | "
                     + " | ".join(_ms(r.get(f"{k}_ms")) for k in BASELINES)
                     + f" | {judge} | {r.get('eager_input_sets') or '—'} | {peak / 1e9:.1f} | {why} |")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the KernelBench folder (levelN/*.py)")
    ap.add_argument("--level", type=int, nargs="+", default=[1])
    ap.add_argument("--problems", nargs="+", help="stems, stem prefixes, numbers or levelN/stem")
    ap.add_argument("--matched", type=Path, metavar="COVERAGE_JSON",
                    help="keep only the problems a template family matches in this table (bench/coverage.py --json)")
    ap.add_argument("--families", nargs="+", help="with --matched: only problems with a region of these families")
    ap.add_argument("--min-claimed", type=float, default=0.0, metavar="SHARE",
                    help="with --matched: only problems with at least this share of their ops claimed (1 = all)")
    ap.add_argument("--limit", type=int, help="at most this many problems, in order")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="N problems drawn at random from the levels' problems (with --seed), whatever they match")
    ap.add_argument("--seed", type=int, default=0, help="the seed of --sample's draw")
    ap.add_argument("--device", choices=("cuda", "cpu"))
    ap.add_argument("--judge-only", action="store_true", help="judge eager, torch.compile and max-autotune only")
    ap.add_argument("--max-eager-ms", type=float, default=100.0,
                    help="judge-only: skip compile and max-autotune where eager is slower than this")
    ap.add_argument("--proposer", default="template,inductor")
    ap.add_argument("--budget-s", type=float, default=60.0, help="search time per problem")
    ap.add_argument("--max-evals", type=int, default=40)
    ap.add_argument("--no-max-autotune", action="store_true",
                    help="optimize: do not judge the max-autotune baseline first (fast_p and the geomean are against "
                         "eager and torch.compile; the search's inductor proposer may still try it)")
    ap.add_argument("--timing-budget-ms", type=float, default=300.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per evaluation")
    ap.add_argument("--deadline-s", type=float, help="start no problem after this many seconds (resume later)")
    ap.add_argument("--json", type=Path, default=Path("out/kernelbench/kernelbench.json"))
    ap.add_argument("--out-dir", type=Path, default=Path("out/kernelbench"))
    ap.add_argument("--fresh", action="store_true", help="ignore the rows already in --json")
    ap.add_argument("--markdown", action="store_true", help="print the rows in --json as a markdown table; run nothing")
    ap.add_argument("--retry-failed", action="store_true",
                    help="run again the rows in --json that failed (an error, or a baseline not ok), replacing them")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.markdown:
        print(markdown_table(load_rows(args.json)))
        return 0
    sys.path.insert(0, str(HERE.parent / "src"))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.out_dir, args.json = args.out_dir.resolve(), args.json.resolve()
    try:
        paths = select_problems(args.root.resolve(), args.level, args.problems)
        if args.matched:
            paths = matched_problems(paths, args.matched, args.families, args.min_claimed)
        elif args.families or args.min_claimed:
            raise KernelBenchError("--families and --min-claimed need --matched")
        if args.sample is not None:
            if args.matched or args.problems:
                raise KernelBenchError("--sample draws from all of the levels' problems: not with --matched or "
                                       "--problems")
            paths = draw(paths, args.sample, args.seed)
        if args.limit is not None and args.limit < 1:
            raise KernelBenchError(f"--limit {args.limit}: give at least 1")
        paths = paths[:args.limit] if args.limit is not None else paths
    except KernelBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = [] if args.fresh else load_rows(args.json)
    if args.retry_failed:
        rows = [r for r in rows if not failed(r)]
    done = {r["problem"] for r in rows}
    todo = [p for p in paths if problem_id(p) not in done]
    head, store, t0 = header(args, device), None, time.monotonic()
    print(f"{len(paths)} problem(s): {len(paths) - len(todo)} already in {args.json}, {len(todo)} to run", flush=True)
    for i, path in enumerate(todo, 1):
        if args.deadline_s is not None and time.monotonic() - t0 > args.deadline_s:
            print(f"--deadline-s {args.deadline_s:g} reached: {len(todo) - i + 1} left; run again to resume")
            break
        print(f"[{i}/{len(todo)}] {problem_id(path)} ...", flush=True)
        if args.judge_only:
            row = judge_problem(path, args, device)
        else:
            if store is None:
                from kernelevolve.store import Store

                store = Store(args.out_dir / "kernelbench.db")
            row = optimize_problem(path, args, device, store)
        rows.append(row)
        rows.sort(key=_kb_order)
        write_json(args.json, head, rows)
        brief = {k: row.get(k) for k in ("status", "eager_ms", "compile_ms", "max_autotune_ms", "wall_s")}
        bad = {k: row.get(f"{k}_reason") for k in BASELINES
               if str(row.get(f"{k}_status") or "ok").split(":")[0] not in ("ok", "skipped")}
        print(f"[{i}/{len(todo)}] {problem_id(path)}: {brief}{' FAILED: ' + str(bad) if bad else ''}"
              f"{' error: ' + row['error'][:200] if row.get('error') else ''}", flush=True)
    if store is not None:
        store.close()
    print_table(rows)
    print(f"rows: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
