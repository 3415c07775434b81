"""Profile a problem's eager reference: FLOPs, bytes, roofline floor, bound class and the dominant ops.

The floor is ``max(flops / peak_flops, bytes / peak_bw)``: the time no kernel can beat on that device. It tells the
search how far the reference is from the roofline and whether to fight for bandwidth, math throughput or launch latency.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.autograd import DeviceType
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from kernelevolve.problem import Problem, as_outputs, build_model, import_module_from_path, make_inputs, to_device

log = logging.getLogger(__name__)

BOUNDS = ("memory", "compute", "latency")
TOP_K = 8
# Below these floors a kernel launch (~3-5 us on CUDA) or a Python call dominates whatever the op itself needs.
LATENCY_FLOOR_MS = {"cuda": 0.005, "cpu": 0.002}
TINY_FLOOR_MS = 0.02
LATENCY_RATIO = 20.0

# Vendor datasheet peaks, dense (the sparsity figures halved away). Keys match device names as whole words, first hit
# wins, so "H100 PCIe" sits before "H100". bw: HBM/GDDR bytes/s; fp16: bf16 and fp16 tensor-core FLOP/s (equal on all of
# these); tf32: tensor-core TF32; fp32: non-tensor FP32 (FMA counted as 2).
GPU_CEILINGS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bw": 4.8e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12}),  # NVIDIA H200 SXM datasheet
    ("H100 PCIe", {"bw": 2.0e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),  # NVIDIA H100 PCIe datasheet
    ("H100", {"bw": 3.35e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12}),  # NVIDIA H100 SXM datasheet
    ("A100", {"bw": 2.0e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),  # A100 80GB SXM (40GB: 1.555e12 B/s)
    ("MI300X", {"bw": 5.3e12, "fp16": 1307e12, "tf32": 653e12, "fp32": 163e12}),  # AMD Instinct MI300X datasheet
    ("L4", {"bw": 0.3e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),  # NVIDIA L4 datasheet
]
# Substrings of FLOP-counter op names that run on matrix units (mm, addmm, bmm, baddbmm, _scaled_mm, convolution,
# _scaled_dot_product_*_attention): everything the counter counts today is one of these.
MATMUL_MARKERS = ("mm", "conv", "attention")


class ProfileError(Exception):
    """The profile cannot be taken (e.g. CUDA asked for but absent)."""


@dataclass(frozen=True)
class Profile:
    device: str
    device_name: str
    flops: int
    bytes: int
    dtype: str
    peak_flops: float
    peak_bw: float
    ceilings_source: str  # "table" or "measured"
    floor_ms: float
    intensity: float
    ridge: float
    bound: str  # one of BOUNDS
    eager_ms: float
    top_ops: list[dict[str, Any]]  # {name, self_ms (per forward), pct, calls (per forward)}
    notes: list[str]
    # hardware counters by target ("reference", "start: FILE", "best (node N)", or "fastest candidate (node N)" where
    # a baseline won the head to head): {"kernels": [KernelCounters as dicts]} or {"error": one line}; empty where ncu
    # was not run (kernelevolve.counters)
    counters: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def counters_key(node_id: int, baseline_won: bool = False) -> str:
        """The key of a judged candidate's counters: ``best (node N)``, or ``fastest candidate (node N)`` where a
        baseline won the head to head and best.py is that baseline's kernel."""
        return f"{'fastest candidate' if baseline_won else 'best'} (node {node_id})"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["top_ops"] = [dict(op) for op in values.get("top_ops", [])]
        values["notes"] = list(values.get("notes", []))
        return cls(**values)


