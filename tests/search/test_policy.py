"""The search's decisions as tables of cases, without a pool, a store or a thread: stop reasons, the screen's switch,
finalists and backups, the closing round, the proposers' turns and ask sizes."""
import math
from collections import Counter, deque

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult, Status, Timing
from kernelevolve.search import policy, turns
from kernelevolve.search.state import MAX_REPEATS, SearchConfig, SearchState, Step, Stop
from tests.factories import make_node

BASELINE = Baseline("cpu", eager=Timing.from_samples([10.0], "perf_counter"),
                    compiled=Timing.from_samples([8.0], "perf_counter"))


def judged(i: int, ms: float | None, status: Status = Status.OK, screen_ms: float | None = None, **fields):
    timing = None if ms is None else Timing.from_samples([ms], "perf_counter")
    screen = None if screen_ms is None else ScreenResult(Status.OK, "checked once", ms=screen_ms)
    return make_node(i, Result(status, "x", timing=timing, timed=ms is not None), screen=screen, **fields)


def screened(i: int, ms: float | None, status: Status = Status.OK, proposer: str = "template", **fields):
    return make_node(i, None, proposer=proposer, screen=ScreenResult(status, "x", ms=ms), **fields)


def timed(ms: float, status: Status = Status.OK) -> Result:
    return Result(status, "x", timing=Timing.from_samples([ms], "perf_counter"), timed=True)


@pytest.mark.parametrize("cfg, state, now, speedup, want", [
    (SearchConfig(max_evals=3), SearchState(evaluated=3), 0.0, 0.0, Stop.MAX_EVALS),
    (SearchConfig(max_evals=3), SearchState(evaluated=2, judging=[7]), 0.0, 0.0, Stop.MAX_EVALS),
    (SearchConfig(max_evals=3), SearchState(evaluated=2), 0.0, 0.0, None),
    (SearchConfig(time_budget_s=5), SearchState(evaluated=1, start=0.0), 5.0, 0.0, Stop.TIME_BUDGET),
    (SearchConfig(time_budget_s=5), SearchState(evaluated=1, start=0.0), 4.9, 0.0, None),
    # the budget never ends a search before its first judged evaluation, nor before its first proposal
    (SearchConfig(time_budget_s=5), SearchState(start=0.0), 9.0, 0.0, None),
    (SearchConfig(time_budget_s=5), SearchState(evaluated=1), 9.0, 0.0, None),
    (SearchConfig(target_speedup=2.0), SearchState(), 0.0, 2.0, Stop.TARGET),
    (SearchConfig(target_speedup=2.0), SearchState(), 0.0, 1.9, None),
    (SearchConfig(stall=4), SearchState(since_best=4), 0.0, 0.0, Stop.STALL),
    (SearchConfig(stall=None), SearchState(since_best=99), 0.0, 0.0, None),
    (SearchConfig(), SearchState(exhausted=True), 0.0, 0.0, Stop.EXHAUSTED),
    # exhausted, but a candidate is queued, a finalist waits or a batch is being screened
    (SearchConfig(), SearchState(exhausted=True, queue=deque([Candidate("# c\n")])), 0.0, 0.0, None),
    (SearchConfig(), SearchState(exhausted=True, finalists=deque([screened(1, 1.0)])), 0.0, 0.0, None),
    (SearchConfig(), SearchState(exhausted=True, batches=[4]), 0.0, 0.0, None),
    # max-evals is checked first
    (SearchConfig(max_evals=1, stall=1), SearchState(evaluated=1, since_best=1), 0.0, 0.0, Stop.MAX_EVALS),
])
def test_stop_reason(cfg, state, now, speedup, want):
    assert policy.stop_reason(cfg, state, now, speedup) is want


@pytest.mark.parametrize("stop, why, want", [
    (Stop.MAX_EVALS, [], "reached --max-evals 7"),
    (Stop.TIME_BUDGET, [], "reached --time-budget 2.5 s"),
    (Stop.TARGET, [], "reached the target speedup 1.5x"),
    (Stop.STALL, [], "no improvement in 3 evaluations"),
    (Stop.EXHAUSTED, [], "the proposers have nothing left to try"),
    (Stop.EXHAUSTED, ["llm: spent", "manual: no reply"],
     "the proposers have nothing left to try (llm: spent; manual: no reply)"),
])
def test_describe(stop, why, want):
    cfg = SearchConfig(max_evals=7, time_budget_s=2.5, target_speedup=1.5, stall=3)
    assert policy.describe(stop, cfg, why) == want


