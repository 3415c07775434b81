"""Timing loops shared by candidates and the reference, so both are measured the same way.

The clocks are bound when this module is imported, which the worker does before it imports a candidate: a candidate
that patches ``time.perf_counter`` or ``torch.cuda.Event`` later cannot reach the loop (and is rejected for trying).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

_perf = time.perf_counter
_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_zero = torch.Tensor.zero_

# Larger than any current L2 (H200: 60 MB) and most CPU last-level caches, so each repetition starts cold.
FLUSH_BYTES = {"cuda": 256 << 20, "cpu": 64 << 20}


@dataclass(frozen=True)
class TimingConfig:
    budget_ms: float = 1000.0  # time spent in measured repetitions, roughly
    warmup_ms: float = 100.0
    min_reps: int = 5
    max_reps: int = 1000
    flush: bool = True


@dataclass(frozen=True)
class TimingRun:
    samples_ms: list[float]  # per repetition: kernel time on the calling stream (GPU) or wall time (CPU)
    device_ms: list[float]  # GPU: from the start event to device idle, which includes work hidden on side streams
    loop_wall_s: float  # the measured loop as the harness's own clock saw it, flushes included
    warmup_calls: int
    method: str


def _call_until(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], budget_s: float, sync: Callable[[], None],
                min_calls: int) -> tuple[int, float]:
    """Call ``fn`` until ``budget_s`` has passed (at least ``min_calls`` times); return (calls, seconds per call)."""
    calls, t0 = 0, _perf()
    while calls < min_calls or _perf() - t0 < budget_s:
        fn(*input_sets[calls % len(input_sets)])
        sync()
        calls += 1
        if calls >= 10_000:
            break
    return calls, (_perf() - t0) / calls


def warm_up(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str,
            cfg: TimingConfig = TimingConfig()) -> tuple[int, int]:
    """Call ``fn`` for ``cfg.warmup_ms``; return (warm-up calls, repetitions that fill ``cfg.budget_ms``)."""
    sync = _sync if device.startswith("cuda") else (lambda: None)
    calls, per_call_s = _call_until(fn, input_sets, cfg.warmup_ms / 1e3, sync, min_calls=2)
    reps = int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_ms / 1e3 / max(per_call_s, 1e-6))))
    return calls, reps


def measure(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str, reps: int,
            cfg: TimingConfig = TimingConfig(), warm_calls: int = 0) -> TimingRun:
    """Time ``reps`` calls of ``fn`` over rotating input sets, flushing the cache before each."""
    cuda = device.startswith("cuda")
    flush = torch.empty(FLUSH_BYTES["cuda" if cuda else "cpu"], dtype=torch.int8, device=device) if cfg.flush else None
    if cuda:
        return _time_cuda(fn, input_sets, reps, flush, warm_calls)
    return _time_cpu(fn, input_sets, reps, flush, warm_calls)


def time_calls(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], device: str,
               cfg: TimingConfig = TimingConfig()) -> TimingRun:
    calls, reps = warm_up(fn, input_sets, device, cfg)
    return measure(fn, input_sets, device, reps, cfg, calls)


def _time_cuda(fn, input_sets, reps: int, flush: torch.Tensor | None, warm_calls: int) -> TimingRun:
    events = [(_Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)) for _ in range(reps)]
    _sync()
    t0 = _perf()
    for i, (start, stop, idle) in enumerate(events):
        if flush is not None:
            _zero(flush)
        _record(start)
        fn(*input_sets[i % len(input_sets)])
        _record(stop)
        # Work a candidate hides on a side stream is caught here: the device must be idle before `idle` is recorded.
        _sync()
        _record(idle)
    _sync()
    wall = _perf() - t0
    stream = [_elapsed(s, e) for s, e, _ in events]
    device = [_elapsed(s, d) for s, _, d in events]
    return TimingRun(stream, device, wall, warm_calls, "cuda-events")


def _time_cpu(fn, input_sets, reps: int, flush: torch.Tensor | None, warm_calls: int) -> TimingRun:
    samples = []
    t0 = _perf()
    for i in range(reps):
        if flush is not None:
            _zero(flush)
        args = input_sets[i % len(input_sets)]
        t = _perf()
        fn(*args)
        samples.append((_perf() - t) * 1e3)
    wall = _perf() - t0
    return TimingRun(samples, samples, wall, warm_calls, "perf_counter")


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
