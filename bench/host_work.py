"""The host work of a template candidate's forward: what one call costs the CPU before and around its kernels
(finding its state, the shape guard, views, output buffers, grids), with every Triton launch replaced by a no-op.
It is the part of a call the device waits for when a problem's kernels are shorter than their launches.

    PYTHONPATH=src python3 bench/host_work.py --problems dcn_v2_cross_bf16 layernorm_bf16 --json out/host_work.json

Each problem runs at its SMALL sizes (the host work does not depend on them; small buffers keep the CPU allocator out
of the time) with the template proposer's default candidate. The time is the fastest of several loops of many
calls on this CPU: a floor, without Triton's own launch cost and without a device.

With ``--device cuda`` each problem runs at its full sizes on the GPU, and a call is timed as the judge times its
host work: the device idle before the call, the time from the call to its return. Beside it: the same with the
launches stubbed (the forward's own Python), the reference's eager call, and the functions a call spends its host
time in (cProfile, the ten largest by own time).

    PYTHONPATH=src python3 bench/host_work.py --device cuda --problems attention_manual_fp16 --json out/host_gpu.json
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

    from kernelevolve.problem import import_module_from_path, make_inputs
    from tests.benchsuite import load_suite

    small = load_suite().write_small_copy(path, Path(tempfile.mkdtemp()))
    built = _template_module(small, "cpu")
    if built is None:
        return {"problem": path.stem, "error": "no template candidate"}
    cand, module = built
    stubbed = _stub_launches(module)
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
    return {"problem": path.stem, "regions": len(cand.meta["configs"]), "stubbed": stubbed,
            "host_us": round(min(times), 1), "loops_us": [round(t, 1) for t in times]}


def _template_module(path: Path, tag: str):
    from kernelevolve.problem import load_problem
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.templates.base import load_source

    cands = TemplateProposer("cuda", seed=0).propose(ProposalContext(load_problem(path, "cpu"), "cuda", None, []), 1)
    if not cands:
        return None
    return cands[0], load_source(cands[0].source, f"host_work_{tag}_{path.stem}")


def _stub_launches(module: Any) -> int:
    kernels = [name for name in dir(module) if hasattr(getattr(module, name), "fn")
               and hasattr(getattr(module, name), "__getitem__")]
    for name in kernels:
        setattr(module, name, _NoLaunch())
    return len(kernels)


def _synced_host_us(fn: Any, inputs: list[Any], calls: int) -> list[float]:
    import torch

    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs)
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return out


def _tensors(out: Any) -> list[Any]:
    import torch

    return [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]


class _Direct:
    """An experiment, not a launcher to use: ``kernel[grid](...)`` through Triton once, then straight to the
    compiled kernel's launcher with the same argument order, no specialization checked."""

    def __init__(self, jit: Any):
        import inspect

        self.jit, self.compiled = jit, None
        self.params = list(inspect.signature(jit.fn).parameters.values())

    def __getitem__(self, grid: Any):
        def launch(*args: Any, **kwargs: Any) -> None:
            if self.compiled is None:
                self.compiled = self.jit[grid](*args, **kwargs)
                return
            k = self.compiled
            values = list(args) + [kwargs.get(p.name, p.default) for p in self.params[len(args):]]
            g = tuple(grid) + (1, 1)
            import torch

            k.run(g[0], g[1], g[2], torch.cuda.current_stream().cuda_stream, k.function, k.packed_metadata, None,
                  None, None, *values)

        return launch


def _direct_launches(module: Any) -> dict[str, Any]:
    jits = {name: getattr(module, name) for name in dir(module) if name.endswith("_kernel")
            and hasattr(getattr(module, name), "fn")
            and hasattr(getattr(module, name), "__getitem__") and hasattr(getattr(module, name), "run")}
    for name, jit in jits.items():
        setattr(module, name, _Direct(jit))
    return jits


def host_us_gpu(path: Path, calls: int) -> dict[str, Any]:
    """One problem at its full sizes on the GPU (see the module's doc)."""
    import cProfile
    import pstats
    import statistics

    import torch

    from kernelevolve.problem import import_module_from_path, make_inputs

    built = _template_module(path, "gpu")
    if built is None:
        return {"problem": path.stem, "error": "no template candidate"}
    cand, module = built
    ref = import_module_from_path(path, f"host_work_ref_{path.stem}")
    inputs = make_inputs(ref, 0, device="cuda")
    row: dict[str, Any] = {"problem": path.stem, "regions": len(cand.meta["configs"])}
    with torch.no_grad():
        torch.manual_seed(0)
        eager = ref.Model(*ref.get_init_inputs()).cuda()
        torch.manual_seed(0)
        model = module.ModelNew(*ref.get_init_inputs()).cuda()
        for _ in range(5):  # compiles and loads the kernels
            model(*inputs)
            eager(*inputs)
        row["host_us"] = round(statistics.median(_synced_host_us(model, inputs, calls)), 1)
        row["eager_us"] = round(statistics.median(_synced_host_us(eager, inputs, calls)), 1)
        prof = cProfile.Profile()
        prof.enable()
        _synced_host_us(model, inputs, calls)
        prof.disable()
        stats = pstats.Stats(prof).stats
        own = sorted(((tt, f"{Path(file).name}:{line}({fn})") for (file, line, fn), (_, _, tt, _, _) in stats.items()
                      if fn not in ("synchronize", "_synced_host_us") and "synchronize" not in fn), reverse=True)
        row["top"] = [(name, f"{tt / calls * 1e6:.1f}us") for tt, name in own[:10]]
        want = [t.clone() for t in _tensors(model(*inputs))]
        direct = _direct_launches(module)
        got = _tensors(model(*inputs))  # the first direct call of each kernel goes through Triton and is kept
        got = _tensors(model(*inputs))
        row["direct_same"] = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
        row["direct_us"] = round(statistics.median(_synced_host_us(model, inputs, calls)), 1)
        for name, jit in direct.items():
            setattr(module, name, jit)
        row["stubbed"] = _stub_launches(module)
        row["python_us"] = round(statistics.median(_synced_host_us(model, inputs, calls)), 1)
    return row


def main() -> int:
    from tests.benchsuite import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="suite problem stems (default: all)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--loops", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: full sizes on the GPU, real launches beside stubbed ones")
    args = ap.parse_args()
    if args.device == "cuda" and args.calls == 2000:
        args.calls = 300
    from kernelevolve.profile import _device_name

    rows = []
    for path in load_suite().problem_paths(args.problems or None):
        try:
            row = host_us_gpu(path, args.calls) if args.device == "cuda" else host_us(path, args.calls, args.loops)
        except Exception as e:  # one problem's failure is its row's
            row = {"problem": path.stem, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        if args.device == "cuda" and "host_us" in row:
            print(f"{row['problem']:28s} {row['host_us']:7.1f} us a call with launches, {row['python_us']:7.1f} us "
                  f"its Python, {row['direct_us']:7.1f} us launched direct (same: {row['direct_same']}), "
                  f"eager {row['eager_us']:7.1f} us; top: "
                  + ", ".join(f"{f} {t}" for f, t in row["top"][:4]), flush=True)
            rows.append(row)
            continue
        rows.append(row)
        print(f"{row['problem']:28s} {row.get('host_us', row.get('error'))} us a call"
              f" ({row.get('regions', 0)} regions, {row.get('stubbed', 0)} jit functions stubbed)", flush=True)
    write(args.json, record("host_work.py", rows, cpu=_device_name("cpu"),
                            **({"device": _device_name("cuda")} if args.device == "cuda" else {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