@pytest.mark.parametrize("cfg, state, can_screen, want", [
    (SearchConfig(screen_batch=4), SearchState(), True, True),
    (SearchConfig(screen_batch=0), SearchState(), True, False),
    (SearchConfig(screen_batch=4), SearchState(), False, False),  # a pool without a screen
    (SearchConfig(screen_batch=4, max_screened=8), SearchState(screened=4, batches=[4]), True, False),
    (SearchConfig(screen_batch=4, max_screened=8), SearchState(screened=4, batches=[3]), True, True),
    (SearchConfig(screen_batch=4, max_screened=None), SearchState(screened=10 ** 6), True, True),
    # past the screen's share of the budget, candidates go to the judge directly
    (SearchConfig(screen_batch=4, time_budget_s=10, screen_share=0.5), SearchState(screen_s=5.0), True, False),
    (SearchConfig(screen_batch=4, time_budget_s=10, screen_share=0.5), SearchState(screen_s=4.9), True, True),
])
def test_screen_on(cfg, state, can_screen, want):
    assert policy.screen_on(cfg, state, can_screen) is want


@pytest.mark.parametrize("state, want", [
    (SearchState(), 10),
    (SearchState(evaluated=3, judging=[1], finalists=deque([screened(2, 1.0)])), 5),
    (SearchState(batches=[4, 4]), 6),  # each batch in flight will likely want ``finalists`` (2) evaluations
])
def test_evals_left(state, want):
    assert policy.evals_left(SearchConfig(max_evals=10, finalists=2), state) == want


@pytest.mark.parametrize("baseline, best_ms, want", [
    (BASELINE, 5.0, 2.0),
    (BASELINE, math.inf, 0.0),
    (None, 5.0, 0.0),
    (Baseline("cpu", eager=None, compiled=None), 5.0, 0.0),
])
def test_best_speedup(baseline, best_ms, want):
    assert policy.best_speedup(baseline, best_ms) == want


@pytest.mark.parametrize("result, judged_, before, want_best, want_since", [
    (timed(4.0), True, (5.0, 3), 4.0, 0),  # a new best
    (timed(6.0), True, (5.0, 3), 5.0, 4),  # judged, slower
    (timed(4.0, Status.INCORRECT), True, (5.0, 3), 5.0, 4),
    (Result(Status.OK, "untimed"), True, (5.0, 3), 5.0, 4),
    (timed(6.0), False, (5.0, 3), 5.0, 3),  # a reused result: no evaluation, no stall
    (timed(4.0), False, (5.0, 3), 4.0, 0),
])
def test_count_result(result, judged_, before, want_best, want_since):
    state = SearchState(best_ms=before[0], since_best=before[1], recorded=2)
    policy.count_result(state, result, judged_)
    assert (state.best_ms, state.since_best, state.recorded) == (want_best, want_since, 3)


@pytest.mark.parametrize("wait_for, state, now, want", [
    (None, SearchState(batches=[4], start=0.0), 1.0, None),  # no budget
    (10.0, SearchState(start=0.0), 1.0, None),  # no batch in flight: wait for what comes
    (10.0, SearchState(batches=[4], start=0.0, cancelled=True), 1.0, None),
    (10.0, SearchState(batches=[4]), 1.0, None),  # the budget's clock has not started
    (10.0, SearchState(batches=[4], start=0.0), 11.0, None),  # the budget has ended
    (10.0, SearchState(batches=[4], start=0.0), 4.0, 6.01),
])
def test_wait_limit(wait_for, state, now, want):
    got = policy.wait_limit(SearchConfig(time_budget_s=wait_for), state, now)
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize("baseline, want", [
    (BASELINE, 24.0),  # three times the faster baseline (torch.compile's 8 ms)
    (Baseline("cpu", eager=Timing.from_samples([10.0], "perf_counter"), compiled=None), 30.0),
    (Baseline("cpu", eager=None, compiled=None), None),
    (None, None),
])
def test_hopeless_ms(baseline, want):
    assert policy.hopeless_ms(baseline) == want


@pytest.mark.parametrize("name, want", [("eager", 10.0), ("compiled", 8.0), ("compile_s", None), ("device", None),
                                        (None, None)])
def test_baseline_ms(name, want):
    assert policy.baseline_ms(BASELINE, name) == want


def test_screen_bar_is_the_fastest_screen_time_of_a_verified_node():
    history = [judged(1, 5.0, screen_ms=4.0), judged(2, 6.0, screen_ms=3.0), judged(3, 1.0, Status.INCORRECT,
               screen_ms=0.5), screened(4, 0.1)]
    assert policy.screen_bar(history) == 3.0
    assert policy.screen_bar([screened(4, 0.1)]) is None


