"""Where a composition's call goes: a bench model with its largest problems' default template kernels in, in both
hosts, timed beside the model's own eager and torch.compile builds.

    PYTHONPATH=src python3 bench/compose_clock.py --model dlrm --top 1 --json out/compose_clock.json

For each build: the call's median by ``triton.testing.do_bench`` in five rounds (a drift between rounds shows), the
host's time per call (a loop of calls with no wait, the device idle before it), the device time of one call by the
profiler (its kernels on the device's timeline), the same rounds with Python's garbage collector frozen and off, the
graphs torch.compile built, the call captured in a CUDA graph and replayed, each build's largest kernels, and for
the compositions the ten functions a call spends most host time in (cProfile, own time). A call slower than its
device time with a host time near the call is bound by the host.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.record import record, write  # noqa: E402

MODELS = ROOT / "bench" / "models"


def host_ms(fn: Callable[[], Any], cuda: bool, calls: int = 20) -> float:
    """The host's time per call of ``fn`` with the device idle first and no wait between calls."""
    import torch

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    ms = (time.perf_counter() - t0) * 1e3 / calls
    sync()
    return ms


def _is_spin(name: str) -> bool:
    """The kernel of ``torch.cuda._sleep`` (ATen's ``spin_kernel``), which spins the clock up before the call."""
    return "spin_kernel" in name or "sleep" in name.lower()


def device_ms(fn: Callable[[], Any], cuda: bool, kernels: dict[str, float] | None = None) -> float | None:
    """The device time of one call by the profiler: its kernels' time, summed (None on the CPU); each kernel's own
    time (ms, by name) into ``kernels`` where given."""
    import torch

    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    from kernelevolve.model.profile import SPIN_CYCLES

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(SPIN_CYCLES)  # the clock up from idle, as the model's profile does
        torch.cuda.synchronize()
        fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():  # the kernels themselves, on the device's timeline (an op's row holds them again)
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA or _is_spin(e.name):
            continue
        if getattr(e, "is_user_annotation", False) or e.name.startswith("ProfilerStep"):
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        total += us
        if kernels is not None:
            kernels[e.name[:90]] = kernels.get(e.name[:90], 0.0) + us / 1e3
    return total / 1e3


def graph_ms(fn: Callable[[], Any], cuda: bool) -> float | str | None:
    """The call captured in a CUDA graph and replayed (``do_bench`` of the replay, median): what a model served with
    CUDA graphs sees, host work gone. The reason where capture fails; None on the CPU."""
    import torch

    from bench.glue import call_ms

    if not cuda:
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return call_ms(graph.replay, "cuda")
    except Exception as e:  # a build that cannot be captured
        return f"{type(e).__name__}: {str(e)[:160]}"


def top_functions(fn: Callable[[], Any], calls: int = 20, n: int = 10) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(n)
    return [line for line in s.getvalue().splitlines() if "(" in line or "ncalls" in line]


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def measure(path: Path, top: int, work: Path, device: str) -> dict[str, Any]:
    import torch

    from bench.glue import call_ms

    from kernelevolve.model.compose import Chosen, compose
    from kernelevolve.model.plan import plan_model
    from kernelevolve.problem import build_model, import_module_from_path, load_problem, make_inputs
    from kernelevolve.propose.template import TemplateProposer

    plan = plan_model(path, device, work / "plan")
    proposer = TemplateProposer(device, seed=0)
    chosen = []
    for g in plan.groups:  # the largest first
        tp = proposer.plan(load_problem(g.path, device))
        if tp.regions and len(chosen) < top:
            source = proposer.render(tp, {r.key: r.default() for r in tp.regions}, "default")
            chosen.append(Chosen(g.name, g.regions, source, "template kernel"))
    cuda = device == "cuda"
    row: dict[str, Any] = {"model": path.stem, "chosen": [c.name for c in chosen], "builds": {}}
    ref_mod = import_module_from_path(path, f"_clock_ref_{path.stem}")
    model = build_model(ref_mod, "Model", 0).to(device)
    draws = [make_inputs(ref_mod, s, device=device) for s in (1, 2, 3)]
    builds: dict[str, Callable[..., Any]] = {"eager": model, "compile": torch.compile(model)}
    for host in ("eager", "compile"):
        text, skipped = compose(plan.problem.source, plan.graph, chosen, "clock", plan.dynamic, plan.alt, host)
        f = work / f"composed_{host}.py"
        f.write_text(text)
        mod = import_module_from_path(f, f"_clock_{host}_{path.stem}")
        new = build_model(mod, "ModelNew", 0).to(device)
        new.load_state_dict(model.state_dict())
        builds[f"composed_{host}"] = new
        row[f"skipped_{host}"] = skipped
    with torch.no_grad():
        for name, fn in builds.items():
            g0 = graphs()
            for xs in draws:  # every draw once: the builds and recompiles happen here
                fn(*xs)
            g1 = graphs()
            xs = draws[0]
            call = lambda: fn(*xs)  # noqa: E731
            rounds = [call_ms(call, device) for _ in range(5)]
            # the same rounds with Python's collector quiet: what the process's garbage adds to a call's host time
            gc.collect()
            gc.freeze()
            gc.disable()
            try:
                quiet = [call_ms(call, device) for _ in range(5)]
            finally:
                gc.enable()
                gc.unfreeze()
            b = {"do_bench_ms": statistics.median(rounds), "rounds_ms": rounds, "host_ms": host_ms(call, cuda),
                 "no_gc_ms": statistics.median(quiet), "no_gc_rounds_ms": quiet,
                 "device_ms": device_ms(call, cuda, kernels := {}), "graphs_warm": g1 - g0,
                 "graphs_timed": graphs() - g1}
            b["graph_ms"] = graph_ms(call, cuda)
            b["kernels_ms"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])  # the largest, per call
            if name.startswith("composed"):
                b["top"] = top_functions(call)
            row["builds"][name] = b
            print(f"{path.stem} {name:18} do_bench {b['do_bench_ms']:.4f} ms  no gc {b['no_gc_ms']:.4f} ms  "
                  f"host {b['host_ms']:.4f} ms  "
                  f"device {b['device_ms'] or 0:.4f} ms  graph replay {b['graph_ms']}  "
                  f"graphs {b['graphs_warm']}+{b['graphs_timed']}  rounds "
                  + " ".join(f"{r:.3f}" for r in rounds) + "  no gc " + " ".join(f"{r:.3f}" for r in quiet),
                  flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dlrm", help="a model of bench/models")
    ap.add_argument("--top", type=int, default=1, help="how many of the largest problems get a kernel")
    ap.add_argument("--device", default="cuda", help="cuda; cpu for a smoke run (no device time)")
    ap.add_argument("--small", action="store_true", help="the model's SMALL sizes (a CPU smoke run)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = MODELS / f"{args.model}.py"
        if args.small:
            from bench.models import small_copy

            path = small_copy(path, Path(tmp))
        row = measure(path, args.top, Path(tmp), args.device)
    for name, b in row["builds"].items():
        if "top" in b:
            print(f"-- {name}: where a call's host time goes")
            print("\n".join(b["top"]))
    write(args.json, record("compose_clock.py", [row], device=args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
