"""Correctness and anti-cheat checks.

Output comparison runs in the parent, which alone holds the reference outputs. The tamper snapshots run in the child,
taken by the harness before the candidate is imported.
"""
from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import Any, Callable, Sequence

import torch

# (atol, rtol) per output dtype, applied elementwise as |out - ref| <= atol + rtol * |ref|.
# float32 allows for reordered reductions: a 4096-long dot product of unit normals differs by ~5e-4 between
# summation orders. With ALLOW_TF32 the float32 entry becomes TF32_TOL (10-bit mantissa operands).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-3, 1e-3),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
TF32_TOL = (1e-2, 1e-2)
EXACT_TOL = (0.0, 0.0)  # integers and bool must match exactly
# Where the reference itself is far from the exact (float64) result, as on reductions tens of thousands long, an
# element is also accepted when its error against the exact result is within this many times the reference's own
# error (its root mean square over the output). A summation order that differs from the reference's moves a near-zero
# fp32 output of a 32768-long product by about 1e-3, past atol; lower-precision arithmetic (bf16, or TF32 where it is
# not allowed) lands 60 to 1000 times further from the exact result than the fp32 reference does, and still fails.
REF_ERROR_FACTOR = 8.0
# Elements compared at once: 16M, so the comparison's temporaries stay near 100 MB whatever the output's size.
COMPARE_CHUNK = 1 << 24

SECRET_PATTERN = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def tolerance(dtype: torch.dtype, allow_tf32: bool = False, atol: float | None = None,
              rtol: float | None = None) -> tuple[float, float]:
    if dtype.is_floating_point or dtype.is_complex:
        default = TF32_TOL if (allow_tf32 and dtype == torch.float32) else TOLERANCES.get(dtype, (1e-2, 1e-2))
    else:
        default = EXACT_TOL
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


def judged_as(dtype: torch.dtype, rounded_in: Sequence[str], i: int) -> torch.dtype:
    """The dtype whose tolerance output ``i`` (of ``dtype``) is judged at: its own, or the less precise one the
    reference rounded it in on the way (Problem.rounded_in: a float32 mean of bfloat16 sums is as precise as they)."""
    name = rounded_in[i] if i < len(rounded_in) else ""
    low = getattr(torch, name, None) if name else None
    return low if isinstance(low, torch.dtype) and low.is_floating_point and dtype.is_floating_point else dtype


def compare_outputs(ref: tuple[torch.Tensor, ...], out: tuple[Any, ...], allow_tf32: bool = False,
                    atol: float | None = None, rtol: float | None = None,
                    exact: Callable[[], tuple[torch.Tensor, ...] | None] | None = None,
                    rounded_in: Sequence[str] = ()) -> str | None:
    """None when ``out`` matches ``ref`` on every element; otherwise a one-line reason with mismatch statistics.

    ``exact``: computes the reference in float64 (one tensor per output, or None where it cannot), called only when
    some element is outside the tolerance around ``ref``. Such an element still passes when it is within the tolerance
    around the exact value, or within REF_ERROR_FACTOR times the reference's own error, whichever is larger: never
    stricter than ``ref`` alone."""
    exact_at = exact_per_output(exact)
    if len(out) != len(ref):
        return f"expected {len(ref)} output(s), got {len(out)}"
    for i, (r, o) in enumerate(zip(ref, out)):
        name = f"output {i}" if len(ref) > 1 else "output"
        if type(o) is not torch.Tensor:
            return f"{name} is {type(o).__name__}, not exactly torch.Tensor"
        if o.shape != r.shape:
            return f"{name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if o.dtype != r.dtype:
            return f"{name} has dtype {o.dtype}, expected {r.dtype}"
        tol = tolerance(judged_as(r.dtype, rounded_in, i), allow_tf32, atol, rtol)
        reason = _compare_values(r, o, *tol, exact=lambda: exact_at(i))
        if reason:
            return f"{name}: {reason}"
    return None


def exact_per_output(exact: Callable[[], tuple[torch.Tensor, ...] | None] | None) -> Callable[[int], Any]:
    """Output ``i`` of the float64 reference (None where there is none), ``exact`` called at most once."""
    got: list[Any] = []

    def at(i: int) -> torch.Tensor | None:
        if exact is None:
            return None
        if not got:
            got.append(exact())
        return got[0][i] if got[0] is not None and i < len(got[0]) else None

    return at


