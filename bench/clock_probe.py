"""Where a call's host time comes from, loop by loop: the same call of a suite problem's default template candidate
(and of eager) timed by several loops in one process, and by the judge in its own process.

    PYTHONPATH=src python3 bench/clock_probe.py --problems attention_manual_fp16 column_sum --json out/probe.json

Loops (host: the time from the call to its return; ms: CUDA events around the call; medians):

- ``idle``: the device idle before each call (torch.cuda.synchronize), nothing queued;
- ``idle_flush``: the same with the 256 MB cache flush queued ahead of the call, as the judge's call clock does;
- ``idle_flush_spin``: as ``idle_flush``, but the host waits for the device by polling an event instead of
  torch.cuda.synchronize (the thread keeps its core);
- ``loop``: do_bench's own loop (flush, start event, call, stop event, no wait between calls);
- ``measure``: the judge's timing loop (``timing.measure``) in this process;
- ``do_bench``: ``triton.testing.do_bench``;
- ``judge``: ``Evaluator.evaluate`` (the candidate) and ``Evaluator.baseline`` (eager): the loop in a child process
  prepared as the judge prepares it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent)]
sys.path.insert(0, str(HERE))

from host_work import _template_module  # noqa: E402  (bench/host_work.py)
from record import record, write  # noqa: E402  (bench/record.py)

REPS = 200


def _loops(fn: Callable[[], Any], flush: Any) -> dict[str, dict[str, float]]:
    import torch
    import triton.testing

    from kernelevolve.evaluate import timing

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 4)

    out: dict[str, dict[str, float]] = {}
    host = []
    for _ in range(REPS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    out["idle"] = {"host_ms": med(host)}
    for name in ("idle_flush", "idle_flush_spin"):
        host, ms = [], []
        for _ in range(REPS):
            if name == "idle_flush":
                torch.cuda.synchronize()
            else:
                done = torch.cuda.Event()
                done.record()
                while not done.query():
                    pass
            flush.zero_()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t) * 1e3)
            stop.record()
            torch.cuda.synchronize()
            ms.append(start.elapsed_time(stop))
        out[name] = {"host_ms": med(host), "ms": med(ms)}
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    host = []
    torch.cuda.synchronize()
    for start, stop in events:
        flush.zero_()
        start.record()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e3)
        stop.record()
    torch.cuda.synchronize()
    out["loop"] = {"host_ms": med(host), "ms": med([a.elapsed_time(b) for a, b in events])}
    run = timing.measure(lambda *_: fn(), [[]], "cuda", REPS)
    out["measure"] = {"host_ms": med(run.host_ms), "ms": med(run.samples_ms)}
    out["do_bench"] = {"ms": round(float(triton.testing.do_bench(fn, return_mode="median")), 4)}
    return out


def _judge(path: Path, source: str) -> dict[str, Any]:
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate.evaluator import EvalConfig, Evaluator
    from kernelevolve.problem import load_problem

    ev = Evaluator(load_problem(path, "cuda"), EvalConfig(device="cuda"))
    res = ev.evaluate(Candidate(source, proposer="template"))
    base = ev.baseline(compiled=False)
    out: dict[str, Any] = {"status": str(res.status)}
    if res.timing is not None:
        out["candidate"] = {k: v for k, v in res.timing.clocks().items() if isinstance(v, float)}
    if base.eager is not None:
        out["eager"] = {k: v for k, v in base.eager.clocks().items() if isinstance(v, float)}
    return out


def probe(path: Path) -> dict[str, Any]:
    import torch

    from kernelevolve.problem import import_module_from_path, make_inputs

    built = _template_module(path, "probe")
    if built is None:
        return {"problem": path.stem, "error": "no template candidate"}
    cand, module = built
    ref = import_module_from_path(path, f"probe_ref_{path.stem}")
    inputs = make_inputs(ref, 0, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    row: dict[str, Any] = {"problem": path.stem}
    with torch.no_grad():
        torch.manual_seed(0)
        eager = ref.Model(*ref.get_init_inputs()).cuda()
        torch.manual_seed(0)
        model = module.ModelNew(*ref.get_init_inputs()).cuda()
        for _ in range(5):
            model(*inputs)
            eager(*inputs)
        row["candidate"] = _loops(lambda: model(*inputs), flush)
        row["eager"] = _loops(lambda: eager(*inputs), flush)
    del flush
    torch.cuda.empty_cache()
    row["judge"] = _judge(path, cand.source)
    return row


def main() -> int:
    from tests.benchsuite import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", help="suite problem stems (default: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from kernelevolve.profile import _device_name

    rows = []
    for path in load_suite().problem_paths(args.problems or None):
        try:
            row = probe(path)
        except Exception as e:  # one problem's failure is its row's
            row = {"problem": path.stem, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        print(row, flush=True)
    write(args.json, record("clock_probe.py", rows, device=_device_name("cuda")))
    for row in rows:
        for side in ("candidate", "eager"):
            loops = row.get(side, {})
            judged = row.get("judge", {}).get(side, {})
            print(f"{row['problem'][:24]:24s} {side:9s} " + " ".join(
                f"{k}={v.get('host_ms', '-')}/{v.get('ms', '-')}" for k, v in loops.items())
                + f" judge host={judged.get('host_ms')} call={judged.get('call_ms')} sync={judged.get('sync_ms')}"
                  f" dev={judged.get('device_ms')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
