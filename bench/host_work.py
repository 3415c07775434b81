"""The host work of a template candidate's forward: what one call costs the CPU before and around its kernels
(finding its state, the shape guard, views, output buffers, grids), with every Triton launch replaced by a no-op.
It is the part of a call the device waits for when a problem's kernels are shorter than their launches.

    PYTHONPATH=src python3 bench/host_work.py --problems dcn_v2_cross_bf16 layernorm_bf16 --json out/host_work.json

Each problem runs at its SMALL sizes (the host work does not depend on them; small buffers keep the CPU allocator out
of the time) with the template proposer's default candidate. The time is the fastest of several loops of many
calls on this CPU: a floor, without Triton's own launch cost and without a device.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent)]
sys.path.insert(0, str(HERE))

from record import record, write  # noqa: E402  (bench/record.py)


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: Any):
        return lambda *args, **kwargs: None


def host_us(path: Path, calls: int, loops: int) -> dict[str, Any]:
    import torch

    from kernelevolve.problem import import_module_from_path, load_problem, make_inputs
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.templates.base import load_source
    from tests.benchsuite import load_suite

    small = load_suite().write_small_copy(path, Path(tempfile.mkdtemp()))
    cands = TemplateProposer("cuda", seed=0).propose(ProposalContext(load_problem(small, "cpu"), "cuda", None, []), 1)
    if not cands:
        return {"problem": path.stem, "error": "no template candidate"}
    module = load_source(cands[0].source, f"host_work_{path.stem}")
    kernels = [name for name in dir(module) if hasattr(getattr(module, name), "fn")
               and hasattr(getattr(module, name), "__getitem__")]
    for name in kernels:
        setattr(module, name, _NoLaunch())
    ref = import_module_from_path(small, f"host_work_ref_{path.stem}")
    model = module.ModelNew(*ref.get_init_inputs())
    inputs = make_inputs(ref, 0)
    times = []
    with torch.no_grad():
        for _ in range(200):
            model(*inputs)
        for _ in range(loops):
            t0 = time.perf_counter()
            for _ in range(calls):
                model(*inputs)
            times.append((time.perf_counter() - t0) / calls * 1e6)
    return {"problem": path.stem, "regions": len(cands[0].meta["configs"]), "stubbed": len(kernels),
            "host_us": round(min(times), 1), "loops_us": [round(t, 1) for t in times]}


def main() -> int:
    from tests.benchsuite import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="suite problem stems (default: all)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--loops", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from kernelevolve.profile import _device_name

    rows = []
    for path in load_suite().problem_paths(args.problems or None):
        row = host_us(path, args.calls, args.loops)
        rows.append(row)
        print(f"{row['problem']:28s} {row.get('host_us', row.get('error'))} us a call"
              f" ({row.get('regions', 0)} regions, {row.get('stubbed', 0)} jit functions stubbed)", flush=True)
    write(args.json, record("host_work.py", rows, cpu=_device_name("cpu")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