def outside_tolerance(r: torch.Tensor, o: torch.Tensor, atol: float, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``|o - r|`` and where it exceeds ``atol + rtol * |r|``, among elements finite on both sides: where NaN and Inf
    sit is the pattern check's to judge, so that a NaN never hides, nor stands for, the value errors."""
    err = (o - r).abs()
    bad = err > atol + rtol * r.abs()  # NaN differences compare False; only an Inf on one side gives True
    if bool(bad.any()):
        bad &= torch.isfinite(r) & torch.isfinite(o)
    return err, bad


def _compare_values(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float,
                    exact: Callable[[], torch.Tensor | None] = lambda: None) -> str | None:
    """One output against the reference, a chunk of elements at a time: the temporaries stay at a few hundred MB
    when the output is many GB, so the comparison never takes the memory the candidate's process is using."""
    # an output kept in host memory moves to the reference's device a chunk at a time
    r_all, o_all, n, chunk = ref.reshape(-1), out.reshape(-1), ref.numel(), COMPARE_CHUNK
    spans = [(i, min(i + chunk, n)) for i in range(0, n, chunk)]
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        bad = sum(int((r_all[a:b] != o_all[a:b].to(ref.device)).sum()) for a, b in spans)
        return f"{bad} of {n} elements differ (exact match required)" if bad else None
    wide = compared_as(ref.dtype)
    pattern = _special_patterns(r_all, o_all, wide, spans)
    values = _value_errors(ref, r_all, o_all, wide, spans, atol, rtol, exact)
    return "; ".join(filter(None, (pattern, values))) or None


def compared_as(dtype: torch.dtype) -> torch.dtype:
    """The dtype a floating or complex output is compared in, a chunk at a time."""
    if dtype.is_complex:  # a cast to a real dtype would drop the imaginary parts unchecked
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.float64 if dtype == torch.float64 else torch.float32


def _value_errors(ref: torch.Tensor, r_all: torch.Tensor, o_all: torch.Tensor, wide: torch.dtype,
                  spans: list[tuple[int, int]], atol: float, rtol: float,
                  exact: Callable[[], torch.Tensor | None]) -> str | None:
    """How many elements finite on both sides are outside the tolerance, and the worst of them."""
    widen = Widening(ref, exact, atol, rtol) if ref.dtype.is_floating_point else None
    n_bad, worst = 0, None
    for a, b in spans:
        r, o = r_all[a:b].to(wide), o_all[a:b].to(ref.device, wide)
        err, bad = outside_tolerance(r, o, atol, rtol)
        if not bool(bad.any()):
            continue
        if widen is not None:
            bad = widen.still_bad(r, o, bad, a, b)
        k = int(bad.sum())
        if not k:
            continue
        n_bad += k
        err = torch.where(bad, err, torch.zeros_like(err))
        at = int(torch.argmax(err))
        if worst is None or float(err[at]) > worst[0]:
            worst = (float(err[at]), o[at].item(), r[at].item())
    if not n_bad:
        return None
    note = widen.note if widen is not None and widen.used else ""
    return (f"{n_bad} of {r_all.numel()} elements outside atol={atol:g} rtol={rtol:g}{note}; "
            f"max abs err {worst[0]:.3g} (out {worst[1]:.6g} vs ref {worst[2]:.6g})")


def _special_patterns(r_all: torch.Tensor, o_all: torch.Tensor, wide: torch.dtype,
                      spans: list[tuple[int, int]]) -> str | None:
    """Where NaN and Inf sit must agree, and the infinities too."""
    nan_r = nan_o = 0
    nan_differs = inf_differs = False
    for a, b in spans:
        r, o = r_all[a:b].to(wide), o_all[a:b].to(r_all.device, wide)
        nr, no = torch.isnan(r), torch.isnan(o)
        nan_r, nan_o = nan_r + int(nr.sum()), nan_o + int(no.sum())
        nan_differs = nan_differs or not torch.equal(nr, no)
        if not nan_differs and not inf_differs:
            ir, io = torch.isinf(r), torch.isinf(o)
            inf_differs = not torch.equal(ir, io) or (bool(ir.any()) and not torch.equal(r[ir], o[io]))
    if nan_differs:
        return f"NaN pattern differs ({nan_r} NaN in reference, {nan_o} in output)"
    return "Inf pattern differs" if inf_differs else None


class Widening:
    """Re-judges the elements outside the tolerance around the reference against the exact (float64) result, which
    is computed on the first such element and then shared by every chunk."""

    def __init__(self, ref: torch.Tensor, exact: Callable[[], torch.Tensor | None], atol: float, rtol: float):
        self.shape, self.r_all, self.exact, self.atol, self.rtol = ref.shape, ref.reshape(-1), exact, atol, rtol
        self.e_all: torch.Tensor | None = None
        self.own = 0.0
        self.used = self.tried = False

    @property
    def note(self) -> str:
        return f" (or {REF_ERROR_FACTOR:g}x the reference's own error {self.own:.3g} from the float64 result)"

    def still_bad(self, r: torch.Tensor, o: torch.Tensor, bad: torch.Tensor, a: int, b: int) -> torch.Tensor:
        if not self.tried:
            self.tried = True
            e = self.exact()
            if e is not None and e.shape == self.shape:
                self.e_all = e.reshape(-1)
                self.own = _rms_difference(self.r_all, self.e_all)
        if self.e_all is None:
            return bad
        self.used = True
        e = self.e_all[a:b].to(r.device, torch.float64)[bad]
        allowed = torch.clamp(self.atol + self.rtol * e.abs(), min=REF_ERROR_FACTOR * self.own)
        still = bad.clone()
        still[bad] = ~((o[bad].double() - e).abs() <= allowed)
        return still


def _rms_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The root mean square of the finite elements of ``a - b``, in float64, a chunk at a time (outputs can be GBs);
    ``b`` may live on another device."""
    a, b, chunk = a.reshape(-1), b.reshape(-1), COMPARE_CHUNK
    total, count = 0.0, 0
    for i in range(0, a.numel(), chunk):
        d = a[i:i + chunk].double() - b[i:i + chunk].to(a.device, torch.float64)
        d = d[torch.isfinite(d)]
        total += float(d.square().sum())
        count += d.numel()
    return math.sqrt(total / count) if count else 0.0


# Variables named as secrets at run time (e.g. --llm-key-env MY_CREDS), removed whatever their names look like.
SECRET_NAMES: set[str] = set()


def register_secret(name: str) -> None:
    """Treat the environment variable ``name`` as a secret: no candidate process will see it."""
    SECRET_NAMES.add(name)


def scrub_environment(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without API keys, tokens and other secrets."""
    return {k: v for k, v in env.items() if not SECRET_PATTERN.search(k) and k not in SECRET_NAMES}


def timer_snapshot() -> dict[str, Any]:
    """The identity of every clock and timing function a candidate could patch to fake its speed."""
    snap: dict[str, Any] = {f"time.{n}": getattr(time, n) for n in
                            ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
                             "process_time", "sleep")}
    snap["torch.cuda.synchronize"] = torch.cuda.synchronize
    snap["torch.cuda.Event"] = torch.cuda.Event
    for n in ("record", "elapsed_time", "synchronize", "query", "wait"):
        snap[f"torch.cuda.Event.{n}"] = getattr(torch.cuda.Event, n)
    snap["torch.cuda.current_stream"] = torch.cuda.current_stream
    snap["torch.Tensor.zero_"] = torch.Tensor.zero_
    # The timing loop reads its own bindings, not time.perf_counter: those must stay put too.
    from kernelevolve.evaluate import timing

    for n in ("_perf", "_sync", "_Event", "_record", "_elapsed", "_zero", "_sleep", "_call_until", "warm_up",
              "measure", "sleep_cycles", "capture_graph", "_time_cpu", "_time_cuda"):
        snap[f"timing.{n}"] = getattr(timing, n)
    try:
        import triton.testing

        snap["triton.testing.do_bench"] = triton.testing.do_bench
    except ImportError:
        pass
    return snap


