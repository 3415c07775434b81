"""The judge's clock: the reference submitted as its own candidate reads 1.00x its baseline within the noise, by the
judge's separate timings and in a head-to-head, on problems of different sizes; what the head-to-head decides from
its rounds; the clocks a timing carries. GPU cases run the same checks on the device, where the launch work counts."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, Status, Timing, TimingConfig
from kernelevolve.evaluate.headtohead import CANDIDATE, MARGIN, HeadToHead, decide, sign_rank
from kernelevolve.problem import load_problem

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return x * torch.sigmoid(x) + self.bias


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return [{cols}]
'''

MATMUL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return [{cols}, {cols}]
'''


def as_candidate(source: str) -> Candidate:
    """The problem's own code as a candidate: the reference judged against itself."""
    return Candidate(source + "\n\nclass ModelNew(Model):\n    pass\n", proposer="manual")


def evaluator(tmp_path: Path, source: str, device: str, budget_ms: float) -> Evaluator:
    path = tmp_path / "problem.py"
    path.write_text(source)
    timing = TimingConfig(budget_ms=budget_ms, warmup_ms=budget_ms / 4)
    return Evaluator(load_problem(path), EvalConfig(device=device, timeout_s=300.0, timing=timing), tmp_path / "w")


# --- the decision, from a table of rounds -----------------------------------------------------------------------
def test_sign_rank_bounds_the_median_at_the_confidence() -> None:
    assert [sign_rank(n) for n in (1, 5, 8, 9, 10, 20)] == [1, 1, 1, 2, 2, 6]
    for n in range(9, 40):  # P(Binomial(n, 1/2) < k) <= 2.5%, and k + 1 would exceed it
        k = sign_rank(n)
        below = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        assert below <= 0.025 < below + math.comb(n, k) / 2 ** n


@pytest.mark.parametrize("candidate, compiled, answer", [
    ([1.00] * 10, [1.00] * 10, "compiled"),  # the same time: the baseline stands
    ([0.90] * 10, [1.00] * 10, CANDIDATE),  # 11% faster in every round
    ([1.0, 0.9] * 5, [0.95] * 10, "compiled"),  # faster in half the rounds only: noise
    ([0.995] * 10, [1.00] * 10, "compiled"),  # within MARGIN
    ([0.97] * 9 + [2.0], [1.00] * 10, CANDIDATE),  # one bad round does not undo nine
])
def test_the_candidate_answers_only_where_it_beats_the_best_baseline_beyond_the_noise(candidate, compiled,
                                                                                     answer) -> None:
    h = decide({CANDIDATE: candidate, "eager": [1.5] * 10, "compiled": compiled})
    assert h.best_baseline == "compiled" and h.answer == answer
    assert h.wins == (answer == CANDIDATE)
    # the speedups are the answer's: the best baseline's own is 1.00x where it answers
    assert h.speedup["compiled"] == pytest.approx(1.0 if answer == "compiled" else statistics.median(
        [b / c for b, c in zip(compiled, candidate)]))
    assert h.speedup["eager"] > 1.4
    assert ("not faster" in h.line()) == (answer != CANDIDATE)


def test_a_later_head_to_head_carries_the_first_ones_other_baselines() -> None:
    """Held against the first head-to-head's fastest baseline alone, a later one reports the others from the first:
    each trails the fastest by the first's ratio, and its note says it was not timed again."""
    from kernelevolve.evaluate.headtohead import carried

    first = decide({CANDIDATE: [1.2] * 10, "eager": [1.0] * 10, "compiled": [1.5] * 10, "max_autotune": [2.0] * 10})
    assert first.best_baseline == "eager" and not first.wins
    later = carried(decide({CANDIDATE: [0.5] * 10, "eager": [1.0] * 10}), first)
    assert later.wins and later.best_baseline == "eager"
    assert later.speedup == pytest.approx({"eager": 2.0, "compiled": 3.0, "max_autotune": 4.0})
    assert later.ms["max_autotune"] == pytest.approx(2.0)
    assert set(later.notes) == {"compiled", "max_autotune"} and "not timed again" in later.notes["compiled"]
    assert set(later.round_ms) == {CANDIDATE, "eager"}  # the rounds are the later ones' alone
    lost = carried(decide({CANDIDATE: [1.1] * 10, "eager": [1.0] * 10}), first)
    assert not lost.wins and lost.speedup == pytest.approx({"eager": 1.0, "compiled": 1.5, "max_autotune": 2.0})
    failed = HeadToHead.failed("call", "a side died")
    assert carried(failed, first) is failed


