"""Timing loops shared by candidates and the reference, so both are measured the same way.

The clocks are bound when this module is imported, which the worker does before it imports a candidate: a candidate
that patches ``time.perf_counter`` or ``torch.cuda.Event`` later cannot reach the loop (and is rejected for trying).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from kernelevolve.settings import DEFAULTS

_perf = time.perf_counter
_process_time = time.process_time
try:
    import resource

    _getrusage: Callable[[int], Any] | None = resource.getrusage
    _SELF = resource.RUSAGE_SELF
except ImportError:  # not on every platform
    _getrusage, _SELF = None, 0
_CORES = os.cpu_count() or 1
_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_zero = torch.Tensor.zero_
_sleep = torch.cuda._sleep  # spins the device for a number of clock cycles
# The harness's own work between calls (refilling inputs, flushing the cache) runs with __torch_function__ modes off,
# so that a mode a candidate enters cannot hide its work there, nor inflate the loop's calibrated cost.
_no_modes = torch._C.DisableTorchFunction

# Larger than any current L2 (H200: 60 MB) and most CPU last-level caches, so each repetition starts cold.
FLUSH_BYTES = {"cuda": 256 << 20, "cpu": 64 << 20}


# The clocks a kernel is timed by (docs/timing.md):
# call    a call from Python with the cache cold, in a loop of calls, as triton.testing.do_bench times it: on a GPU
#         (loop_ms) its device time where the host launches faster than the device runs, else the time of one call
#         with nothing but the flush queued ahead of it (launch work past the flush's ~0.07 ms on an H200 shows).
#         The default.
# device  the same call with the device kept busy while the host launches it (a sleep queued ahead of the call): the
#         kernels' own time, back to back, without launch gaps. Reported beside the call latency, never selected.
# graph   the call captured once in a CUDA graph and replayed: what a model served with CUDA graphs (or
#         torch.compile(mode="reduce-overhead")) sees. Selected with --timing graph.


@dataclass(frozen=True)
class TimingConfig:
    budget_ms: float = DEFAULTS.timing_budget_ms  # time spent in measured repetitions, roughly
    warmup_ms: float = 100.0
    min_reps: int = 5
    max_reps: int = 1000
    flush: bool = True
    clock: str = "call"  # the clock that ranks kernels: "call" or "graph"
    # the device and graph loops take this share of the call loop's repetitions (all of them for the selected clock)
    side_share: float = 0.34


@dataclass(frozen=True)
class TimingRun:
    samples_ms: list[float]  # per repetition: kernel time on the calling stream (GPU) or wall time (CPU)
    device_ms: list[float]  # GPU: from the start event to device idle, which includes work hidden on side streams
    loop_wall_s: float  # the measured loop as the harness's own clock saw it, flushes included
    warmup_calls: int
    method: str
    kept: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # outputs of the repetitions to check
    # per repetition: the host's time from the call to its return (launching, not waiting). Where it comes near the
    # GPU sample, the device waited on the host: the call is launch-bound under this loop, whatever its kernels.
    host_ms: list[float] = field(default_factory=list)
    # What else the CPU did while the loop ran (see cpu_share): why a host's launch time may have grown.
    cpu: dict[str, float] = field(default_factory=dict)


# glibc's mallopt parameters (malloc.h): fixed values switch off its dynamic thresholds, which move with a process's
# history of frees.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for the dynamic threshold (64-bit)
TRIM_THRESHOLD = 1 << 30


def prepare_process() -> None:
    """Make every process that times a kernel (a baseline's, a candidate's) alike where a process's history would
    change the time of the same call. glibc's malloc moves its mmap and trim thresholds as a process frees blocks, so
    one that ran a few calls before timing (a candidate, after its trials) served a call's temporaries from its heap,
    and one that did not (the baseline) mapped them afresh and took page faults on every call: the same code timed
    4x slower on the CPU. With the thresholds fixed, blocks up to MMAP_THRESHOLD come from the heap in every process
    and freed memory stays with it up to TRIM_THRESHOLD. Elsewhere than glibc this does nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _cpu_mark() -> tuple[float, float, float, float] | None:
    """(this process's CPU seconds, its involuntary context switches, the machine's busy and total clock ticks), or
    None where the system does not say (the ticks come from Linux's /proc/stat)."""
    try:
        switches = float(_getrusage(_SELF).ru_nivcsw) if _getrusage is not None else math.nan
        with open("/proc/stat", "rb") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return _process_time(), switches, float(sum(ticks) - ticks[3] - ticks[4]), float(sum(ticks))
    except (OSError, ValueError, IndexError):
        return None