def tampered(before: dict[str, Any]) -> list[str]:
    """Names in ``before`` that no longer refer to the same object."""
    now = timer_snapshot()
    return [k for k, v in before.items() if now.get(k) is not v]


def live_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.is_alive() and t.ident is not None}


class ThreadOrigins:
    """Records the threads the candidate's own code starts. The creator of a thread is the first frame outside the
    threading, concurrent.futures and multiprocessing modules; a thread is the candidate's when that frame is in the
    candidate's file or in code with no file (exec'd strings). Pools that torch, triton or their helpers keep alive
    (Inductor's autotuning pool, progress-bar monitors) are theirs."""

    SKIP = (threading.__file__, os.path.join("concurrent", "futures", ""), os.path.join("multiprocessing", ""))

    def __init__(self, candidate_file: str):
        self.candidate_file = os.path.realpath(candidate_file) if candidate_file else ""
        self.owned: set[int] = set()
        original = threading.Thread.start
        origins = self

        def start(thread: threading.Thread, *args: Any, **kwargs: Any) -> Any:
            if origins._from_candidate():
                origins.owned.add(id(thread))
            return original(thread, *args, **kwargs)

        threading.Thread.start = start  # type: ignore[method-assign]

    def _from_candidate(self) -> bool:
        import sys

        frame = sys._getframe(2)
        while frame is not None and any(k in frame.f_code.co_filename for k in self.SKIP):
            frame = frame.f_back
        if frame is None:
            return True
        name = frame.f_code.co_filename
        return name.startswith("<") or not os.path.isfile(name) or os.path.realpath(name) == self.candidate_file

    def candidate_threads(self, baseline: set[int]) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.is_alive() and t.ident not in baseline and id(t) in self.owned]


def child_processes(parent: int | None = None) -> set[int]:
    """PIDs of live processes whose parent is ``parent`` (default: this process). Linux /proc; empty elsewhere."""
    me, found = parent or os.getpid(), set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(entry))
    return found


def become_subreaper() -> bool:
    """Make orphaned descendants (a daemon started with setsid by a short-lived shell, say) this process's children,
    so that the outlive check sees them and the kill reaches them. Linux only."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def die_with_parent(expected_parent: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent exits. The parent is the fork server, which exits when
    the evaluating process dies (killed, or a Ray worker lost): the evaluation then ends with it instead of running
    on with no deadline. Exits at once when the parent is already gone. Linux only."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
            return
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # orphaned before the signal was armed


def kill_children(parent: int | None = None) -> None:
    for pid in child_processes(parent):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
