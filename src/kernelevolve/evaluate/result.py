"""Result of evaluating one candidate: a status from a closed enum, a one-line reason, timings and speedups."""
from __future__ import annotations

import enum
import json
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


SUSPECT_SPEEDUP = 10.0


class Status(str, enum.Enum):
    OK = "ok"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    REJECTED = "rejected"  # a cheat was detected


CLOCK_KEYS = ("clock", "call_ms", "sync_ms", "device_ms", "host_ms", "graph_ms", "graph_note", "launch_bound")


@dataclass(frozen=True)
class Timing:
    """Median and spread of repeated measurements, in milliseconds. ``median_ms`` is the clock that ranks kernels
    (``clock``: the call latency by default, the CUDA-graph replay with --timing graph); the other clocks are
    reported beside it (docs/timing.md)."""

    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    method: str  # "cuda-events" or "perf_counter"
    clock: str = "call"  # which clock median_ms is: "call" or "graph"
    call_ms: float | None = None  # a call from Python, cache cold, in a loop of calls (as do_bench times it)
    sync_ms: float | None = None  # one call with nothing but the cache flush queued ahead of it (GPU)
    device_ms: float | None = None  # the call's kernels alone, launched while the device was kept busy (GPU only)
    host_ms: float | None = None  # the host's time from the call to its return (its launches)
    graph_ms: float | None = None  # the call captured in a CUDA graph, replayed (GPU, where it captures)
    graph_note: str = ""  # why there is no graph time

    @classmethod
    def from_samples(cls, samples_ms: list[float], method: str, **clocks: Any) -> "Timing":
        median = statistics.median(samples_ms)
        return cls(median_ms=median, min_ms=min(samples_ms), max_ms=max(samples_ms), reps=len(samples_ms),
                   method=method, **{"call_ms": median, **clocks})

    def by(self, clock: str) -> "Timing":
        """This timing ranked by ``clock``: the graph replay's time where there is one, else the call latency."""
        if clock == "graph" and self.graph_ms is not None:
            return replace(self, median_ms=self.graph_ms, clock="graph")
        return self if self.call_ms is None else replace(self, median_ms=self.call_ms, clock="call")

    def clocks(self) -> dict[str, Any]:
        """The clocks beside the median, as plain data (a report, a JSON line, a benchmark row): CLOCK_KEYS."""
        return {k: getattr(self, k) for k in CLOCK_KEYS}

    @property
    def launch_bound(self) -> bool:
        """The host takes longer to launch a call than the device takes to run it: the device waits on the host,
        and only fewer launches or less Python per call (or CUDA graphs) make the call faster."""
        return self.host_ms is not None and self.device_ms is not None and self.host_ms >= self.device_ms


@dataclass(frozen=True)
class Baseline:
    """The reference timed twice, the same way as candidates: eager and under torch.compile (default mode)."""

    device: str
    eager: Timing | None
    compiled: Timing | None
    compile_s: float | None = None
    error: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Baseline":
        d = json.loads(text)
        for k in ("eager", "compiled"):
            d[k] = Timing(**d[k]) if d.get(k) else None
        return cls(**d)


@dataclass(frozen=True)
class Result:
    status: Status
    reason: str
    timing: Timing | None = None
    timed: bool = False  # False when timings would be meaningless (Triton interpreter) or were skipped
    load_s: float | None = None  # import + construction of ModelNew
    compile_s: float | None = None  # first call (JIT / autotune / Inductor compile), apart from run time
    wall_s: float | None = None  # the whole evaluation as the parent saw it
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    error: str = ""  # traceback or mismatch details
    log: str = ""  # the tail of the candidate process's stdout/stderr
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def runtime_ms(self) -> float | None:
        return self.timing.median_ms if self.timing else None

    def with_baseline(self, baseline: Baseline | None) -> "Result":
        if baseline is None or not self.timed or self.timing is None or self.timing.median_ms <= 0:
            return self  # a median of 0 ms (CUDA events 0.5 us apart or less) gives no finite speedup
        eager = baseline.eager.median_ms / self.timing.median_ms if baseline.eager else None
        comp = baseline.compiled.median_ms / self.timing.median_ms if baseline.compiled else None
        return replace(self, speedup_eager=eager, speedup_compile=comp)

    def flag_suspect(self, floor_ms: float | None, max_speedup: float = SUSPECT_SPEEDUP) -> "Result":
        """Mark a timing that beats the roofline floor, or a speedup over ``max_speedup``, as suspect until explained.
        A mark, not a verdict: the candidate passed every check."""
        why = []
        if self.timed and self.runtime_ms is not None and floor_ms and self.runtime_ms < floor_ms:
            why.append(f"faster than the roofline floor ({self.runtime_ms:.4g} ms < {floor_ms:.4g} ms)")
        if self.speedup_eager is not None and self.speedup_eager > max_speedup:
            why.append(f"{self.speedup_eager:.1f}x over eager")
        return replace(self, details={**self.details, "suspect": "; ".join(why)}) if why else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        d = dict(d)
        d["status"] = Status(d["status"])
        d["timing"] = Timing(**d["timing"]) if d.get("timing") else None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})



@dataclass(frozen=True)
class ScreenResult:
    """What the screen found for one candidate: checked once against the reference and timed briefly. It ranks
    candidates for the judge and never makes one ``ok``: only a judged Result does."""

    status: Status  # ok: the outputs matched once (and it timed, where timing means something)
    reason: str
    ms: float | None = None  # median of the brief timing; None where untimed
    first_call_s: float | None = None  # load, compile and first call, in the check stage
    # the screen failed on its own side (its process did not start, its memory ran out): the candidate was not
    # screened, and goes to the judge as it is
    harness: bool = False
    host_ms: float | None = None  # median host time to launch a call while timed (see TimingRun.host_ms)
    timed_at: float | None = None  # when its timing began, by the clock of the day
    details: dict[str, Any] = field(default_factory=dict)  # "mismatch": where wrong outputs are wrong (see mismatch.py)
    error: str = ""  # the tail of a failure's traceback or compiler message

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and not self.harness

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), status=self.status.value)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScreenResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known and k != "status"}, status=Status(d["status"]))
