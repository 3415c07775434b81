"""The closing round: once a search stops, what is already known to beat its best is judged before it ends."""
import threading
import time
from concurrent.futures import Future

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.search import GreedySelector, SearchConfig, run_search
from kernelevolve.store import Store

from tests.search.test_loop import BASELINE, KEY, FakePool, FakeProposer, new_run, problem, src, store  # noqa: F401
from tests.search.test_screen_loop import screen_result


class LateScreeningPool(FakePool):
    """Screens in the background: batch i takes delays[i] seconds, and a batch cannot be cancelled."""

    def __init__(self, delays: list[float]):
        super().__init__(1)
        self.delays = list(delays)
        self.batches: list[list[str]] = []

    def screen(self, candidates: list[Candidate]) -> "Future[list]":
        self.batches.append([c.source for c in candidates])
        fut: Future = Future()
        delay = self.delays.pop(0) if self.delays else 0.0
        timer = threading.Timer(delay, lambda: fut.set_result([screen_result(c.source) for c in candidates]))
        timer.start()
        return fut


class FallbackProposer(FakeProposer):
    """A proposer with a fallback whose kernel the baseline's torch.compile timing (8 ms) measured."""

    def __init__(self, sources: list[str], fallback: str):
        super().__init__(sources)
        self.fallback = fallback

    def fallbacks(self, problem):
        return [Candidate(self.fallback, proposer=self.name, meta={"label": "default", "baseline": "compiled"})]


def run(store, problem, proposer, pool=None, **cfg):
    cfg.setdefault("stall", None)
    run_id = new_run(store, problem)
    return run_search(store, run_id, problem, "cpu", KEY, pool or FakePool(), [proposer], GreedySelector(),
                      SearchConfig(**cfg), BASELINE), run_id


@pytest.mark.parametrize("closing", [True, False])
def test_a_finalist_the_screen_found_after_the_budget_is_judged(store, problem, closing):
    """The second batch comes back after the budget with a kernel five times faster than the judged best: it is
    judged before the run ends. Without the closing round the run returns the slower one."""
    first, second = [src("a", 10.0), src("b", 12.0)], [src("c", 2.0), src("d", 13.0)]
    judged = [src("a", 10.0), src("c", 2.0)] if closing else [src("a", 10.0)]
    pool = LateScreeningPool([0.0, 0.6])
    out, _ = run(store, problem, FakeProposer(first + second), pool, max_evals=10, screen_batch=2, finalists=1,
                 time_budget_s=0.2, closing=closing)
    assert pool.batches == [first, second] and "time-budget" in out.stop_reason
    assert pool.submitted == judged
    assert out.best.source == judged[-1]


def test_a_late_finalist_no_faster_than_the_best_is_not_judged(store, problem):
    first, second = [src("a", 10.0), src("b", 12.0)], [src("c", 9.95), src("d", 13.0)]
    pool = LateScreeningPool([0.0, 0.6])
    out, _ = run(store, problem, FakeProposer(first + second), pool, max_evals=10, screen_batch=2, finalists=1,
                 time_budget_s=0.2)
    assert pool.submitted == [src("a", 10.0)] and out.best.source == src("a", 10.0)


def test_torch_compiles_kernel_is_judged_when_its_baseline_beats_the_best(store, problem):
    """The baseline timed torch.compile at 8 ms; the search's best is 9 ms: the fallback is judged at the close (and
    only the judge's time counts: 7.5 ms here)."""
    fallback = src("compiled", 7.5)
    out, _ = run(store, problem, FallbackProposer([src("x", 9.0)], fallback), max_evals=10)
    assert "nothing left" in out.stop_reason
    assert out.best.source == fallback and out.evaluations == 2


def test_a_fallback_is_not_judged_when_the_best_is_near_it_or_the_stop_was_max_evals(tmp_path, problem):
    """Each run in a store of its own: a kernel judged in one run is reused by the next."""
    fallback = src("compiled", 7.5)
    cases = [("near", [src("x", 8.1)], {}),  # 8 ms is within 2% of 8.1 ms
             ("max-evals", [src("x", 9.0), src("y", 9.5)], {"max_evals": 2}),
             ("off", [src("x", 9.0)], {"closing": False})]
    for name, sources, cfg in cases:
        store = Store(tmp_path / f"{name}.db")
        out, _ = run(store, problem, FallbackProposer(sources, fallback), **{"max_evals": 10, **cfg})
        store.close()
        assert out.best.source == sources[0] and out.evaluations == len(sources), name


def test_a_fallback_already_judged_in_the_run_is_not_judged_again(store, problem):
    fallback = src("compiled", 9.5)  # proposed and judged during the search: slower than its baseline said
    pool = FakePool()
    out, _ = run(store, problem, FallbackProposer([src("x", 9.0), fallback], fallback), pool, max_evals=10)
    assert pool.submitted == [src("x", 9.0), fallback] and out.best.source == src("x", 9.0)


def test_a_fallback_proposed_but_not_yet_judged_is_judged_on_its_node(store, problem):
    """The budget ends with the fallback still queued: it is judged on the node the tree already holds for it."""
    fallback = src("compiled", 7.0)
    pool = FakePool()
    proposer = FallbackProposer([src("x", 9.0), fallback], fallback)
    began = time.monotonic()
    out, run_id = run(store, problem, proposer, pool, max_evals=10, time_budget_s=0.0)
    assert time.monotonic() - began < 10
    assert pool.submitted == [src("x", 9.0), fallback] and out.best.source == fallback
    assert sum(n.source == fallback for n in store.nodes(run_id)) == 1
