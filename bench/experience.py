"""Experience benchmark: does a run that follows an earlier run on a similar problem reach a good kernel in fewer
evaluations?

    PYTHONPATH=src python3 bench/experience.py --device cuda --gpus 2 --budget-s 40 --json bench/results/exp.json
    TRITON_INTERPRET=1 python3 bench/experience.py --device cpu --small --pairs softmax_bf16 --budget-s 20  # smoke

For each pair: the target B is a suite problem, and the source A is the same file with one batch-like size scaled
(``PAIRS``), so A and B share their operator and dtype but not their shapes.
- cold: B alone in an empty store. T is its best time, and n_cold the number of candidates it took to find it
  (screened ones included; ``judged_cold`` counts the judge's only).
- warm: A, then B, in another empty store. n_warm is the number of B's own candidates until a node came within
  ``--tol`` of T (``judged_warm``: the judge's only). A kernel already known for B costs none; A's kernels are never
  B's.
- ratio = n_cold / n_warm: how many times fewer candidates the warm run needed. None when the warm run never came
  within the tolerance, and then the row says so.
Both runs of B have the same budget and proposers. Times are medians measured by the harness, in the same process,
on the same GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import suite  # noqa: E402  (bench/suite.py)

if TYPE_CHECKING:
    from kernelevolve.rows import Node

# target problem -> the module-level size constants scaled to make its similar source problem
PAIRS: dict[str, dict[str, float]] = {
    "softmax_bf16": {"ROWS": 0.5},
    "layernorm_bf16": {"TOKENS": 0.5},
    "rmsnorm_residual_bf16": {"TOKENS": 0.5},
    "cross_entropy_bf16": {"TOKENS": 0.5},
    "embedding_bag_sum": {"BAGS": 0.5},
    "jagged_mean_offsets_bf16": {"BATCH": 0.5},
    "dlrm_interaction_einsum_bf16": {"BATCH": 0.5},
    "hstu_attention_bf16": {"HEADS": 0.5},
}


def scaled_source(source: str, factors: dict[str, float]) -> str:
    """``source`` with each named ``NAME = <int>`` module-level constant multiplied by its factor (at least 1)."""
    for name, factor in factors.items():
        pattern = re.compile(rf"^({re.escape(name)}[ \t]*=[ \t]*)([0-9_]+)", re.M)
        found = pattern.search(source)
        if found is None:
            raise suite.SuiteError(f"no module-level line `{name} = <int>` to scale")
        value = max(1, int(int(found.group(2).replace("_", "")) * factor))
        source = source[:found.start(2)] + str(value) + source[found.end(2):]
    return source


def write_pair(stem: str, small: bool, dest: Path) -> tuple[Path, Path]:
    """(source problem A, target problem B) files for ``stem``."""
    dest.mkdir(parents=True, exist_ok=True)
    text = (suite.PROBLEMS / f"{stem}.py").read_text()
    if small:
        text = suite.small_source(text)
    target, similar = dest / f"{stem}.py", dest / f"{stem}__similar.py"
    target.write_text(text)
    similar.write_text(scaled_source(text, PAIRS[stem]))
    return similar, target


def evaluations_to(nodes: list[Node], within_ms: float, judged_only: bool = False) -> int | None:
    """How many of a run's own candidates came before (and including) the first node at or under ``within_ms``,
    screened ones included (the judge's only with ``judged_only``); a reused node (already known) adds none."""
    count = 0
    for node in nodes:
        if not node.cached and (node.result is not None or not judged_only):
            count += 1
        if node.runtime_ms is not None and node.runtime_ms <= within_ms:
            return count
    return None


def trace(nodes: list[Node]) -> list[list[Any]]:
    """[label, judged ms or status, screen ms or status, source sha] of each of a run's own candidates, in order: to
    see which candidate reached what. Labels name a change from a parent, so the sha tells whether two runs tried
    the same kernel."""
    def outcome(ms: float | None, status: Any) -> Any:
        return round(ms, 5) if ms is not None else (str(status.value) if status is not None else None)

    out: list[list[Any]] = []
    for node in nodes:
        if node.cached:
            continue
        r, sr = node.result, node.screen
        out.append([node.label, outcome(node.runtime_ms, r.status if r else None),
                    outcome(sr.ms if sr else None, sr.status if sr else None), node.sha[:12]])
    return out


def run_pair(stem: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from kernelevolve.optimize import OptimizeConfig, optimize
    from kernelevolve.search import best_node
    from kernelevolve.store import Store

    row: dict[str, Any] = {"problem": stem, "scaled": PAIRS[stem]}
    t0 = time.monotonic()
    try:
        similar, target = write_pair(stem, args.small, work / "problems")
        cfg = OptimizeConfig(device=args.device, proposers=tuple(args.proposer.split(",")), max_evals=args.max_evals,
                             time_budget_s=args.budget_s, stall=None, timing_budget_ms=args.timing_budget_ms)
        cold_store, warm_store = Store(work / "cold.db"), Store(work / "warm.db")
        cold = optimize(target, cfg, cold_store, work / "cold")
        cold_nodes = cold_store.nodes(cold.run_id)
        best, _ = best_node(cold_nodes)
        if best is None or best.runtime_ms is None:
            row["error"] = "the cold run found no timed kernel"
            return row
        t_best = best.runtime_ms
        row.update(cold_ms=t_best, cold_evals=cold.search.evaluations, cold_screened=cold.search.screened,
                   n_cold=evaluations_to(cold_nodes, t_best),
                   judged_cold=evaluations_to(cold_nodes, t_best, judged_only=True),
                   cold_best=best.label, cold_trace=trace(cold_nodes))
        source_run = optimize(similar, cfg, warm_store, work / "similar")
        row["source_evals"] = source_run.search.evaluations
        warm = optimize(target, cfg, warm_store, work / "warm")
        nodes = warm_store.nodes(warm.run_id)
        wbest, _ = best_node(nodes)
        row.update(warm_ms=wbest.runtime_ms if wbest else None,
                   warm_evals=warm.search.evaluations, warm_screened=warm.search.screened,
                   n_warm=evaluations_to(nodes, t_best * (1 + args.tol)),
                   judged_warm=evaluations_to(nodes, t_best * (1 + args.tol), judged_only=True),
                   warm_best=wbest.label if wbest else None, warm_trace=trace(nodes))
        row["ratio"] = row["n_cold"] / row["n_warm"] if row["n_cold"] and row["n_warm"] else None
        if row["n_warm"] is None:
            row["note"] = f"the warm run never came within {100 * args.tol:.0f}% of the cold best"
        elif row["n_warm"] == 0:
            row["note"] = "a kernel already known for this problem reached it, with no evaluation"
        cold_store.close()
        warm_store.close()
    except Exception as e:  # one pair's failure is recorded and the benchmark goes on
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
    finally:
        row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if "error" not in r]
    return {"pairs": len(rows), "measured": len(done), "reached": sum(r.get("n_warm") is not None for r in done),
            "geomean_ratio": suite.geomean([r["ratio"] for r in done if r.get("ratio")]),
            # both sums over the pairs whose warm run reached the cold best, so that they compare
            "cold_evals_to_best": sum(r["n_cold"] or 0 for r in done if r.get("n_warm") is not None),
            "warm_evals_to_reach": sum(r["n_warm"] for r in done if r.get("n_warm") is not None),
            "cold_evals_all": sum(r["n_cold"] or 0 for r in done)}


def print_table(rows: list[dict[str, Any]]) -> None:
    fmt = lambda v, spec=".4g": "—" if v is None else format(v, spec)  # noqa: E731
    print(f"{'problem':30s} {'cold ms':>9} {'n_cold':>6} {'judged':>6} {'warm ms':>9} {'n_warm':>6} {'judged':>6} "
          f"{'ratio':>6}  note")
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:30s} error: {r['error'][:200]}")
            continue
        print(f"{r['problem']:30s} {fmt(r.get('cold_ms')):>9} {fmt(r.get('n_cold'), 'd'):>6} "
              f"{fmt(r.get('judged_cold'), 'd'):>6} {fmt(r.get('warm_ms')):>9} {fmt(r.get('n_warm'), 'd'):>6} "
              f"{fmt(r.get('judged_warm'), 'd'):>6} {fmt(r.get('ratio'), '.2f'):>6}  "
              f"{r.get('note', '')}")
    s = summarize(rows)
    print(f"pairs {s['pairs']}, measured {s['measured']}, reached {s['reached']}; geomean ratio "
          f"{fmt(s['geomean_ratio'], '.2f')}; candidates where the warm run reached: {s['cold_evals_to_best']} "
          f"cold to best, {s['warm_evals_to_reach']} warm to reach ({s['cold_evals_all']} cold in all)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), help="default: all")
    ap.add_argument("--proposer", default="template,inductor")
    ap.add_argument("--budget-s", type=float, default=40.0, help="search time of each of the three runs")
    ap.add_argument("--max-evals", type=int, default=40)
    ap.add_argument("--timing-budget-ms", type=float, default=300.0)
    ap.add_argument("--tol", type=float, default=0.02, help="how close to the cold best counts as reached")
    ap.add_argument("--small", action="store_true", help="the problems' SMALL sizes (a CPU smoke test)")
    ap.add_argument("--gpus", type=int, default=1, help="split the pairs across N GPUs, one process each")
    ap.add_argument("--out-dir", type=Path, default=Path("out/experience"))
    ap.add_argument("--json", type=Path, help="default: OUT_DIR/experience.json")
    ap.add_argument("--deadline-s", type=float, help="start no pair after this many seconds")
    ap.add_argument("--resume", action="store_true", help="keep the pairs already measured in --json (those without an "
                    "error) and run only the others")
    ap.add_argument("--shard", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    from kernelevolve.machine import versions

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out_dir.resolve()
    path = (args.json or out / "experience.json").resolve()
    stems = args.pairs or list(PAIRS)
    if args.resume and args.gpus > 1:
        print("error: --resume goes on from one JSON: run it on one GPU (without --gpus)", file=sys.stderr)
        return 2
    if args.gpus > 1 and not args.shard:
        procs = []
        for i in range(args.gpus):
            cmd = [sys.executable, __file__, *argv, "--shard", f"{i}/{args.gpus}", "--json", str(out / f"shard{i}.json")]
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"shard{i}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}, stdout=log,
                                              stderr=subprocess.STDOUT))
        for p in procs:
            p.wait()
        shards = [json.loads((out / f"shard{i}.json").read_text()) for i in range(args.gpus)
                  if (out / f"shard{i}.json").exists()]
        rows = [r for data in shards for r in data["rows"]]
        head = {k: v for k, v in (shards[0] if shards else {}).items() if k not in ("rows", "summary")}
    else:
        if args.shard:
            i, n = (int(v) for v in args.shard.split("/"))
            stems = stems[i::n]
        command = " ".join(["python3", __file__, *argv])
        head = {"date": time.strftime("%Y-%m-%d"), "device": args.device,
                "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", **versions(),
                "command": command, "budget_s": args.budget_s, "max_evals": args.max_evals,
                "proposers": args.proposer, "tol": args.tol, "small": args.small}
        rows = []
        if args.resume:
            want = {k: head[k] for k in ("device_name", "budget_s", "max_evals", "proposers", "tol", "small")}
            try:
                rows = [r for r in suite.earlier_rows(path, head, want) if "error" not in r]
            except suite.SuiteError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            done = {r["problem"] for r in rows}
            print(f"--resume: {len(done & set(stems))} pair(s) already in {path.name}", flush=True)
            stems = [s for s in stems if s not in done]
        head["commands"] = [*head.get("commands", []), command]  # every call that wrote these rows
        began = time.monotonic()
        for k, stem in enumerate(stems):
            if suite.past_deadline(began, args.deadline_s, len(stems) - k, "pair"):
                break
            print(f"{stem} ...", flush=True)
            rows.append(run_pair(stem, args, out / stem))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**head, "rows": rows, "summary": summarize(rows)}, indent=2, default=str))
    if not args.shard:
        print_table(rows)
        if args.gpus > 1:
            head["command"] = " ".join(["python3", __file__, *argv])
            path.write_text(json.dumps({**head, "rows": rows, "summary": summarize(rows)}, indent=2, default=str))
        print(f"rows: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