def test_the_best_baseline_is_the_fastest_side_and_the_lower_bound_decides() -> None:
    h = decide({CANDIDATE: [1.0] * 10, "eager": [0.98] * 10, "compiled": [1.2] * 10})
    assert h.best_baseline == "eager" and h.answer == "eager"
    assert h.speedup["compiled"] == pytest.approx(1.2 / 0.98)
    lo = 1.0 + MARGIN + 0.001  # every round just past the margin but one: the second smallest ratio decides
    h = decide({CANDIDATE: [1.0] * 10, "eager": [lo] * 9 + [0.5]})
    assert h.answer == CANDIDATE
    h = decide({CANDIDATE: [1.0] * 10, "eager": [lo] * 8 + [0.5, 0.5]})
    assert h.answer == "eager"


def test_a_head_to_head_round_trips_through_its_dict() -> None:
    h = decide({CANDIDATE: [0.5] * 10, "eager": [1.0] * 10}, "graph", {"eager": "not captured"})
    again = HeadToHead.from_dict(h.to_dict())
    assert again == h and again.clock == "graph" and again.notes == {"eager": "not captured"}
    failed = HeadToHead.failed("call", "a process died")
    assert not failed.answer and "not held" in failed.line()
    with pytest.raises(ValueError):
        decide({"eager": [1.0]})