BATCH = [(screened(1, 5.0), 5.0), (screened(2, 3.0), 3.0), (screened(3, 1.0, Status.INCORRECT), 1.0),
         (screened(4, None), None), (screened(5, 4.0), 4.0)]


@pytest.mark.parametrize("cfg, state, bar, hopeless, want", [
    (SearchConfig(finalists=2), SearchState(), None, None, [2, 5]),  # the fastest passed, fastest first
    (SearchConfig(finalists=9), SearchState(), None, None, [2, 5, 1, 4]),  # untimed last
    (SearchConfig(finalists=2, max_evals=10), SearchState(evaluated=9), None, None, [2]),  # one evaluation left
    (SearchConfig(finalists=2, max_evals=10), SearchState(evaluated=8, judging=[9]), None, None, [2]),
    (SearchConfig(finalists=2, max_evals=10), SearchState(evaluated=10), None, None, []),
    (SearchConfig(finalists=2), SearchState(), 3.0, None, [2]),  # later batches: near the verified screen bar
    (SearchConfig(finalists=2), SearchState(), 3.9, None, [2, 5]),  # 4.0 is within 5% of 3.9
    (SearchConfig(finalists=2), SearchState(), 2.0, None, []),
    (SearchConfig(finalists=9), SearchState(), 2.0, None, [4]),  # an untimed pass is never held to the bar
    (SearchConfig(finalists=2), SearchState(), None, 3.5, [2, 4]),  # past hopeless: never judged
])
def test_pick_finalists(cfg, state, bar, hopeless, want):
    pairs = [(n, n.screen) for n, _ in BATCH]
    assert policy.pick_finalists(cfg, state, pairs, bar, hopeless) == want


@pytest.mark.parametrize("chosen, want", [([], {}), ([1], {}), ([1, 2, 3], {1: [2, 3], 2: [3]})])
def test_backups_of(chosen, want):
    assert policy.backups_of(chosen) == want


@pytest.mark.parametrize("finalists, screened_, want_backups, want_since, want_recorded", [
    ([1, 2], 5, {1: [2]}, 0, 1),
    ([], 5, {}, 1, 1),  # a batch that sends none on counts toward the stall
    ([], 0, {}, 0, 0),  # nothing screened (the screen failed on its side): no count
])
def test_queue_finalists(finalists, screened_, want_backups, want_since, want_recorded):
    state = SearchState()
    nodes = [screened(i, float(i)) for i in finalists]
    unscreened = [make_node(9)]
    policy.queue_finalists(state, nodes, unscreened, screened_)
    assert [n.id for n in state.finalists] == finalists + [9]
    assert (state.backups, state.since_best, state.recorded) == (want_backups, want_since, want_recorded)


@pytest.mark.parametrize("finalists, backups, judging, want", [
    ([1, 2], {}, [], 1),
    ([2, 3], {1: [2, 3]}, [1], None),  # backups wait for their batch's verdict
    ([2, 3, 7], {1: [2, 3]}, [1], 7),  # another batch's finalist goes first
    ([2, 3], {1: [2, 3]}, [], 2),  # the verdict is in and left them waiting
])
def test_next_finalist(finalists, backups, judging, want):
    state = SearchState(finalists=deque(screened(i, 1.0) for i in finalists), backups=backups, judging=judging)
    node = policy.next_finalist(state)
    assert (node.id if node else None) == want


@pytest.mark.parametrize("history, want", [
    ([], 1.0),
    ([judged(2, 2.0, screen_ms=1.0)], 1.0),  # fewer than RATIO_PAIRS pairs
    ([judged(2, 2.0, screen_ms=1.0), judged(3, 3.0, screen_ms=1.0), judged(4, 9.0, screen_ms=1.0)], 3.0),
    ([judged(1, 50.0, screen_ms=1.0), judged(2, 2.0, screen_ms=1.0)], 1.0),  # the finalist itself is left out
])
def test_judge_ratio(history, want):
    assert policy.judge_ratio(history, leave_out=1) == want


@pytest.mark.parametrize("agree, screen_ms, result, history, want", [
    (0.05, 10.0, timed(10.4), [], True),
    (0.05, 10.0, timed(11.0), [], False),
    (None, 10.0, timed(10.0), [], False),  # None judges every backup
    (0.05, 10.0, timed(10.0, Status.INCORRECT), [], False),
    (0.05, None, timed(10.0), [], False),
    (0.05, 10.0, Result(Status.OK, "untimed"), [], False),
    # the judge is steadily 2x the screen on this run: 20 ms agrees with 10 ms on the screen
    (0.05, 10.0, timed(20.0), [judged(2, 2.0, screen_ms=1.0), judged(3, 4.0, screen_ms=2.0)], True),
])
def test_screen_agrees(agree, screen_ms, result, history, want):
    node = screened(1, screen_ms)
    assert policy.screen_agrees(agree, node, result, history) is want