def profile_problem(problem: Problem, device: str = "cpu", measure_ceilings: bool = False) -> Profile:
    """Run the problem's reference on ``device`` and place it on that device's roofline."""
    kind = _device_kind(device)
    module = import_module_from_path(problem.path, f"_ke_profile_{problem.short_sha}")
    model = build_model(module, "Model", 0).to(device)  # in its constructed mode, as the judge times it
    inputs = make_inputs(module, 0, device=device)  # drawn on the device where it can: large inputs in seconds
    notes: list[str] = []
    with torch.no_grad(), _tf32(problem.allow_tf32):
        flops, matmul_share, gemm_share = _count_flops(model, inputs)
        outputs = as_outputs(model(*inputs))
        nbytes = _min_bytes(model, inputs, outputs)
        dtype = _dominant_dtype(model, inputs, outputs)
        run = functools.partial(model, *inputs)
        eager_ms = _eager_ms(run, device)
        top_ops = _top_ops(run, kind)
    name = _device_name(device)
    peak_flops, peak_bw, source = _ceilings(kind, name, dtype, problem.allow_tf32, matmul_share >= 0.5,
                                            measure_ceilings, device, notes, gemm=gemm_share >= 0.5)
    floor_ms = max(flops / peak_flops, nbytes / peak_bw) * 1e3
    intensity, ridge = flops / max(nbytes, 1), peak_flops / peak_bw
    bound = _bound(kind, floor_ms, eager_ms, intensity, ridge, notes)
    if flops == 0:
        notes.append("no matmul-like FLOPs counted (elementwise math is not counted): the floor is bandwidth only")
    if eager_ms < floor_ms:
        # Seen on CPU: a 64x256x256 Linear runs from cache faster than the measured 1024^3 matmul / 64 MB copy rates.
        notes.append(f"eager {eager_ms:.4f} ms beats the floor {floor_ms:.4f} ms: the ceilings understate "
                     "this op's peak")
    return Profile(device=kind, device_name=name, flops=flops, bytes=nbytes, dtype=dtype, peak_flops=peak_flops,
                   peak_bw=peak_bw, ceilings_source=source, floor_ms=floor_ms, intensity=intensity, ridge=ridge,
                   bound=bound, eager_ms=eager_ms, top_ops=top_ops, notes=notes)