def test_a_timing_is_read_on_the_clock_asked_for() -> None:
    t = Timing.from_samples([2.0, 3.0, 4.0], "cuda-events", device_ms=1.0, host_ms=1.5)
    assert t.call_ms == 3.0 and t.clock == "call" and t.launch_bound  # the host launches slower than it runs
    assert t.by("graph") == t  # no graph time: the call's stands
    g = Timing.from_samples([2.0, 3.0, 4.0], "cuda-events", device_ms=1.0, host_ms=0.5, graph_ms=1.2)
    assert g.by("graph").median_ms == 1.2 and g.by("graph").clock == "graph"
    assert g.by("graph").by("call").median_ms == 3.0 and not g.launch_bound
    # a timing stored before the clocks existed still reads
    assert Timing(**{"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "reps": 1, "method": "perf_counter"}).call_ms \
        is None


# --- the reference against itself ---------------------------------------------------------------------------------
# The smallest call (about 0.04 ms, mostly Python) timed in two separate processes on a shared 2-core machine read
# 0.39x, 0.48x, 0.54x and 0.59x in single pairs, and a median of three pairs of 0.54x in one CI run with the machine
# otherwise idle: noise between processes that no bound short of meaninglessness holds. It runs with the slow tests;
# in the default run the interleaved head-to-head below is what guards a small call.
CPU_SIZES = [pytest.param(64, 64, marks=pytest.mark.slow), (512, 1000), (2048, 2048)]


@pytest.mark.parametrize("rows, cols", CPU_SIZES)
def test_the_reference_as_its_own_candidate_reads_one_on_the_cpu(tmp_path: Path, rows: int, cols: int) -> None:
    """Each side is timed in a process of its own, prepared alike; before the allocator's thresholds were fixed the
    baseline's process paid page faults on every call the candidate's did not (4.8x for [512, 1000]). Two separate
    timings on a shared 2-core machine still differ by up to ~15%, and ~30% for a call of 0.05 ms that is mostly
    Python (where the buffers and the interpreter's own data lie after each flush): the head-to-head below is what
    bounds that noise. A pair that lands outside the bounds is timed twice more and the median of the three pairs
    decides: the smallest call read 0.48x and 0.59x in single pairs on a quiet machine (and 0.83-1.13x in 18 pairs
    around them), where a bias of the process, as the allocator's was, moves every pair."""
    source = PROBLEM.format(rows=rows, cols=cols)
    ev = evaluator(tmp_path, source, "cpu", 150.0)
    # the smallest call is mostly Python, and read 0.69x once with a second test run sharing the two cores
    low = 0.6 if rows * cols < 1 << 13 else 0.7
    ratios = []
    for _ in range(3):
        r = ev.evaluate(as_candidate(source))
        assert r.status is Status.OK and r.timed, (r.reason, r.error)
        ratios.append(r.with_baseline(ev.baseline(compiled=False)).speedup_eager)
        if len(ratios) == 1 and low < ratios[0] < 1 / low:
            break
    assert low < statistics.median(ratios) < 1 / low, ratios


def test_the_reference_in_a_head_to_head_is_not_faster_than_itself(tmp_path: Path) -> None:
    """Never the winner against itself, and its ratio near one. On a loaded 2-core machine single head-to-heads read
    0.83x and 0.898x: one outside the bounds is held twice more and the median of the three decides, where a bias of
    the process moves every one."""
    source = PROBLEM.format(rows=512, cols=1000)
    ev = evaluator(tmp_path, source, "cpu", 150.0)
    ratios = []
    for _ in range(3):
        h = ev.head_to_head(as_candidate(source), ["eager"])
        assert h.rounds == 10 and len(h.round_ms[CANDIDATE]) == len(h.round_ms["eager"]) == 10
        assert h.answer == "eager" and not h.wins, h.line()
        ratio, low, high = h.candidate_vs_best
        assert low <= ratio <= high, h.line()
        ratios.append(ratio)
        if len(ratios) == 1 and 0.9 < ratio < 1.1:
            break
    assert 0.9 < statistics.median(ratios) < 1.1, ratios


def test_a_faster_candidate_wins_its_head_to_head(tmp_path: Path) -> None:
    """The reference does its work twice (a slower eager); the candidate once."""
    slow = PROBLEM.format(rows=512, cols=1000).replace(
        "return x * torch.sigmoid(x) + self.bias", "y = x * torch.sigmoid(x) + self.bias\n"
        "        return y + 0 * (x * torch.sigmoid(x) + self.bias)")
    ev = evaluator(tmp_path, slow, "cpu", 150.0)
    cand = Candidate(PROBLEM.format(rows=512, cols=1000) + "\n\nclass ModelNew(Model):\n    pass\n",
                     proposer="manual")
    h = ev.head_to_head(cand, ["eager"])
    assert h.wins and h.speedup["eager"] > 1.3, h.line()


# --- the GPU ---------------------------------------------------------------------------------------------------------
GPU_CASES = [(PROBLEM, 256, 256), (PROBLEM, 8192, 8192), (MATMUL, 4096, 4096)]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("template, rows, cols", GPU_CASES, ids=["tiny", "large-pointwise", "matmul"])
@pytest.mark.parametrize("clock", ["call", "graph"])
def test_the_reference_as_its_own_candidate_reads_one_on_the_gpu(tmp_path: Path, template: str, rows: int,
                                                                 cols: int, clock: str) -> None:
    source = template.format(rows=rows, cols=cols)
    path = tmp_path / "problem.py"
    path.write_text(source)
    ev = Evaluator(load_problem(path), EvalConfig(device="cuda", timeout_s=300.0,
                                                  timing=TimingConfig(budget_ms=300.0, clock=clock)), tmp_path / "w")
    r = ev.evaluate(as_candidate(source))
    assert r.status is Status.OK and r.timed, (r.reason, r.error)
    t = r.timing
    assert t.clock == clock and t.graph_ms is not None, t.graph_note  # plain ATen calls capture
    assert t.device_ms <= t.call_ms * 1.02 and t.host_ms > 0, t
    r = r.with_baseline(ev.baseline(compiled=False))
    # Separate timings of a ~0.01 ms call (three tiny kernels) in two processes differed by more than 5% in two of
    # three H200 runs (2026-12-04, the failing side switching between the call and the graph clock): those get 15%.
    # The interleaved rounds of the head-to-head, which decide the answer, never make it a win; their median is held
    # to 3%, but for the tiny call, where one tick of CUDA events (~0.5 us) is 5%: an H100 read 1.06x [0.99-1.13]
    # (2026-12-06), and 1.03x [1.03-1.04] before a GPU win had to clear the clock's resolution.
    tiny = rows * cols < 1 << 20
    bound = 0.15 if tiny else 0.05
    assert 1 - bound < r.speedup_eager < 1 + bound, (t, r.speedup_eager)
    h = ev.head_to_head(as_candidate(source), ["eager"])
    near = 0.15 if tiny else 0.03
    assert not h.wins and 1 - near < h.candidate_vs_best[0] < 1 + near, h.line()



@pytest.mark.gpu
@needs_gpu
def test_launch_work_is_in_the_call_clock_and_not_in_the_device_clock(tmp_path: Path) -> None:
    """A candidate that spends 0.5 ms of Python before its tiny kernels: the device clock hardly sees it, the call
    clock does, less what the flush queued ahead of the call hides (~0.07 ms on an H200, as under do_bench)."""
    source = PROBLEM.format(rows=256, cols=256)
    slow = source + '''

import time


class ModelNew(Model):
    def forward(self, x):
        t = time.perf_counter()
        while time.perf_counter() - t < 5e-4:
            pass
        return super().forward(x)
'''
    path = tmp_path / "problem.py"
    path.write_text(source)
    ev = Evaluator(load_problem(path), EvalConfig(device="cuda", timeout_s=300.0,
                                                  timing=TimingConfig(budget_ms=300.0)), tmp_path / "w")
    r = ev.evaluate(Candidate(slow, proposer="manual"))
    assert r.status is Status.OK, (r.reason, r.error)
    t = r.timing
    assert t.call_ms > 0.3 and t.host_ms > 0.5 and t.device_ms < 0.1 and t.launch_bound, t
    assert t.graph_ms is not None and t.graph_ms < 0.1  # replayed, the Python is gone


def test_a_gpu_win_must_be_more_than_a_tick_of_the_clock() -> None:
    """The reference against itself on an H100, a ~10 us call: 2% apart in every round, 0.2 us, below what CUDA
    events resolve. The same 2% of a 1 ms call is a win."""
    from kernelevolve.evaluate.headtohead import GPU_FLOOR_MS

    tiny = {CANDIDATE: [0.01035] * 10, "eager": [0.01055] * 10}
    assert decide(tiny).wins and not decide(tiny, floor_ms=GPU_FLOOR_MS).wins
    assert decide({CANDIDATE: [1.0] * 10, "eager": [1.02] * 10}, floor_ms=GPU_FLOOR_MS).wins


def test_a_cpu_win_clears_a_wider_margin() -> None:
    """8% in every round is a win on the GPU's margin and not on the CPU's, where two processes of one program
    differ by that much."""
    from kernelevolve.evaluate.headtohead import CPU_MARGIN

    rounds = {CANDIDATE: [1.0] * 10, "eager": [1.08] * 10}
    assert decide(rounds).wins and not decide(rounds, margin=CPU_MARGIN).wins
    assert decide({CANDIDATE: [1.0] * 10, "eager": [1.3] * 10}, margin=CPU_MARGIN).wins