@pytest.mark.parametrize("result, want_dropped, want_waiting", [
    (timed(1.05), [2, 3], [7]),  # the screen ranked the batch right: its backups are not judged
    (timed(2.0), [], [2, 3, 7]),  # the times disagree: the backups wait to be judged
    (timed(1.0, Status.INCORRECT), [], [2, 3, 7]),
])
def test_drop_backups(result, want_dropped, want_waiting):
    finalist = screened(1, 1.0, finalist=True)
    state = SearchState(finalists=deque(screened(i, 1.5, finalist=True) for i in (2, 3, 7)),
                        backups={1: [2, 3], 2: [3]})
    dropped = policy.drop_backups(SearchConfig(backup_agree=0.1), state, finalist, result, [])
    assert [n.id for n in dropped] == want_dropped
    assert [n.id for n in state.finalists] == want_waiting
    assert 1 not in state.backups and (2 in state.backups) == (not want_dropped)


@pytest.mark.parametrize("cfg, state, stop, speedup, want", [
    (SearchConfig(), SearchState(), Stop.TIME_BUDGET, 0.0, True),
    (SearchConfig(), SearchState(), Stop.STALL, 0.0, True),
    (SearchConfig(), SearchState(), Stop.EXHAUSTED, 0.0, True),
    (SearchConfig(), SearchState(), Stop.MAX_EVALS, 0.0, False),
    (SearchConfig(target_speedup=2.0), SearchState(), Stop.TARGET, 2.0, False),
    (SearchConfig(target_speedup=2.0), SearchState(), Stop.TIME_BUDGET, 1.0, True),
    (SearchConfig(closing=False), SearchState(), Stop.TIME_BUDGET, 0.0, False),
    (SearchConfig(), SearchState(closed=True), Stop.TIME_BUDGET, 0.0, False),  # held once
])
def test_closes(cfg, state, stop, speedup, want):
    assert policy.closes(cfg, state, stop, speedup) is want


@pytest.mark.parametrize("state, want", [
    (SearchState(), 2),
    (SearchState(evaluated=9), 1),
    (SearchState(evaluated=8, judging=[1, 2]), 0),
])
def test_closing_room(state, want):
    assert policy.closing_room(SearchConfig(max_evals=10, finalists=2), state) == want


FALLBACK = Candidate("# fallback\n", proposer="inductor", meta={"baseline": "compiled"})


@pytest.mark.parametrize("best_ms, finalist_ms, fallback_ms, bar, want", [
    (10.0, [9.0, 9.9], None, None, [1]),  # 9.9 is not 2% under the best
    (10.0, [9.0, 5.0], 7.0, None, [2, "fallback", 1]),  # the fastest first
    (10.0, [9.0], 9.9, None, [1]),
    (10.0, [9.0, 5.0], None, 6.0, [2]),  # screen times are also held against the verified screen bar
    (math.inf, [9.0], 7.0, None, ["fallback", 1]),  # nothing judged yet: all of them
])
def test_closing_picks(best_ms, finalist_ms, fallback_ms, bar, want):
    state = SearchState(best_ms=best_ms, finalists=deque(screened(i + 1, ms) for i, ms in enumerate(finalist_ms)))
    fallbacks = [] if fallback_ms is None else [(FALLBACK, fallback_ms)]
    picks = policy.closing_picks(state, fallbacks, bar)
    assert [p.id if not isinstance(p, Candidate) else "fallback" for p in picks] == want


SEATS = [("template", 3), ("inductor", 1)]


@pytest.mark.parametrize("name, screen_batch, want", [
    ("template", 6, 6), ("inductor", 6, 2), ("inductor", 1, 1), ("unknown", 6, 6)])
def test_batch_size(name, screen_batch, want):
    assert turns.batch_size(SearchConfig(screen_batch=screen_batch), SEATS, name) == want


@pytest.mark.parametrize("history, wanted, screening, want", [
    ([], 4, False, [6, 2]),  # 2 per proposer, times its weight
    ([], 4, True, [6, 2]),  # a screen batch's worth by its weight
    ([judged(1, 1.0, proposer="inductor")], 4, False, [6, 4]),  # the leader's promise is twice
    ([judged(1, 1.0, proposer="inductor")], 4, True, [6, 4]),
    ([], 1, False, [3, 1]),
])
def test_ask_sizes(history, wanted, screening, want):
    assert turns.ask_sizes(SearchConfig(screen_batch=6), SEATS, history, wanted, screening) == want