def cpu_share(before: tuple[float, ...] | None, after: tuple[float, ...] | None, wall_s: float) -> dict[str, float]:
    """Between two _cpu_mark readings ``wall_s`` apart: ``busy_cores``, the machine's cores busy on average (this
    process's included, so never less than ``self_cpu``), ``self_cpu``, this process's CPU time over the wall time
    (about 1 while one thread launches and waits on the device, less when it was made to wait for a core, more where
    its own threads run torch's CPU ops in parallel), and ``preempted``, how many times the system took a core from
    it. Empty where a reading is missing. Only read, never judged: the loop's own timing decides."""
    if before is None or after is None or wall_s <= 0:
        return {}
    cpu_s, switches, busy, total = (b - a for a, b in zip(before, after))
    out = {"self_cpu": round(cpu_s / wall_s, 3)}
    if math.isfinite(switches):
        out["preempted"] = switches
    if total > 0:
        # /proc/stat counts in clock ticks, and some containers refresh it coarsely: a short loop can read no busy
        # tick at all, so the figure is floored at this process's own share (it ran on a core the whole time)
        out["busy_cores"] = round(max(busy / total * _CORES, out["self_cpu"]), 2)
    return out


def _call_until(fn: Callable[..., Any], live: "LiveInputs", budget_s: float, sync: Callable[[], None],
                min_calls: int) -> tuple[int, float]:
    """Call ``fn`` until ``budget_s`` has passed (at least ``min_calls`` times); return (calls, seconds per call)."""
    calls, t0 = 0, _perf()
    while calls < min_calls or _perf() - t0 < budget_s:
        fn(*live.load(calls))
        sync()
        calls += 1
        if calls >= 10_000:
            break
    return calls, (_perf() - t0) / calls


def warm_up(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str,
            cfg: TimingConfig = TimingConfig(), before: Callable[[], None] | None = None) -> tuple[int, int]:
    """Call ``fn`` for ``cfg.warmup_ms``; return (warm-up calls, repetitions that fill ``cfg.budget_ms``)."""
    sync = _sync if device.startswith("cuda") else (lambda: None)
    calls, per_call_s = _call_until(fn, LiveInputs(input_sets, before=before), cfg.warmup_ms / 1e3, sync,
                                    min_calls=2)
    reps = int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_ms / 1e3 / max(per_call_s, 1e-6))))
    return calls, reps


def measure(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str, reps: int,
            cfg: TimingConfig = TimingConfig(), warm_calls: int = 0, keep: Sequence[int] = (),
            keep_on_host: bool = False, in_place: bool = False, before: Callable[[], None] | None = None,
            extra: Callable[[], Sequence[Any]] | None = None, ahead_ms: float = 0.0,
            live: "LiveInputs | None" = None) -> TimingRun:
    """Time ``reps`` calls of ``fn``. Before each, outside the timed window, the next input set's values are copied
    into the same buffers (so a cache keyed on pointer, id or version goes stale) and the cache is flushed; on a GPU
    the loop waits for the refill to finish and queues the flush alone ahead of the call, as do_bench does (the call
    clock: launch work past the flush's time shows). ``ahead_ms`` > 0 queues that long a sleep on the device after
    the flush (the device clock): the host launches the whole call while the device is still busy, and the events
    time the kernels alone. The outputs of the repetitions in ``keep`` are copied (to host memory with
    ``keep_on_host``) and returned, so that timed calls can be checked too, followed by what ``extra`` returns after
    such a call (a model's state), read outside the timed window. ``before`` runs before each call, outside the
    window too. ``in_place``: the only input set is itself the buffer, refilled from itself (for
    inputs too large to hold twice; only for ops that leave their inputs alone). ``live``: the buffers to refill
    (a CUDA graph captured on them); by default a set of its own."""
    cuda = device.startswith("cuda")
    flush = torch.empty(FLUSH_BYTES["cuda" if cuda else "cpu"], dtype=torch.int8, device=device) if cfg.flush else None
    live = live if live is not None else LiveInputs(input_sets, in_place, before)
    mark, t0 = _cpu_mark(), _perf()
    if cuda:
        run = _time_cuda(fn, live, reps, flush, warm_calls, set(keep), keep_on_host, extra,
                         sleep_cycles(ahead_ms) if ahead_ms > 0 else 0)
    else:
        run = _time_cpu(fn, live, reps, flush, warm_calls, set(keep), keep_on_host, extra)
    return replace(run, cpu=cpu_share(mark, _cpu_mark(), _perf() - t0))


