"""Merge suite JSON files into one table: a later file's row replaces an earlier row of the same problem.

    python3 bench/merge.py --json bench/results/merged.json first.json@d4fc5e6 rerun.json@a17c7ae \
        --refloor embedding_bag_mean_indexadd

Each input may name the commit it was measured at after an ``@``; every row keeps its source file, commit and command.
An input that is itself a merged file (it has ``sources``, and no ``@``) brings its rows with their own sources.
``--refloor STEM`` recomputes a row's roofline floor here, on the CPU, with the current byte and FLOP counts of the
profile and the datasheet ceilings of the row's GPU: for rows measured before a fix to those counts. Times are never
changed.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import suite  # noqa: E402  (bench/suite.py)


def load(arg: str) -> tuple[dict[str, Any], str | None]:
    path, _, commit = arg.partition("@")
    return json.loads(Path(path).read_text()), commit or None


def refloor(stem: str, device_name: str) -> tuple[float, int]:
    """(floor ms, bytes) of a problem at its full sizes, as the profile computes them on ``device_name``."""
    import torch

    from kernelevolve import profile as prof
    from kernelevolve.problem import as_outputs, build_model, import_module_from_path, load_problem, make_inputs

    path = suite.PROBLEMS / f"{stem}.py"
    problem = load_problem(path, "cpu")
    module = import_module_from_path(path, f"_merge_{stem}")
    model, inputs = build_model(module, "Model", 0), make_inputs(module, 0)
    with torch.no_grad(), prof._tf32(problem.allow_tf32):
        flops, matmul_share, gemm_share = prof._count_flops(model, inputs)
        outputs = as_outputs(model(*inputs))
        nbytes = prof._min_bytes(model, inputs, outputs)
        dtype = prof._dominant_dtype(model, inputs, outputs)
    peak_flops, peak_bw, source = prof._ceilings("cuda", device_name, dtype, problem.allow_tf32, matmul_share >= 0.5,
                                                 False, "cuda", [], gemm=gemm_share >= 0.5)
    if source != "table":
        raise SystemExit(f"no datasheet ceilings for {device_name!r}")
    return max(flops / peak_flops, nbytes / peak_bw) * 1e3, nbytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="suite JSON files, oldest first, each optionally FILE@COMMIT")
    ap.add_argument("--json", type=Path, required=True, help="the merged file to write")
    ap.add_argument("--refloor", nargs="*", default=[], help="problem stems whose floor to recompute")
    args = ap.parse_args(argv)

    rows: dict[str, dict[str, Any]] = {}
    sources, head = [], None
    for arg in args.inputs:
        data, commit = load(arg)
        head = head or {k: v for k, v in data.items() if k not in ("rows", "summary")}
        for key in ("device_name", "torch", "triton", "budget_s", "max_evals", "proposers"):
            if data.get(key) != head.get(key):
                raise SystemExit(f"{arg}: {key} is {data.get(key)!r}, the first file has {head.get(key)!r}")
        name = Path(arg.partition("@")[0]).name
        if "sources" in data and commit is None:  # a merged file: its rows keep their own source and commit
            sources.extend(data["sources"])
            rows.update({r["problem"]: r for r in data["rows"]})
            continue
        sources.append({"file": name, "commit": commit, "command": data["command"], "date": data["date"],
                        "problems": [r["problem"] for r in data["rows"]]})
        for r in data["rows"]:
            rows[r["problem"]] = dict(r, source=name, commit=commit)
    cached = functools.lru_cache(maxsize=None)(refloor)
    for stem in args.refloor:
        if stem not in rows:
            raise SystemExit(f"--refloor {stem}: no such row")
        r = rows[stem]
        old = r.get("floor_ms")
        r["floor_ms"], r["floor_bytes"] = cached(stem, head["device_name"])
        r["notes"] = list(r.get("notes", [])) + [
            f"floor recomputed after the run with the current byte count ({r['floor_bytes']} bytes): "
            f"{r['floor_ms']:.4g} ms, was {old:.4g} ms"]
        r["notes"] = [n for n in r["notes"] if not n.startswith("suspect:")]
        suite.fill_speedups(r)
        if r["suspect"]:
            r["notes"].append("suspect: faster than the roofline floor or >10x over eager")
    order = {p.stem: i for i, p in enumerate(suite.problem_paths(None))}
    merged = sorted(rows.values(), key=lambda r: order.get(r["problem"], len(order)))
    head = dict(head, command="python3 " + " ".join(["bench/merge.py", *(argv or sys.argv[1:])]), sources=sources)
    suite.write_json(args.json, head, merged)
    suite.print_table(merged, suite.summarize(merged))
    print(f"rows: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