@pytest.mark.parametrize("state, want", [
    (SearchState(), True),
    (SearchState(exhausted=True), False),
    (SearchState(empty_at=3, recorded=3), False),  # an empty answer waits for a new result
    (SearchState(empty_at=3, recorded=4), True),
])
def test_may_ask(state, want):
    assert turns.may_ask(state) is want


@pytest.mark.parametrize("queued, screening, want", [
    ([], True, ["template", "inductor"]),
    (["template"], True, ["inductor"]),  # the screen is fed a batch per proposer: not asked while it has some queued
    (["template"], False, ["template", "inductor"]),
    (["template", "inductor"], True, []),
])
def test_whom_to_ask(queued, screening, want):
    state = SearchState(queue=deque(Candidate(f"# {p}\n", proposer=p) for p in queued))
    assert turns.whom_to_ask(state, SEATS, screening) == want


@pytest.mark.parametrize("asked_for, asked_at, got, queued, want_dry, want_empty_at, want_exhausted", [
    (["template", "inductor"], (3, False), ["template"], 0, {"inductor": 3}, None, False),
    (["template", "inductor"], (3, False), [], 0, {"template": 3, "inductor": 3}, 1, True),
    (["template", "inductor"], (3, False), [], 1, {"template": 3, "inductor": 3}, 1, False),
    (["template", "inductor"], (3, True), [], 0, {"template": 3, "inductor": 3}, 3, False),  # asked while busy
    (["inductor"], (3, False), [], 0, {"inductor": 3}, 1, False),  # a partial ask's silence is its proposers'
    (["inductor"], (3, True), [], 0, {"inductor": 3}, 1, False),
])
def test_take_proposal(asked_for, asked_at, got, queued, want_dry, want_empty_at, want_exhausted):
    state = SearchState(asked_for=asked_for, asked_at=asked_at, empty_at=1,
                        queue=deque(Candidate(f"# q{i}\n", proposer="template") for i in range(queued)))
    cands = [Candidate(f"# {p}\n", proposer=p) for p in got]
    turns.take_proposal(state, cands, proposers=2)
    assert (state.dry, state.empty_at, state.exhausted) == (want_dry, want_empty_at, want_exhausted)
    assert len(state.queue) == queued + len(got)


@pytest.mark.parametrize("queued, sent, dry, history, want", [
    (["template", "inductor"], {}, {}, [], "template"),  # (0+1)/3 against (0+1)/1
    (["template", "inductor"], {"template": 3}, {}, [], "inductor"),  # 4/3 against 1/1
    (["template", "inductor"], {"template": 1}, {}, [], "template"),  # 2/3 against 1
    (["inductor"], {}, {"template": 5}, [], "inductor"),  # the template is dry until the next result
    (["inductor"], {}, {"template": 4}, [], "template"),  # a result came since: it may have more
    ([], {}, {"template": 5, "inductor": 5}, [], None),
    # the leader's promise doubles its weight: 4/3 against 2/1, then against 2/2 once inductor holds the fastest
    (["template", "inductor"], {"template": 3, "inductor": 1}, {}, [], "template"),
    (["template", "inductor"], {"template": 3, "inductor": 1}, {}, [judged(1, 1.0, proposer="inductor")],
     "inductor"),
])
def test_next_proposer(queued, sent, dry, history, want):
    state = SearchState(queue=deque(Candidate(f"# {p}\n", proposer=p) for p in queued),
                        batches_sent=Counter(sent), dry=dry, recorded=5)
    assert turns.next_proposer(SearchConfig(screen_batch=6), state, history, SEATS) == want


@pytest.mark.parametrize("cfg, state, want", [
    (SearchConfig(screen_batch=6, max_screened=None), SearchState(), 2),
    (SearchConfig(screen_batch=6, max_screened=10), SearchState(screened=8), 2),
    (SearchConfig(screen_batch=6, max_screened=10), SearchState(screened=8, batches=[1]), 1),
])
def test_batch_room(cfg, state, want):
    assert turns.batch_room(cfg, state, SEATS, "inductor") == want


@pytest.mark.parametrize("repeats, want", [(0, Step.TOOK), (MAX_REPEATS - 1, Step.TOOK), (MAX_REPEATS, Step.DONE)])
def test_after_repeat(repeats, want):
    assert turns.after_repeat(SearchState(repeats=repeats)) is want
