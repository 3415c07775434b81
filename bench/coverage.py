"""Which template families claim each problem of a corpus, and what they leave to ATen, from the graph alone.

    PYTHONPATH=src python3 bench/coverage.py --root ../shared/kernelbench --json bench/results/coverage.json

Each problem's Model is built and its inputs drawn on the meta device, and the graph is traced with fake tensors, so
a problem of many gigabytes costs nothing to read (a problem whose inputs or forward need real values is traced at
its own sizes on the CPU only with --real). Then every family claims its regions in the registry's order, as the
template proposer does. Per problem: the regions (family, kind, ops) and the ATen ops no family claimed, which say why
the others do not match. The summary counts problems with a region, by family, and the unclaimed ops that block the
most problems: where the library is thinnest.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def problem_files(root: Path, levels: list[int]) -> list[Path]:
    return [p for level in levels for p in sorted((root / f"level{level}").glob("*.py"),
                                                  key=lambda p: (int(p.stem.split("_")[0]) if p.stem.split("_")[0]
                                                                 .isdigit() else 10**6, p.stem))]


def meta_graph(path: Path, real: bool = False) -> Any:
    """The problem's ATen graph, traced with fake tensors from a Model and inputs built on the meta device (with
    ``real``: on the CPU at its own sizes when the meta device cannot run its get_inputs or forward)."""
    import torch

    from kernelevolve.analyze.graph import CapturedGraph, _drop_dead, _trace
    from kernelevolve.problem import import_module_from_path

    module = import_module_from_path(path, f"_coverage_{abs(hash(str(path)))}")
    errors = []
    # fake tensors first; then the meta tensors themselves, which a tensor the forward makes (a constant, a plain
    # attribute) can meet where a fake one cannot; then, with --real, the CPU at the problem's own sizes
    for device, mode in [("meta", "fake"), ("meta", "real")] + ([("cpu", "fake")] if real else []):
        try:
            with torch.device(device):  # tensors the forward makes itself land beside the inputs
                torch.manual_seed(0)
                model = module.Model(*module.get_init_inputs())  # in its constructed mode, as the judge runs it
                inputs = list(module.get_inputs())
                gm, names = _trace(model, inputs, mode)
        except Exception as e:  # record why, try the next way
            errors.append(f"{device}/{mode}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        _drop_dead(gm)
        meta = [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in inputs]
        return CapturedGraph(gm, names, len(inputs), meta, "cpu", "fake", [[], *inputs])
    raise RuntimeError("; ".join(errors))


def _op(node: Any) -> str:
    target = str(node.target)
    return target.split(".")[1] if target.startswith("aten.") else target


def cover(path: Path, real: bool = False) -> dict[str, Any]:
    """One problem's row: its regions, the ATen ops left unclaimed, or why it could not be traced."""
    from kernelevolve.problem import Problem, source_sha
    from kernelevolve.propose.template import claim_regions

    row: dict[str, Any] = {"problem": f"{path.parent.name}/{path.stem}"}
    t0 = time.monotonic()
    try:
        graph = meta_graph(path, real)
    except Exception as e:
        return dict(row, status="not traced", error=str(e)[:500], regions=[], unclaimed={})
    source = path.read_text()
    problem = Problem(path=str(path), source=source, sha=source_sha(source), name=path.stem)
    plan = claim_regions(graph, problem, "cuda")
    claimed = {n for r in plan.regions for n in r.match.nodes}
    unclaimed = collections.Counter(_op(n) for n in graph.calls() if n not in claimed)
    row.update(status="traced", ops=len(graph.calls()), seconds=round(time.monotonic() - t0, 2),
               regions=[{"family": r.match.family, "kind": r.match.kind, "ops": len(r.match.nodes)}
                        for r in plan.regions],
               claimed_share=round(len(claimed) / max(1, len(graph.calls())), 3), unclaimed=dict(unclaimed),
               note=plan.error or "", skipped=plan.skipped)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    traced = [r for r in rows if r["status"] == "traced"]
    by_family: collections.Counter[str] = collections.Counter()
    blockers: collections.Counter[str] = collections.Counter()
    for r in traced:
        by_family.update({x["family"] for x in r["regions"]})
        blockers.update(r["unclaimed"].keys())
    full = [r for r in traced if r["regions"] and not r["unclaimed"]]
    return {"problems": len(rows), "traced": len(traced), "with_a_region": sum(bool(r["regions"]) for r in traced),
            "fully_claimed": len(full), "by_family": dict(by_family.most_common()),
            "top_unclaimed_ops": dict(blockers.most_common(20))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=HERE.parent.parent / "shared" / "kernelbench")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--real", action="store_true", help="trace on the CPU at full size where meta cannot")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    import kernelevolve

    paths = problem_files(args.root, args.levels)
    if not paths:
        print(f"error: no problems under {args.root} for levels {args.levels}", file=sys.stderr)
        return 2
    rows = []
    for i, path in enumerate(paths, 1):
        rows.append(cover(path, args.real))
        r = rows[-1]
        what = ", ".join(f"{f} x{k}" if k > 1 else f for f, k in collections.Counter(
            x["family"] for x in r["regions"]).items()) or "-"
        print(f"[{i}/{len(paths)}] {r['problem']}: {r['status']}; regions: {what}; unclaimed: "
              f"{', '.join(r['unclaimed']) or '-'}", flush=True)
    summary = summarize(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        head = {"date": dt.date.today().isoformat(), "torch": torch.__version__,
                "kernelevolve": getattr(kernelevolve, "__version__", None), "command": " ".join(["python3"] + sys.argv)}
        args.json.write_text(json.dumps({**head, "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
