"""Where a whole model's time goes: the device time of every op of its captured graph, summed by region.

The graph runs node by node on the device (an ``fx.Interpreter``), each node inside a profiler range named after it;
the profiler gives each range the device time of the kernels launched in it (the CPU time on the CPU). A few runs
first warm the allocator and the libraries up; the median over the measured runs is kept.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.nn as nn

from kernelevolve.analyze.graph import CapturedGraph, op_name
from kernelevolve.model.partition import Partition

PREFIX = "kernelevolve::"


@dataclass(frozen=True)
class OpTimes:
    """Device time of each call node (ms, one call of the model) and the whole graph's."""
    per_node: dict[str, float]  # node name -> ms
    total_ms: float
    device: str
    runs: int

    def of(self, nodes: list[fx.Node]) -> float:
        return sum(self.per_node.get(n.name, 0.0) for n in nodes)


class _Ranged(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        with torch.profiler.record_function(PREFIX + n.name):
            return super().run_node(n)


def _to(x: Any, device: str) -> Any:
    return x.to(device) if isinstance(x, torch.Tensor) else x


def op_times(graph: CapturedGraph, device: str = "cpu", runs: int = 5, warmup: int = 2) -> OpTimes:
    """Profile ``graph`` on its example arguments, moved to ``device``."""
    from torch.profiler import ProfilerActivity

    args = [[_to(t, device) for t in graph.example[0]], *[_to(x, device) for x in graph.example[1:]]]
    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    interp = _Ranged(graph.gm)
    samples: dict[str, list[float]] = {}
    with torch.no_grad():
        for _ in range(warmup):
            interp.run(*args)
        if cuda:
            torch.cuda.synchronize()
        for _ in range(runs):
            with _profiled(activities) as prof:
                interp.run(*args)
                if cuda:
                    torch.cuda.synchronize()
            got = _ranges(prof.events(), cuda)
            for name, ms in got.items():
                samples.setdefault(name, []).append(ms)
    per_node = {k: statistics.median(v) for k, v in samples.items()}
    return OpTimes(per_node, sum(per_node.values()), device, runs)


@contextlib.contextmanager
def _profiled(activities: list[Any]) -> Iterator[Any]:
    """A profiler over the block, started and stopped quietly (the block itself keeps its stderr)."""
    from torch.profiler import profile

    from kernelevolve.profile import quiet_stderr

    prof = profile(activities=activities)
    with quiet_stderr():
        prof.start()
    try:
        yield prof
    finally:
        with quiet_stderr():
            prof.stop()


def _ranges(events: Any, cuda: bool) -> dict[str, float]:
    """The time of each named range: on the GPU the device time of the kernels launched in it, on the CPU its CPU
    time. A range on the GPU comes back twice, as the host's range (the kernels it launched) and as its span on the
    device's timeline (a ``gpu_user_annotation``, idle gaps included): only the host's counts, as in the profiler's
    own tables, or every range would read about twice its time."""
    out: dict[str, float] = {}
    for e in events:
        if not e.name.startswith(PREFIX) or not _on_host(e):
            continue
        if cuda:
            us = getattr(e, "device_time_total", None)
            us = e.cuda_time_total if us is None else us
        else:
            us = e.cpu_time_total
        name = e.name[len(PREFIX):]
        out[name] = out.get(name, 0.0) + us / 1000.0
    return out


def _on_host(event: Any) -> bool:
    """Whether a profiler event is the host's side of a range (not its copy on a device's timeline)."""
    kind = getattr(event, "device_type", None)
    return kind is None or kind == torch.autograd.DeviceType.CPU


def attribute(part: Partition, times: OpTimes) -> None:
    """Each region's share of the time, in place."""
    for r in part.regions:
        r.time_ms = times.of(r.nodes)


@dataclass(frozen=True)
class Hot:
    """A row of the model's profile: a region, or the ops outside every region."""
    name: str
    kind: str
    where: str
    ms: float
    share: float
    instances: int


def hot_regions(part: Partition, times: OpTimes) -> list[Hot]:
    """The problems (regions grouped by signature), by their total time, with the time outside every region last."""
    total = times.total_ms or 1e-12
    rows = []
    for group in part.groups().values():
        ms = sum(r.time_ms for r in group)
        first = group[0]
        rows.append(Hot(first.name, first.kind, first.where, ms, ms / total, len(group)))
    rows.sort(key=lambda h: -h.ms)
    inside = {n for r in part.regions for n in r.nodes}
    rest = [n for n in part.graph.calls() if n not in inside]
    rest_ms = times.of(rest)
    if rest:
        rows.append(Hot("-", "outside", f"{len(rest)} ops ({', '.join(sorted({op_name(n) for n in rest}))[:60]})",
                        rest_ms, rest_ms / total, 1))
    return rows


WHOLE = "__model__"


def composed_times(path: str | Path, region_of: dict[str, str], device: str = "cpu", runs: int = 5,
                   warmup: int = 2, cls: str = "ModelNew") -> dict[str, float]:
    """The time of one call of a composed file's ``ModelNew`` (or its class ``cls``; the whole call in one profiler
    range) and of each region kernel's calls within it, summed by problem: ``region_of`` maps the generated function
    of each instance (``_ke_<region>``) to its problem's name. Returns {"__model__": ms, problem: ms, ...}."""
    from kernelevolve.problem import build_model, import_module_from_path, make_inputs

    module = import_module_from_path(path, f"_kernelevolve_composed_{abs(hash(str(path)))}")
    for fn, name in region_of.items():
        original = getattr(module, fn, None)
        if callable(original):
            setattr(module, fn, _ranged(original, PREFIX + name))
    inputs = make_inputs(module, 0, device=device)
    model = build_model(module, cls, 0).to(device)
    return _profile_calls(model, inputs, device, runs, warmup)


def _ranged(fn: Any, name: str) -> Any:
    def call(*args: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args)
    return call


def _profile_calls(model: Any, inputs: list[Any], device: str, runs: int, warmup: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    samples: dict[str, list[float]] = {}
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        if cuda:
            torch.cuda.synchronize()
        for _ in range(runs):
            with _profiled(activities) as prof:
                with torch.profiler.record_function(PREFIX + WHOLE):
                    model(*inputs)
                if cuda:
                    torch.cuda.synchronize()
            for name, ms in _ranges(prof.events(), cuda).items():
                samples.setdefault(name, []).append(ms)
    return {k: statistics.median(v) for k, v in samples.items()}


def part_times(model: nn.Module, inputs: list[Any], paths: list[str], device: str, runs: int = 3) -> dict[str, float]:
    """The time of each submodule at ``paths`` and of the whole (``WHOLE``) in one call, by profiler ranges."""
    handles = []
    for path in paths:
        sub = model.get_submodule(path)
        ranges: list[Any] = []

        def enter(module: nn.Module, args: tuple, path: str = path, ranges: list = ranges) -> None:
            ranges.append(torch.profiler.record_function(PREFIX + path))
            ranges[-1].__enter__()

        def leave(module: nn.Module, args: tuple, out: Any, ranges: list = ranges) -> None:
            ranges.pop().__exit__(None, None, None)
        handles += [sub.register_forward_pre_hook(enter), sub.register_forward_hook(leave)]
    try:
        return _profile_calls(model, inputs, device, runs, 1)
    finally:
        for h in handles:
            h.remove()