def _device_kind(device: str) -> str:
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise ProfileError(f"unsupported device {device!r} (expected cpu or cuda)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ProfileError("CUDA was asked for but is not available")
    return kind


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _count_flops(model: torch.nn.Module, inputs: list[Any]) -> tuple[int, float, float]:
    """Total FLOPs of one forward, the share of them that comes from matmul-like ops, and the share from plain GEMMs
    (mm, addmm, bmm, baddbmm: no convolution, no attention)."""
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    total = int(counter.get_total_flops())
    per_op = counter.get_flop_counts().get("Global", {})
    names = {str(op).split(".")[-1]: n for op, n in per_op.items()}
    matmul = sum(n for name, n in names.items() if any(m in name for m in MATMUL_MARKERS))
    gemm = sum(n for name, n in names.items() if "mm" in name)
    return total, (matmul / total if total else 0.0), (gemm / total if total else 0.0)


def _tensors(model: torch.nn.Module, inputs: list[Any]) -> list[torch.Tensor]:
    """Inputs, parameters and buffers, each storage once (a tied weight or an input passed twice is read once)."""
    seen: set[tuple[int, int]] = set()
    out: list[torch.Tensor] = []
    for t in [*inputs, *model.parameters(), *model.buffers()]:
        if isinstance(t, torch.Tensor) and (t.data_ptr(), t.nbytes) not in seen:
            seen.add((t.data_ptr(), t.nbytes))
            out.append(t)
    return out


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _touched_rows(func: Any, args: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(source, unique row ids) when ``func`` reads only whole rows of its first argument picked by an index."""
    aten = torch.ops.aten
    src, index = args[0], None
    if func in (aten.embedding.default, aten._embedding_bag.default, aten._embedding_bag_forward_only.default,
                aten.embedding_bag.default, aten.embedding_bag.padding_idx):
        index = args[1]
    elif func is aten.index_select.default and args[1] in (0, -src.dim()):
        index = args[2]
    elif func is aten.index.Tensor and len(args[1]) == 1 and isinstance(args[1][0], torch.Tensor):
        index = args[1][0] if not args[1][0].dtype == torch.bool else None
    if not isinstance(src, torch.Tensor) or not isinstance(index, torch.Tensor) or src.dim() < 1:
        return None
    return src, torch.unique(index.reshape(-1))


class _ReadBytes(TorchDispatchMode):
    """Bytes that one forward must read from each watched tensor: all of it, unless every op that reads it only
    gathers whole rows by index (embeddings, index_select, x[idx]); then only the distinct rows it picks."""

    def __init__(self, watched: list[torch.Tensor]):
        super().__init__()
        self.watched = {_storage(t) for t in watched}
        self.full: set[int] = set()
        self.rows: dict[int, list[tuple[torch.Tensor, int]]] = {}  # storage -> (row ids, bytes per row)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not getattr(func, "is_view", False):
            picked = _touched_rows(func, args)
            rest = list(args)
            if picked is not None and _storage(picked[0]) in self.watched:
                src, ids = picked
                self.rows.setdefault(_storage(src), []).append((ids, src[0].numel() * src.element_size()))
                rest = rest[1:]  # the gathered table: only its picked rows are read
            for a in [*rest, *kwargs.values()]:
                for t in a if isinstance(a, (list, tuple)) else [a]:
                    if isinstance(t, torch.Tensor) and _storage(t) in self.watched:
                        self.full.add(_storage(t))
        return func(*args, **kwargs)

    def read(self, t: torch.Tensor) -> int:
        key = _storage(t)
        if key in self.full or key not in self.rows:
            return t.nbytes
        parts = self.rows[key]
        if len({size for _, size in parts}) != 1:  # gathered at two row widths: the largest gather alone
            return min(t.nbytes, max(ids.numel() * size for ids, size in parts))
        ids = torch.unique(torch.cat([ids for ids, _ in parts]))
        return min(t.nbytes, ids.numel() * parts[0][1])


def _min_bytes(model: torch.nn.Module, inputs: list[Any], outputs: tuple[Any, ...]) -> int:
    """Every input, parameter and buffer read once (a row-gathered table only for its distinct rows), and every output
    written once."""
    tensors = _tensors(model, inputs)
    reads = _ReadBytes(tensors)
    with reads:
        model(*inputs)
    return sum(reads.read(t) for t in tensors) + sum(o.nbytes for o in outputs if isinstance(o, torch.Tensor))


def _dominant_dtype(model: torch.nn.Module, inputs: list[Any], outputs: tuple[Any, ...]) -> str:
    weight: dict[torch.dtype, int] = {}
    for t in _tensors(model, inputs):
        if t.is_floating_point():
            weight[t.dtype] = weight.get(t.dtype, 0) + t.nbytes
    if not weight:  # integer-only inputs (e.g. indices): fall back to what the op produces
        weight = {o.dtype: o.nbytes for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point()}
    best = max(weight, key=weight.__getitem__) if weight else torch.float32
    return str(best).removeprefix("torch.")


def _median_ms(fn: Callable[[], Any], device: str, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    if not device.startswith("cuda"):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    # CUDA events, not host timers: a sync per rep adds ~10 us, which would swamp tiny ops.
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize(device)
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def _eager_ms(run: Callable[[], Any], device: str, budget_ms: float = 200.0) -> float:
    """Median of the reference, with as many reps (5..100) as fit in ``budget_ms``."""
    first = _median_ms(run, device, reps=1, warmup=2)
    reps = int(min(100, max(5, budget_ms / max(first, 1e-3))))
    return _median_ms(run, device, reps=reps, warmup=1)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """The profiler's native backend prints start/stop lines straight to fd 2; keep them off the user's terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _top_ops(run: Callable[[], Any], kind: str, iters: int = 3) -> list[dict[str, Any]]:
    """The dominant ops by self time per forward: CUDA kernels on cuda, ATen ops on cpu."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if kind == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with quiet_stderr(), torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            run()
        if kind == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        # On cuda an ATen op's self device time repeats its kernels' time, so keep device events only.
        on_device = e.device_type != DeviceType.CPU
        us = e.self_device_time_total if kind == "cuda" else e.self_cpu_time_total
        if us > 0 and on_device == (kind == "cuda"):
            rows.append((e.key, float(us), int(e.count)))
    total = sum(us for _, us, _ in rows) or 1.0
    rows.sort(key=lambda r: -r[1])
    return [{"name": name, "self_ms": us / iters / 1e3, "pct": 100.0 * us / total, "calls": max(1, round(n / iters))}
            for name, us, n in rows[:TOP_K]]


def table_ceilings(device_name: str) -> dict[str, float] | None:
    """Datasheet ceilings of a known GPU, or None."""
    for key, ceilings in GPU_CEILINGS:
        if re.search(rf"\b{re.escape(key)}\b", device_name):
            return ceilings
    return None


@functools.lru_cache(maxsize=None)
def measured_ceilings(device: str, dtype: str = "float32", tf32: bool = False) -> tuple[float, float]:
    """(matmul FLOP/s, copy bytes/s) measured on ``device``; cached per process.

    GPU: a 256 MB copy and a 4096^3 matmul in ``dtype``. CPU: a 64 MB copy and a 1024^3 float32 matmul (~0.3 s total).
    """
    on_gpu = device.startswith("cuda")
    src = torch.ones((256 if on_gpu else 64) * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), device, reps=5)
    bw = 2 * src.nbytes / (copy_ms * 1e-3)  # read + write
    del src, dst
    n = 4096 if on_gpu else 1024
    mm_dtype = getattr(torch, dtype) if on_gpu else torch.float32
    a = torch.randn(n, n, device=device).to(mm_dtype)
    b = torch.randn(n, n, device=device).to(mm_dtype)
    with _tf32(tf32):
        mm_ms = _median_ms(lambda: torch.mm(a, b), device, reps=5)
    flops = 2 * n**3 / (mm_ms * 1e-3)
    log.info("measured ceilings on %s: %.1f GB/s copy, %.2f TFLOP/s matmul (%s)", device, bw / 1e9, flops / 1e12,
             mm_dtype)
    return flops, bw


def _peak_key(dtype: str, tf32: bool, matmul: bool, notes: list[str]) -> str:
    if not matmul:
        return "fp32"
    if dtype in ("bfloat16", "float16"):
        return "fp16"
    if dtype == "float32":
        return "tf32" if tf32 else "fp32"
    notes.append(f"no {dtype} column in the ceilings table: the fp32 peak stands in")
    return "fp32"


def _ceilings(kind: str, name: str, dtype: str, tf32: bool, matmul: bool, measure: bool, device: str,
              notes: list[str], gemm: bool = False) -> tuple[float, float, str]:
    """(peak FLOP/s, peak bytes/s, source) for the floor. ``gemm``: most FLOPs are plain GEMMs, which the matmul
    templates can run in fp32 as three TF32 tensor-core products."""
    key = _peak_key(dtype, tf32, matmul, notes)
    table = table_ceilings(name) if kind == "cuda" else None
    if table is not None and not measure:
        peak = table[key]
        if key == "fp32" and gemm and dtype == "float32" and name.startswith("NVIDIA") and table["tf32"] / 3 > peak:
            # fp32-accurate products also run as three TF32 tensor-core products on a hi/lo split (the matmul
            # templates' tf32x3 modes, on NVIDIA GPUs): the faster of the two bounds what an fp32 GEMM can take.
            # Convolutions and attention have no such kernel here, and keep the FMA peak.
            peak = table["tf32"] / 3
            notes.append("fp32 products without TF32: the floor takes three TF32 tensor-core products per product "
                         f"(tf32x3, {peak / 1e12:.1f} TFLOP/s) over the FMA peak ({table['fp32'] / 1e12:.1f})")
            key = "tf32x3"
        notes.append(f"ceilings from the {name} datasheet: {key} {peak / 1e12:.1f} TFLOP/s, "
                     f"{table['bw'] / 1e9:.0f} GB/s")
        return peak, table["bw"], "table"
    if kind == "cuda":
        mm_dtype = dtype if dtype in ("bfloat16", "float16", "float32", "float64") else "float32"
        flops, bw = measured_ceilings(device, mm_dtype, tf32 and mm_dtype == "float32")
    else:
        flops, bw = measured_ceilings("cpu")
    notes.append(f"ceilings measured on {name}: matmul {flops / 1e12:.3f} TFLOP/s, copy {bw / 1e9:.1f} GB/s")
    return flops, bw, "measured"


def _bound(kind: str, floor_ms: float, eager_ms: float, intensity: float, ridge: float, notes: list[str]) -> str:
    if floor_ms < LATENCY_FLOOR_MS[kind]:
        notes.append(f"latency: floor {floor_ms:.4f} ms < {LATENCY_FLOOR_MS[kind]} ms, launch overhead dominates")
        return "latency"
    if floor_ms < TINY_FLOOR_MS and eager_ms > LATENCY_RATIO * floor_ms:
        notes.append(f"latency: eager {eager_ms:.4f} ms > {LATENCY_RATIO:.0f} x floor {floor_ms:.4f} ms on a tiny op")
        return "latency"
    if intensity > ridge:
        notes.append(f"compute: intensity {intensity:.1f} FLOP/B > ridge {ridge:.1f} FLOP/B")
        return "compute"
    notes.append(f"memory: intensity {intensity:.1f} FLOP/B <= ridge {ridge:.1f} FLOP/B")
    return "memory"


def render_profile(profile: Profile) -> str:
    """A plain-text summary for the CLI."""
    p = profile
    achieved = 100.0 * p.floor_ms / p.eager_ms if p.eager_ms > 0 else 0.0
    lines = [
        f"device     {p.device} ({p.device_name})",
        f"work       {p.flops / 1e9:.3f} GFLOP, {p.bytes / 1e6:.3f} MB moved, dtype {p.dtype}",
        f"ceilings   {p.peak_flops / 1e12:.2f} TFLOP/s, {p.peak_bw / 1e9:.1f} GB/s ({p.ceilings_source})",
        f"floor      {p.floor_ms:.4f} ms",
        f"intensity  {p.intensity:.2f} FLOP/B vs ridge {p.ridge:.2f} FLOP/B",
        f"bound      {p.bound}",
        f"eager      {p.eager_ms:.4f} ms ({achieved:.1f}% of floor)",
        "top ops (self time per forward):",
        f"  {'name':<56} {'self ms':>9} {'pct':>6} {'calls':>5}",
    ]
    for op in p.top_ops:
        name = op["name"] if len(op["name"]) <= 56 else op["name"][:53] + "..."
        lines.append(f"  {name:<56} {op['self_ms']:>9.4f} {op['pct']:>5.1f}% {op['calls']:>5}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)
