"""An independent clock: a returned kernel file and eager PyTorch timed with Triton's do_bench, in a fresh process.

    PYTHONPATH=src python3 bench/dobench.py PROBLEM.py out/best.py [--json out.json]

The problem's Model and the file's ModelNew are built from the problem's init inputs, ModelNew given Model's weights
(its state_dict, where the entries agree), both called on the problem's own get_inputs() on the GPU as the judge calls
them: with no grad, in the modules' own mode (not switched to eval: KernelBench's BatchNorm uses the batch's
statistics), and with the precision the problem declares (TF32 off for matmuls and cuDNN convolutions unless the file
sets ``ALLOW_TF32 = True``; PyTorch's own default runs cuDNN convolutions in TF32, a different and 2-5x faster
computation for fp32 transposed convolutions). Each is timed with ``triton.testing.do_bench`` (the L2 flushed before
each call, CUDA events around it, the median), three times in turn (eager, the file, eager, ...), and the median of
the three kept. The judge's harness is not involved: this is the check of its clock that every benchmark row carries
(bench/suite.py, bench/kernelbench.py). With ``--device cpu`` the calls are timed with ``time.perf_counter`` (the
median of 50), since do_bench needs CUDA. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROUNDS = 3


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cpu_bench(fn: Any, return_mode: str = "median", warmup: int = 3, reps: int = 50) -> float:
    """do_bench's figure on the CPU, where it cannot run (it needs CUDA): the median of ``reps`` timed calls, in ms."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def measure(problem_path: Path, kernel_path: Path, device: str = "cuda", tf32: bool | None = None) -> dict[str, Any]:
    """``tf32``: None for the problem's own declaration (``ALLOW_TF32``, off by default), or force it on or off."""
    import torch
    import triton.testing

    problem = _module(problem_path, "dobench_problem")
    kernel = _module(kernel_path, "dobench_kernel")
    tf32 = bool(getattr(problem, "ALLOW_TF32", False)) if tf32 is None else tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    init = problem.get_init_inputs()
    # the modules' own mode, as the judge calls them (KernelBench's convention: a BatchNorm uses the batch's statistics)
    ref = problem.Model(*init).to(device)
    new = kernel.ModelNew(*init).to(device)
    if set(new.state_dict()) == set(ref.state_dict()):
        new.load_state_dict(ref.state_dict())
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    times: dict[str, list[float]] = {"eager": [], "kernel": []}
    with torch.no_grad():
        for model in (ref, new):  # compile, autotune and load before any timing
            model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        bench = triton.testing.do_bench if device == "cuda" else cpu_bench
        for _ in range(ROUNDS):
            for name, model in (("eager", ref), ("kernel", new)):
                times[name].append(float(bench(lambda m=model: m(*inputs), return_mode="median")))
    eager, best = statistics.median(times["eager"]), statistics.median(times["kernel"])
    return {"eager_ms": eager, "kernel_ms": best, "speedup_eager": eager / best if best > 0 else None,
            "rounds_ms": times, "tf32": tf32, "torch": torch.__version__, "triton": triton.__version__}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("kernel", type=Path, help="a candidate file (ModelNew), e.g. a run's best.py")
    ap.add_argument("--json", type=Path, help="also write the object here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: timed calls with time.perf_counter instead (do_bench needs CUDA)")
    ap.add_argument("--tf32", choices=("problem", "on", "off"), default="problem",
                    help="TF32 for matmuls and cuDNN convolutions: as the problem declares (default, as the judge), on "
                         "(PyTorch's default for convolutions) or off")
    args = ap.parse_args(argv)
    tf32 = {"problem": None, "on": True, "off": False}[args.tf32]
    out = measure(args.problem.resolve(), args.kernel.resolve(), args.device, tf32=tf32)
    text = json.dumps(out)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
