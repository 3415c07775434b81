"""The GEMM-family table: rows of suite and KernelBench JSON files, against torch.compile max-autotune, with the
fraction of the roofline floor each kernel reaches.

    python3 bench/gemm_table.py bench/results/<suite-40s>.json bench/results/<kernelbench>.json
    python3 bench/gemm_table.py --problems linear_gelu_bf16 swiglu_mlp_bf16 --json gemm.json suite.json

A suite file gives its GEMM problems (``GEMM_SUITE`` and bench/problems/gemm, or ``--problems``); a KernelBench file
(from ``bench/kernelbench.py --matched ... --families matmul``) gives all its rows. A problem in several files keeps
its row of the last one. Per row: eager, torch.compile and max-autotune times, the kernel's, x max-autotune (its
time over the kernel's, measured in the same run), x the best baseline, and the floor fraction (floor time over the
kernel's: 1.0 is the roofline). The summary counts the rows at or above 1.0x max-autotune and gives the geomean over
the best baseline. Nothing is measured here: every number comes from the files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402  (bench/suite.py)

# the 24-problem suite's problems whose time is mostly GEMM (bench/problems/gemm holds the others)
GEMM_SUITE = ("linear_gelu_bf16", "swiglu_mlp_bf16", "multitask_towers_fp16", "dcn_v2_cross_fp32", "dcn_v2_cross_bf16")


def gemm_rows(paths: list[Path], problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The GEMM rows of the files, each with ``file`` (its name) and ``kind`` (suite or kernelbench)."""
    wanted = set(problems) if problems else set(GEMM_SUITE) | {p.stem for p in suite.gemm_paths()}
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        kind = "kernelbench" if "kernelbench" in data or any("/" in r.get("problem", "") for r in data["rows"]) \
            else "suite"
        for row in data["rows"]:
            name = row.get("problem", "")
            if kind == "kernelbench" and problems and name.split("/")[-1] not in wanted and name not in wanted:
                continue
            if kind == "suite" and name not in wanted:
                continue
            rows[name] = {**row, "file": path.name, "kind": kind}
    return list(rows.values())


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets read off the rows: how many reach 1.0x max-autotune (of those it was timed on), the
    geomean over the best baseline, and the floor fractions."""
    vs_ma = [ratio(r.get("max_autotune_ms"), r.get("kernelevolve_ms")) for r in rows]
    timed = [v for v in vs_ma if v is not None]
    floors = sorted(f for f in (r.get("floor_fraction") for r in rows) if f)
    return {"problems": len(rows), "verified": sum(bool(r.get("kernelevolve_ms")) and r.get("status") == "ok"
                                                   for r in rows),
            "max_autotune_timed": len(timed), "at_least_max_autotune": sum(v >= 1.0 for v in timed),
            "min_vs_max_autotune": min(timed) if timed else None,
            "geomean_vs_max_autotune": suite.geomean(timed),
            "geomean_vs_best_baseline": suite.geomean([r.get("speedup_best_baseline") for r in rows]),
            "median_floor_fraction": floors[len(floors) // 2] if floors else None}


def markdown(rows: list[dict[str, Any]]) -> str:
    def ms(v: Any) -> str:
        return f"{v:.4g}" if v else "—"

    def x(v: Any) -> str:
        return f"{v:.3f}x" if v else "—"

    lines = ["| problem | dtype | eager ms | compile ms | max-autotune ms | kernelevolve ms | x max-autotune | "
             "x best baseline | floor fraction | winner |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        frac = r.get("floor_fraction")
        lines.append(f"| {r['problem'].split('/')[-1]} | {r.get('dtype') or '—'} | {ms(r.get('eager_ms'))} | "
                     f"{ms(r.get('compile_ms'))} | {ms(r.get('max_autotune_ms'))} | {ms(r.get('kernelevolve_ms'))} | "
                     f"{x(ratio(r.get('max_autotune_ms'), r.get('kernelevolve_ms')))} | "
                     f"{x(r.get('speedup_best_baseline'))} | {f'{frac:.2f}' if frac else '—'} | "
                     f"{r.get('best_proposer') or '—'} {(r.get('best_label') or '')[:40]} |")
    s = summarize(rows)
    lowest, floor = s["min_vs_max_autotune"], s["median_floor_fraction"]
    lines += ["", f"{s['problems']} problems, {s['verified']} verified; at least 1.0x max-autotune on "
              f"{s['at_least_max_autotune']} of the {s['max_autotune_timed']} it was timed on (lowest "
              f"{'—' if lowest is None else f'{lowest:.4f}x'}); geomean {x(s['geomean_vs_best_baseline'])} over the "
              f"best baseline; median floor fraction {'—' if floor is None else f'{floor:.2f}'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="suite or KernelBench JSON files; a later row replaces an "
                    "earlier one of the same problem")
    ap.add_argument("--problems", nargs="+", help="only these problems (suite stems, KernelBench names)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary here")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.files if not p.exists()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = gemm_rows(args.files, args.problems)
    if not rows:
        print("error: no GEMM rows in these files", file=sys.stderr)
        return 2
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"files": [str(p) for p in args.files], "rows": rows,
                                         "summary": summarize(rows)}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
