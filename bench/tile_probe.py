"""What one template configuration compiles to on this machine's Triton: each kernel's registers, spilled
registers and tensor-core instructions (Hopper's wgmma, the older mma.sync), the largest error against the
reference, and a rough time. For a tile whose fate depends on the compiler (a 64-row tile of a GEMM + row reduction,
say), where an sm_90 compile on another Triton (tests/templates/compile_sm90.py) may not tell.

    PYTHONPATH=src python3 bench/tile_probe.py --device cuda --json out/tiles.json
    PYTHONPATH=src python3 bench/tile_probe.py --device cuda --problem gemm/linear_softmax_bf16 \\
        --set BLOCK_M=64,num_warps=8 --set BLOCK_M=32,num_warps=8

Each ``--set`` is one configuration: the template proposer's default candidate with those knobs set in every region
whose space has the value (a row's ``not_offered`` names the knobs no region offers at that value). Without
``--problem`` and ``--set``: the GEMM + logsumexp (fp32) and GEMM + softmax (bf16) problems at 64 and 32 rows a tile,
each fp32 product mode. The time is the mean of 50 calls back to back
after 5 warm-up calls, one synchronisation at the end: a diagnostic, not the judge's median. Under the interpreter
(no GPU) only the error means anything.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent)]
sys.path.insert(0, str(HERE))

from record import record, write  # noqa: E402  (bench/record.py)

DEFAULT_SETS = {
    "gemm/linear_logsumexp_fp32": [f"BLOCK_M={bm},INPUT_PRECISION={p},num_warps=8" for bm in (64, 32)
                                   for p in ("ieee", "tf32x3", "split_tf32x3")],
    "gemm/linear_softmax_bf16": [f"BLOCK_M={bm},num_warps=8" for bm in (64, 32)],
}


def override(proposer: Any, problem: Any, cand: Any, knobs: dict[str, str]) -> tuple[Any, list[str]]:
    """(``cand`` rendered again with each knob set wherever a region's space offers that value, or None where it does
    not render; the knobs that no region offers at that value, which the configuration leaves at the candidate's own).
    tests/templates/compile_sm90.py's ``--set`` uses it too."""
    from kernelevolve.candidate import Candidate

    plan = proposer.plan(problem)
    genome = {key: dict(cfg) for key, cfg in cand.meta["genome"].items()}
    applied = set()
    for region in plan.regions:
        for knob, text in knobs.items():
            values = {str(v): v for v in region.space.get(knob, [])}
            if region.key in genome and text in values:
                genome[region.key][knob] = values[text]
                applied.add(knob)
    label = f"{cand.meta['label']}, {', '.join(f'{k}={v}' for k, v in knobs.items())}"
    source = proposer.render(plan, genome, label)
    cand = None if source is None else Candidate(source, proposer="template", language="triton",
                                                 meta=dict(cand.meta, label=label, genome=genome))
    return cand, [k for k in knobs if k not in applied]


def _kernel_row(name: str, kernel: Any) -> dict[str, Any]:
    asm = getattr(kernel, "asm", None) or {}
    ptx = asm.get("ptx", "") if hasattr(asm, "get") else ""
    return {"name": name, "regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
            "wgmma": ptx.count("wgmma.mma_async") if ptx else None, "mma": ptx.count("mma.sync") if ptx else None}


def probe(path: Path, sets: list[str], device: str, small: bool) -> list[dict[str, Any]]:
    import torch
    from triton.runtime.jit import JITFunction

    from kernelevolve.problem import build_model, import_module_from_path, load_problem, make_inputs
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.templates.base import load_source

    if small:
        import tempfile

        from tests.benchsuite import load_suite

        path = load_suite().write_small_copy(path, Path(tempfile.mkdtemp()))
    problem = load_problem(path, device)
    module = import_module_from_path(path, f"tile_probe_{path.stem}")
    ref = build_model(module, "Model", 0).to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in make_inputs(module, 1)]
    proposer = TemplateProposer("cuda", seed=0)
    cands = proposer.propose(ProposalContext(problem, "cuda", None, []), 1)
    if not cands:
        return [{"problem": path.stem, "error": "no template candidate"}]
    launched: list[tuple[str, Any]] = []
    original = JITFunction.run

    def run(self, *args, **kwargs):
        kernel = original(self, *args, **kwargs)
        launched.append((self.fn.__name__, kernel))
        return kernel

    rows = []
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        want = ref(*inputs).float()
        for text in sets:
            knobs = dict(item.split("=", 1) for item in text.split(",") if item)
            row: dict[str, Any] = {"problem": path.stem, "set": knobs}
            try:
                cand, row["not_offered"] = override(proposer, problem, cands[0], knobs)
                if cand is None:
                    raise ValueError("not rendered")
                row["genome"] = cand.meta["genome"]
                model = load_source(cand.source, f"tile_probe_{path.stem}_{len(rows)}").ModelNew(
                    *module.get_init_inputs())
                model.load_state_dict(ref.state_dict())
                model = model.to(device)
                launched.clear()
                JITFunction.run = run
                try:
                    out = model(*inputs)
                    sync()
                finally:
                    JITFunction.run = original
                row["kernels"] = [_kernel_row(name, k) for name, k in launched]
                row["max_err"] = (out.float() - want).abs().max().item()
                for _ in range(5):
                    model(*inputs)
                sync()
                t0 = time.perf_counter()
                for _ in range(50):
                    model(*inputs)
                sync()
                row["mean_ms"] = (time.perf_counter() - t0) / 50 * 1e3
            except Exception as e:  # every configuration reported, whatever one of them does
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--problem", help="a problem under bench/problems, without .py (default: the two of DEFAULT_SETS)")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=V[,KNOB=V]", help="one configuration")
    ap.add_argument("--small", action="store_true", help="the problems' SMALL sizes (a check on the CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.set and not args.problem:
        ap.error("--set needs --problem")
    from kernelevolve.profile import _device_name

    plan = {args.problem: args.set or DEFAULT_SETS.get(args.problem, ["BLOCK_M=64", "BLOCK_M=32"])} \
        if args.problem else DEFAULT_SETS
    rows = []
    for stem, sets in plan.items():
        path = HERE / "problems" / f"{stem}.py"
        if not path.exists():
            ap.error(f"no problem {path}")
        for row in probe(path, sets, args.device, args.small):
            rows.append(row)
            kernels = "; ".join(f"{k['name']}: {k['regs']} regs, {k['spills']} spilled, wgmma {k['wgmma']}, "
                                f"mma {k['mma']}" for k in row.get("kernels", []))
            missing = f"  (not offered: {', '.join(row['not_offered'])})" if row.get("not_offered") else ""
            print(f"{row['problem']:24s} {row['set']}  {row.get('mean_ms', float('nan')):.4f} ms  "
                  f"err {row.get('max_err')}  {row.get('error', kernels)}{missing}", flush=True)
    write(args.json, record("tile_probe.py", rows, device=_device_name(args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
