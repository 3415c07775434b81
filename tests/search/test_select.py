"""best_node and GreedySelector on synthetic search trees."""
import pytest

from kernelevolve.evaluate.result import Result, Status, Timing
from kernelevolve.rows import Node
from kernelevolve.search import GreedySelector, best_node, make_selector
from tests.factories import make_node


def timed(ms: float) -> Result:
    return Result(Status.OK, "verified", timing=Timing.from_samples([ms], "perf_counter"), timed=True)


def untimed() -> Result:
    return Result(Status.OK, "verified (interpreter: untimed)", timed=False)


def failed(status: Status = Status.INCORRECT, ms: float | None = None) -> Result:
    timing = Timing.from_samples([ms], "perf_counter") if ms is not None else None
    return Result(status, "nope", timing=timing, timed=ms is not None)


def node(i: int, result: Result | None, parent: int | None = None) -> Node:
    return make_node(i, result, parent, proposer="inductor")


def test_best_node_empty():
    assert best_node([]) == (None, "no candidate was verified")


def test_best_node_none_verified():
    history = [node(1, None), node(2, failed()), node(3, failed(Status.CRASHED)), node(4, failed(Status.TIMEOUT))]
    best, why = best_node(history)
    assert best is None and "no candidate" in why


def test_best_node_fastest_timed():
    history = [node(1, timed(3.0)), node(2, timed(1.5)), node(3, untimed()), node(4, timed(2.0)), node(5, None)]
    best, why = best_node(history)
    assert best.id == 2 and why == "fastest timed candidate"


def test_best_node_ignores_fast_failures():
    """A wrong or cheating candidate that happens to carry a timing never wins."""
    history = [node(1, timed(5.0)), node(2, failed(Status.INCORRECT, 0.1)), node(3, failed(Status.REJECTED, 0.01))]
    assert best_node(history)[0].id == 1


def test_best_node_falls_back_to_first_verified():
    history = [node(1, failed()), node(2, untimed()), node(3, untimed())]
    best, why = best_node(history)
    assert best.id == 2 and "no candidate was timed" in why


def test_greedy_selects_k_fastest():
    history = [node(1, timed(4.0)), node(2, timed(1.0)), node(3, failed(Status.INCORRECT, 0.5)), node(4, timed(2.0)),
               node(5, untimed()), node(6, None)]
    sel = GreedySelector()
    assert [n.id for n in sel.select(history, 2)] == [2, 4]
    assert [n.id for n in sel.select(history, 10)] == [2, 4, 1]
    assert sel.select(history, 0) == []


def test_greedy_untimed_fallback_and_empty():
    sel = GreedySelector()
    assert [n.id for n in sel.select([node(1, failed()), node(2, untimed()), node(3, untimed())], 1)] == [2]
    assert sel.select([node(1, failed()), node(2, None)], 3) == []
    assert sel.select([], 3) == []


def test_make_selector():
    assert isinstance(make_selector("greedy"), GreedySelector)
    with pytest.raises(ValueError, match="greedy"):
        make_selector("simulated-annealing")
