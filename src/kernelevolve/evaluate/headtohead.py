"""The head-to-head before a run answers: its winner and the baselines timed in rounds, interleaved, on the same
inputs, and what the rounds say.

Two timings of one kernel taken minutes apart, in different processes, differ by a few percent (clocks, the
allocator's state, the neighbours on the machine); a winner 2% ahead of torch.compile by the judge's separate timings
may be no faster at all. In a head-to-head each side runs a round of calls in turn (its own process, prepared the
same way), for several rounds: drift in the machine reaches every side alike, and the spread of the per-round ratios
bounds the noise. The decision is a plain function of the round medians (``decide``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

CANDIDATE = "candidate"
# torch.compile's Inductor options of each compiled side (the inductor proposer's seeds use the same)
COMPILE_OPTIONS: dict[str, dict[str, Any]] = {
    "compiled": {}, "max_autotune": {"max_autotune": True, "coordinate_descent_tuning": True}}
SIDES = ("eager", *COMPILE_OPTIONS)
LABELS = {CANDIDATE: "the winner", "eager": "eager", "compiled": "torch.compile", "max_autotune": "max-autotune"}
# The confidence of the bounds on a speedup: a sign-test interval of the median per-round ratio (two-sided).
CONFIDENCE = 0.95
# The candidate must beat the best baseline by this much at the lower bound. The rounds bound the noise within one
# head-to-head; what they cannot see (a process's own offset, a few tenths of a percent on a GPU, a percent or two
# on a busy CPU even with layouts redrawn each round) this covers. A kernel 1% faster is not worth shipping.
MARGIN = 0.01
# On a GPU the candidate must also be faster by more than CUDA events resolve (about half a microsecond): two
# processes of one ~10 us call (three tiny kernels) read 0.01035 and 0.01054 ms over 10 rounds on an H100, a "win" of
# 1.03x [1.03-1.04] of the reference over itself that is one tick of the clock.
GPU_FLOOR_MS = 0.0005
# On the CPU two processes of one program can differ by several percent however their rounds interleave (the
# reference against itself read 1.08x [1.05-1.11] once on a 2-core machine): a CPU win must clear this instead.
CPU_MARGIN = 0.10


@dataclass(frozen=True)
class HeadToHead:
    """What the rounds say. ``speedup[b]`` is the answer's speedup over side ``b`` (the median over rounds of b's
    round median over the answer's), ``low[b]``/``high[b]`` its bounds at CONFIDENCE; ``answer`` is the side the
    run returns: the candidate where it beat the best baseline beyond the noise, else that baseline."""

    clock: str
    rounds: int
    ms: dict[str, float]  # median of the round medians, per side
    speedup: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    best_baseline: str
    answer: str
    candidate_vs_best: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # speedup, low, high
    round_ms: dict[str, list[float]] = field(default_factory=dict)  # each round's median, per side
    notes: dict[str, str] = field(default_factory=dict)  # per side: e.g. why it ran without a CUDA graph
    error: str = ""  # why it could not be held (then ``answer`` is empty, and the judge's timings stand)

    @classmethod
    def failed(cls, clock: str, error: str) -> "HeadToHead":
        return cls(clock, 0, {}, {}, {}, {}, "", "", error=error)

    @property
    def wins(self) -> bool:
        return self.answer == CANDIDATE

    def line(self) -> str:
        """One line: the rounds, each baseline's ratio with its bounds, and the answer."""
        if self.error:
            return f"head to head not held ({self.error}): the judge's timings stand"
        head = f"head to head ({self.rounds} rounds, {self.clock} clock)"
        best = LABELS.get(self.best_baseline, self.best_baseline)
        if self.wins:
            vs = ", ".join(f"{self.speedup[b]:.2f}x {LABELS.get(b, b)} [{self.low[b]:.2f}-{self.high[b]:.2f}]"
                           for b in self.speedup)
            return f"{head}: {vs}: the winner is faster than {best} beyond the noise"
        ratio, low, high = self.candidate_vs_best
        kernel = "the reference itself" if self.best_baseline == "eager" else f"{best}'s own kernel"
        return (f"{head}: the winner is not faster than {best} beyond the noise ({ratio:.2f}x [{low:.2f}-{high:.2f}]); "
                f"best.py is {kernel}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadToHead":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "candidate_vs_best" in d:
            d["candidate_vs_best"] = tuple(d["candidate_vs_best"])
        return cls(**d)


def _ratios(round_ms: dict[str, list[float]], slower: str, faster: str) -> list[float]:
    """Per round: ``slower``'s median over ``faster``'s, i.e. how many times faster ``faster`` was."""
    return [a / b for a, b in zip(round_ms[slower], round_ms[faster]) if b > 0]


def sign_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The 1-based rank k such that the k-th smallest and k-th largest of n samples bound their median with at least
    ``confidence`` (the sign test: P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2); 1 (the extremes) for few."""
    tail, k, cdf = (1 - confidence) / 2, 0, 0.0
    while k < n:
        cdf += math.comb(n, k) / 2 ** n
        if cdf > tail:
            break
        k += 1
    return max(1, k)


def _bounds(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    s = sorted(values)
    k = min(sign_rank(len(s)), (len(s) + 1) // 2)
    return s[k - 1], s[-k]


def decide(round_ms: dict[str, list[float]], clock: str = "call", notes: dict[str, str] | None = None,
           margin: float = MARGIN, floor_ms: float = 0.0) -> HeadToHead:
    """The head-to-head's verdict from each side's round medians (``round_ms[side][i]``, the same rounds for every
    side): the best baseline is the one of lowest median, and the candidate is the answer only where the lower bound
    of its speedup over that baseline is above 1 + ``margin`` (MARGIN; CPU_MARGIN on the CPU) and its median is
    faster by more than ``floor_ms`` (GPU_FLOOR_MS on a GPU: what the clock resolves). Every speedup reported is the
    answer's, over each baseline."""
    if CANDIDATE not in round_ms:
        raise ValueError("a head-to-head needs the candidate's rounds")
    baselines = [b for b in round_ms if b != CANDIDATE and round_ms[b]]
    if not baselines:
        raise ValueError("a head-to-head needs at least one baseline's rounds")
    ms = {side: statistics.median(v) for side, v in round_ms.items() if v}
    best = min(baselines, key=lambda b: ms[b])
    vs_best = _ratios(round_ms, best, CANDIDATE)
    low, high = _bounds(vs_best)
    answer = CANDIDATE if low > 1.0 + margin and ms[best] - ms[CANDIDATE] > floor_ms else best
    speedup, lows, highs = {}, {}, {}
    for b in baselines:
        ratios = _ratios(round_ms, b, answer) if b != answer else [1.0] * len(round_ms[b])
        speedup[b] = statistics.median(ratios)
        lows[b], highs[b] = _bounds(ratios)
    return HeadToHead(clock, min(len(v) for v in round_ms.values()), ms, speedup, lows, highs, best, answer,
                      (statistics.median(vs_best), low, high), {k: list(v) for k, v in round_ms.items()},
                      dict(notes or {}))


def carried(h: HeadToHead, first: HeadToHead) -> HeadToHead:
    """``h``, held against ``first``'s best baseline alone, with the other baselines of ``first`` carried over: each
    one's speedup is ``h``'s over that best baseline times how much slower the other was than it in ``first`` (its
    bounds alike), and its note says so. A later head-to-head of one run need not build every baseline again (a
    whole model's max-autotune build takes minutes): the answer has to beat the fastest of them, and ``first`` says
    which that is and by how much the others trail it."""
    best = first.best_baseline
    if h.error or best not in h.speedup or first.ms.get(best, 0.0) <= 0:
        return h
    ms, speedup, low, high, notes = dict(h.ms), dict(h.speedup), dict(h.low), dict(h.high), dict(h.notes)
    for b, b_ms in first.ms.items():
        if b == CANDIDATE or b in speedup:
            continue
        trail = b_ms / first.ms[best]
        ms[b] = h.ms[best] * trail
        speedup[b], low[b], high[b] = h.speedup[best] * trail, h.low[best] * trail, h.high[best] * trail
        notes[b] = (f"not timed again: {trail:.2f}x {LABELS.get(best, best)}'s time in the run's first head to head, "
                    f"carried over")
    return HeadToHead(h.clock, h.rounds, ms, speedup, low, high, h.best_baseline, h.answer, h.candidate_vs_best,
                      h.round_ms, notes, h.error)