def flush_costs(flush: torch.Tensor, reps: int = 9) -> tuple[float, float]:
    """(the device's ms for one flush, the host's ms to queue a flush and two events), medians of ``reps``: what a
    do_bench loop queues around each call besides the call itself."""
    device, host = [], []
    for _ in range(reps):
        start, stop = _Event(enable_timing=True), _Event(enable_timing=True)
        _sync()
        h = _perf()
        _record(start)
        with _no_modes():
            _zero(flush)
        _record(stop)
        host.append((_perf() - h) * 1e3)
        _sync()
        device.append(_elapsed(start, stop))
    return statistics.median(device), statistics.median(host)


def host_keeps_ahead(device_ms: float, host_ms: float, flush_ms: float, queue_ms: float) -> bool:
    """Whether, in a loop of calls as triton.testing.do_bench runs one (a flush and the call queued again and again,
    a wait only at the end), the host queues a repetition (``host_ms`` + ``queue_ms``) faster than the device runs it
    (``flush_ms`` + ``device_ms``). Then the host runs ahead, every call's launches hide behind earlier work, and a
    call takes its device time; else the device waits for the host at every call, as in a loop that waits for the
    device before each flush, and a call takes that loop's time, the launch work past the flush included."""
    return host_ms + queue_ms < flush_ms + device_ms


def loop_ms(sync_ms: float, device_ms: float, host_ms: float, flush_ms: float, queue_ms: float) -> float:
    """The time of a call in a loop of calls, as do_bench reads it, from what was measured apart (host_keeps_ahead)."""
    return device_ms if host_keeps_ahead(device_ms, host_ms, flush_ms, queue_ms) else sync_ms


def ahead_for(host_ms: float | None) -> float:
    """The sleep (ms) the device clock queues ahead of a call whose host time is ``host_ms``: twice that and 0.05 ms,
    so that the host has launched the whole call before the sleep ends."""
    return 2.0 * (host_ms or 0.0) + 0.05


_CYCLES_PER_MS: list[float] = []


def sleep_cycles(ms: float) -> int:
    """The device clock cycles that ``torch.cuda._sleep`` spins for about ``ms`` milliseconds on this device,
    measured once per process."""
    if not _CYCLES_PER_MS:
        probe = 1 << 20
        start, stop = _Event(enable_timing=True), _Event(enable_timing=True)
        _sleep(probe)  # the first call loads the kernel
        _sync()
        _record(start)
        _sleep(probe)
        _record(stop)
        _sync()
        _CYCLES_PER_MS.append(probe / max(_elapsed(start, stop), 1e-3))
    return int(min(ms, 200.0) * _CYCLES_PER_MS[0])


def time_calls(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str,
               cfg: TimingConfig = TimingConfig()) -> TimingRun:
    calls, reps = warm_up(fn, input_sets, device, cfg)
    return measure(fn, input_sets, device, reps, cfg, calls)


class GraphError(Exception):
    """A call that cannot be captured in a CUDA graph (a host sync, CPU work on device values, a nested capture)."""


