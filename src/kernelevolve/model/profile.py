"""Where a whole model's time goes: the device time of every op of its captured graph, summed by region.

The graph runs node by node on the device (an ``fx.Interpreter``), each node inside a profiler range named after it;
the profiler gives each range the device time of the kernels launched in it (the CPU time on the CPU). A few runs
first warm the allocator and the libraries up; the median over the measured runs is kept.

The graph is the model in the normal form the families claim: a LayerNorm or a softmax is there as its primitive ops,
each a kernel of its own, where the model's own forward runs one fused kernel. So the model's own forward is profiled
too, each module call in a range of its own, and the ops of each module call are scaled to that call's own time
(``calibrate``): a region's time is then what the model spends on it, and the ops add up to the model's call.
"""
from __future__ import annotations

import contextlib
import logging
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
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpTimes:
    """Device time of each call node (ms, one call of the model) and the whole graph's."""
    per_node: dict[str, float]  # node name -> ms, scaled to the model's own module calls where those were timed
    total_ms: float
    device: str
    runs: int
    graph_ms: float | None = None  # the graph's ops as they are, unscaled (the normal form run op by op)
    model_ms: float | None = None  # the model's own forward, one call

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
    graph_ms = sum(per_node.values())
    own = None
    if graph.model is not None:
        try:
            own = module_times(graph.model, graph.state_names, args, activities, runs, warmup)
        except Exception as e:  # the graph's own times stand: a model whose forward cannot run apart is rare
            log.info("the model's own forward could not be profiled: %s: %s", type(e).__name__, e)
    if own is None:
        return OpTimes(per_node, graph_ms, device, runs, graph_ms)
    scaled = calibrate(graph, per_node, own[0])
    return OpTimes(scaled, sum(scaled.values()), device, runs, graph_ms, own[1])


# cycles of the spin before a profiled block on a GPU: about 25 ms at an H100's full clock
SPIN_CYCLES = 50_000_000
_ROOT = ("", 1)  # the model's own call: the root module's first call


def module_times(model: nn.Module, names: list[str], args: list[Any], activities: list[Any], runs: int,
                 warmup: int) -> tuple[dict[tuple[str, int], float], float]:
    """The model's own forward on the graph's arguments (``args``: [state tensors named ``names``, *inputs]): the
    self time of each module call, keyed by (module path, call number), as capture numbers them (graph.py's
    ``_Origins``); the root's key is ("", 1). A call's self time is its range's time less its child calls'. Also
    returns the time of the whole call (the sum of the self times)."""
    from torch.func import functional_call

    calls: dict[str, int] = {}
    stack: list[tuple[tuple[str, int], Any]] = []
    parent: dict[tuple[str, int], tuple[str, int] | None] = {}

    def enter(name: str) -> Any:
        def hook(module: nn.Module, inputs: Any) -> None:
            calls[name] = calls.get(name, 0) + 1
            key = (name, calls[name])
            parent[key] = stack[-1][0] if stack else None
            rf = torch.profiler.record_function(f"{PREFIX}{_MODULE}{len(parent) - 1}")
            rf.__enter__()
            stack.append((key, rf))
        return hook

    def leave(module: nn.Module, inputs: Any, out: Any) -> None:
        if stack:
            stack.pop()[1].__exit__(None, None, None)

    handles = []
    for name, sub in model.named_modules():
        handles += [sub.register_forward_pre_hook(enter(name)), sub.register_forward_hook(leave)]
    state = dict(zip(names, args[0]))
    cuda = any(getattr(a, "is_cuda", False) for a in [*args[0], *args[1:]])
    samples: dict[tuple[str, int], list[float]] = {}
    wholes: list[float] = []
    try:
        with torch.no_grad():
            for i in range(warmup + runs):
                calls.clear()
                parent.clear()
                stack.clear()
                if i < warmup:
                    functional_call(model, state, tuple(args[1:]))
                    continue
                with _profiled(activities) as prof:
                    functional_call(model, state, tuple(args[1:]))
                    if cuda:
                        torch.cuda.synchronize()
                keys = list(parent)
                total = {keys[int(name[len(_MODULE):])]: ms for name, ms in _ranges(prof.events(), cuda).items()
                         if name.startswith(_MODULE) and int(name[len(_MODULE):]) < len(keys)}
                run_total = 0.0
                for key in keys:
                    inner = sum(total.get(k, 0.0) for k in keys if parent[k] == key)
                    own = max(total.get(key, 0.0) - inner, 0.0)
                    samples.setdefault(key, []).append(own)
                    run_total += own
                wholes.append(run_total)
    finally:
        for h in handles:
            h.remove()
    return {k: statistics.median(v) for k, v in samples.items()}, statistics.median(wholes)


_MODULE = "module:"


def calibrate(graph: CapturedGraph, per_node: dict[str, float],
              own: dict[tuple[str, int], float]) -> dict[str, float]:
    """The graph's op times scaled, module call by module call, to the model's own time of that call: within a call
    its ops keep their proportions, and together they take what the model's own call of that module takes. Ops of a
    call the model's profile has no time for keep their own times."""
    by_call: dict[tuple[str, int], list[str]] = {}
    for n in graph.calls():
        custom = n.meta.get("custom") or {}
        key = (custom.get("module", ""), int(custom.get("call", 0) or 0))
        by_call.setdefault(_ROOT if key == ("", 0) else key, []).append(n.name)  # outside every hook: the root's
    out = dict(per_node)
    for key, names in by_call.items():
        mine = sum(per_node.get(n, 0.0) for n in names)
        if key not in own or mine <= 0:
            continue
        for n in names:
            if n in per_node:
                out[n] = per_node[n] * own[key] / mine
    return out


@contextlib.contextmanager
def _profiled(activities: list[Any]) -> Iterator[Any]:
    """A profiler over the block, started and stopped quietly (the block itself keeps its stderr). On a GPU the
    block starts behind a spin of the device, outside every range: an idle GPU drops its clock (an H100 to 345 MHz
    from 1980), and the profiler's start leaves it idle long enough that the block's first kernels ran at up to
    twice their time."""
    from torch.profiler import ProfilerActivity, profile

    from kernelevolve.profile import quiet_stderr

    prof = profile(activities=activities)
    with quiet_stderr():
        prof.start()
    if ProfilerActivity.CUDA in activities:
        torch.cuda._sleep(SPIN_CYCLES)
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
        # the range goes around the instance's own call where the file has one (compose.py's ``_KE_<REGION>``): in
        # the compile host the generated function is traced by torch.compile, which drops ranges, but the instance
        # runs inside its custom op, as it does in the eager host
        instance = getattr(module, fn.upper(), None)
        if isinstance(instance, nn.Module):
            instance.forward = _ranged(instance.forward, PREFIX + name)
            continue
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