def capture_graph(fn: Callable[..., Any], live: "LiveInputs") -> Callable[..., Any]:
    """``fn`` called on ``live``'s buffers, captured once in a CUDA graph; returns a function that replays it (the
    buffers refilled by ``live.load`` beforehand) and returns the outputs the capture allocated. The call runs twice
    on a side stream first, as capture requires (workspaces, lazy initialisation). Raises GraphError."""
    args = live.load(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        _sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*args)
    except Exception as e:  # the candidate's own code, under capture
        lines = str(e).strip().splitlines()
        raise GraphError(f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]) from None

    def replay(*_: Any) -> Any:
        graph.replay()
        return out

    return replay


class LiveInputs:
    """One set of input buffers, refilled from the rotating input sets before each call: the sets themselves are never
    passed to the function, so they stay pristine even when the op mutates its inputs."""

    def __init__(self, input_sets: Sequence[Sequence[Any]], in_place: bool = False,
                 before: Callable[[], None] | None = None):
        self.sets, self.before = input_sets, before
        if in_place and len(input_sets) == 1:
            self.args = list(input_sets[0])
        else:
            self.args = [v.clone() if isinstance(v, torch.Tensor) else v for v in input_sets[0]]

    def load(self, i: int) -> list[Any]:
        if self.before is not None:  # the harness's own step before each call (a model's state put back), untimed
            self.before()
        for buf, src in zip(self.args, self.sets[i % len(self.sets)]):
            if isinstance(buf, torch.Tensor) and buf is not src:
                buf.copy_(src)
        return self.args


def _kept(out: Any, on_host: bool) -> tuple[torch.Tensor, ...]:
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if on_host:
        return tuple(o.detach().to("cpu", copy=True) if isinstance(o, torch.Tensor) else o for o in outs)
    return tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs)


def _time_cuda(fn, live: LiveInputs, reps: int, flush: torch.Tensor | None, warm_calls: int,
               keep: set[int], keep_on_host: bool = False,
               extra: Callable[[], Sequence[Any]] | None = None, ahead_cycles: int = 0) -> TimingRun:
    events = [(_Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)) for _ in range(reps)]
    kept: dict[int, tuple[torch.Tensor, ...]] = {}
    host: list[float] = []
    _sync()
    t0 = _perf()
    for i, (start, stop, idle) in enumerate(events):
        with _no_modes():
            args = live.load(i)
        # The refill done, the flush alone is queued ahead of the call, as triton.testing.do_bench queues its own
        # (256 MB zeroed, ~0.07 ms on an H200): every kernel, candidate or baseline, has that much device work to
        # launch behind and no more. A refill left queued too hid up to its own time more, and more for larger
        # inputs (a bf16 LayerNorm's Python launcher read 1.72x eager where do_bench read 1.32x).
        _sync()
        if flush is not None:
            with _no_modes():
                _zero(flush)
        if ahead_cycles:
            _sleep(ahead_cycles)
        _record(start)
        h = _perf()
        out = fn(*args)
        host.append((_perf() - h) * 1e3)
        _record(stop)
        # Work a candidate hides on a side stream is caught here: the device must be idle before `idle` is recorded.
        _sync()
        _record(idle)
        if i in keep:
            with _no_modes():
                kept[i] = _kept(out, keep_on_host) + (_kept(tuple(extra()), keep_on_host) if extra else ())
        del out  # the next call's output may reuse this one's memory
    _sync()
    wall = _perf() - t0
    stream = [_elapsed(s, e) for s, e, _ in events]
    device = [_elapsed(s, d) for s, _, d in events]
    return TimingRun(stream, device, wall, warm_calls, "cuda-events", kept, host)


def _time_cpu(fn, live: LiveInputs, reps: int, flush: torch.Tensor | None, warm_calls: int,
              keep: set[int], keep_on_host: bool = False,
              extra: Callable[[], Sequence[Any]] | None = None) -> TimingRun:
    samples, kept = [], {}
    t0 = _perf()
    for i in range(reps):
        with _no_modes():
            args = live.load(i)
            if flush is not None:
                _zero(flush)
        t = _perf()
        out = fn(*args)
        samples.append((_perf() - t) * 1e3)
        if i in keep:
            with _no_modes():
                kept[i] = _kept(out, keep_on_host) + (_kept(tuple(extra()), keep_on_host) if extra else ())
        del out
    wall = _perf() - t0
    return TimingRun(samples, samples, wall, warm_calls, "perf_counter", kept, samples)
