"""The loop with the screen on: batches screened, only finalists judged, counts and resume; a fake screening pool."""
import time
from concurrent.futures import Future

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import ScreenResult, Status
from kernelevolve.search import best_node

from tests.search.test_loop import FakePool, FakeProposer, new_run, problem, search, src, store  # noqa: F401


def screen_result(source: str) -> ScreenResult:
    """The screen's view of a fake source: its status, and a screen time 10% above the judge's (another clock, off
    by more than the agreement that drops a batch's backup finalists), or the source's own ``screen_ms``."""
    fields = dict(line[2:].split("=", 1) for line in source.splitlines() if "=" in line)
    status = Status(fields.get("screen", fields["status"]))
    ms = None if fields["ms"] == "None" or status is not Status.OK else 1.1 * float(fields["ms"])
    if ms is not None and "screen_ms" in fields:
        ms = float(fields["screen_ms"])
    return ScreenResult(status, "checked once" if status is Status.OK else "nope", ms=ms)


class ScreeningPool(FakePool):
    def __init__(self, workers: int = 1, screen_s: float = 0.0):
        super().__init__(workers)
        self.batches: list[list[str]] = []
        self.screen_s = screen_s  # how long a batch takes

    def screen(self, candidates: list[Candidate]) -> "Future[list[ScreenResult]]":
        time.sleep(self.screen_s)
        self.batches.append([c.source for c in candidates])
        fut: Future[list[ScreenResult]] = Future()
        fut.set_result([screen_result(c.source) for c in candidates])
        return fut


def test_only_the_fastest_of_a_batch_are_judged(store, problem):
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 10.0 - i) for i in range(8)] + [src("bad", 0.5, "incorrect")]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=9, finalists=2)
    assert pool.batches == [sources]
    assert pool.submitted == [src("c7", 3.0), src("c6", 4.0)]  # the fastest two the screen passed
    assert out.evaluations == 2 and out.screened == 9
    assert out.best.source == src("c7", 3.0)
    nodes = store.nodes(run_id)
    assert sum(n.screened_out for n in nodes) == 7 and sum(n.finalist for n in nodes) == 2
    assert store.count_screened(run_id) == 9 and store.count_evaluated(run_id) == 2
    summary = store.runs()[0]
    assert (summary.screened, summary.evaluated) == (9, 2)


def test_a_screen_result_never_makes_a_kernel_best(store, problem):
    """Passing the screen is not being verified: a finalist the judge fails leaves the run without a best, and the
    screened-out nodes hold no result."""
    run_id = new_run(store, problem)
    sources = [src("a", 2.0, "incorrect") + "# screen=ok\n", src("b", 3.0, "incorrect") + "# screen=ok\n"]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=5, screen_batch=4, finalists=1)
    assert pool.submitted == [sources[0]] and out.best is None
    nodes = store.nodes(run_id)
    assert [n.screen.ok for n in nodes] == [True, True]
    assert nodes[0].result.status is Status.INCORRECT and nodes[1].result is None and nodes[1].screened_out
    assert best_node(nodes)[0] is None


def test_a_later_batch_sends_on_only_what_beats_the_judged_best(store, problem):
    run_id = new_run(store, problem)
    first = [src(f"a{i}", 2.0 + i) for i in range(3)]
    second = [src(f"b{i}", 5.0 + i) for i in range(3)]  # every one slower than the best judged so far
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(first + second), pool, max_evals=10, screen_batch=3,
                 finalists=2)
    assert pool.batches == [first, second]
    assert pool.submitted == [src("a0", 2.0), src("a1", 3.0)]
    assert out.screened == 6 and out.evaluations == 2


def test_max_evals_counts_judged_candidates_only(store, problem):
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 20.0 - i) for i in range(30)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=4, screen_batch=5, finalists=2)
    assert out.evaluations == 4 and "max-evals 4" in out.stop_reason
    assert out.screened >= 10 and len(pool.submitted) == 4


def test_past_max_screened_candidates_are_judged_directly(store, problem):
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 20.0 - i) for i in range(6)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=20, screen_batch=4, finalists=1,
                 max_screened=4)
    assert [len(b) for b in pool.batches] == [4]
    assert pool.submitted == [src("c3", 17.0), src("c4", 16.0), src("c5", 15.0)]
    assert out.screened == 4 and out.evaluations == 3


def test_screened_out_nodes_are_not_judged_on_resume(store, problem):
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 10.0 - i) for i in range(4)]
    search(store, run_id, problem, FakeProposer(sources), ScreeningPool(), max_evals=10, screen_batch=4, finalists=1)
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer([]), pool, max_evals=10, screen_batch=4, finalists=1)
    assert pool.submitted == [] and pool.batches == []
    assert out.screened == 4 and out.evaluations == 1


def test_without_a_screen_every_candidate_is_judged(store, problem):
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 10.0 - i) for i in range(3)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=0)
    assert pool.batches == [] and len(pool.submitted) == 3 and out.screened == 0


def test_the_screen_takes_only_its_share_of_the_time_budget(store, problem):
    """Batches of 0.3 s against a 1 s share (0.5 of 2 s): the screen stops after the fourth (sooner on a loaded
    machine, never later); the rest is judged. Without the share it would screen for the whole 2 s."""
    run_id = new_run(store, problem)
    sources = [src(f"c{i}", 100.0 - i) for i in range(40)]
    pool = ScreeningPool(screen_s=0.3)
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=40, screen_batch=2, finalists=1,
                 time_budget_s=2.0, screen_share=0.5)
    assert 2 <= len(pool.batches) <= 4, pool.batches
    # one finalist per batch, then every candidate judged directly
    assert out.screened == 2 * len(pool.batches) and len(pool.submitted) > len(pool.batches)


class FailingScreenPool(ScreeningPool):
    """A screen that fails on its own side: as a whole batch (an exception), or per candidate (harness)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def screen(self, candidates):
        self.batches.append([c.source for c in candidates])
        fut = Future()
        if self.how == "raise":
            fut.set_exception(OSError("no space left on device"))
        else:
            fut.set_result([ScreenResult(Status.RUNTIME_ERROR, "not screened", harness=True) for _ in candidates])
        return fut


def test_candidates_the_screen_failed_to_screen_go_to_the_judge(store, problem):
    for how in ("raise", "harness"):
        run_id = new_run(store, problem)
        sources = [src(f"{how}{i}", 5.0 + i) for i in range(3)]
        pool = FailingScreenPool(how)
        out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=3, finalists=1)
        assert pool.batches == [sources] and pool.submitted == sources, how
        assert out.screened == 0 and out.evaluations == 3
        assert all(n.screen is None and n.result is not None for n in store.nodes(run_id))


def test_a_resumed_run_screens_what_it_had_not_screened(store, problem):
    run_id = new_run(store, problem)
    for i in range(3):  # added, as when the run was killed while their batch was being screened
        store.add_node(run_id, problem.sha, "cpu:x86_64:test", Candidate(src(f"p{i}", 9.0 - i), proposer="fake"))
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer([]), pool, max_evals=10, screen_batch=4, finalists=1)
    assert pool.batches == [[src(f"p{i}", 9.0 - i) for i in range(3)]]
    assert pool.submitted == [src("p2", 7.0)] and out.screened == 3 and out.evaluations == 1


def test_the_proposer_holding_the_fastest_kernel_is_asked_for_more():
    from kernelevolve.evaluate.result import Result, Timing
    from kernelevolve.search.turns import proposer_promise
    from tests.factories import make_node

    def judged(i, proposer, ms):
        return make_node(i, Result(Status.OK, "verified", timing=Timing.from_samples([ms], "perf_counter"),
                                   timed=True), proposer=proposer)

    def screened(i, proposer, status=Status.OK, ms=1.0):
        return make_node(i, None, proposer=proposer, screen=ScreenResult(status, "x", ms=ms))

    names = ["template", "inductor"]
    assert proposer_promise([], names, 4) == {"template": 1.0, "inductor": 1.0}
    history = [judged(1, "template", 5.0), judged(2, "inductor", 3.0), screened(3, "template", ms=0.1)]
    assert proposer_promise(history, names, 4) == {"template": 1.0, "inductor": 2.0}  # the judge's time first
    only_screened = [screened(1, "template", ms=2.0), screened(2, "inductor", ms=1.0)]
    assert proposer_promise(only_screened, names, 4)["inductor"] == 2.0
    failing = [screened(i, "inductor", Status.COMPILE_ERROR) for i in range(8)] + [judged(9, "template", 1.0)]
    assert proposer_promise(failing, names, 4) == {"template": 2.0, "inductor": 0.5}
    # the run was handed Inductor's fastest kernel (max-autotune's, judged before): the template's own leads
    handed = [make_node(1, judged(1, "inductor", 0.3).result, proposer="inductor", meta={"reused": True}),
              judged(2, "template", 0.36), judged(3, "inductor", 0.4)]
    assert proposer_promise(handed, names, 4) == {"template": 2.0, "inductor": 1.0}


def test_a_budget_spent_screening_still_buys_a_judged_evaluation(store, problem):
    """The first batch alone outlasts the budget: its finalist is still judged, and the run has a best."""
    run_id = new_run(store, problem)
    pool = ScreeningPool(screen_s=0.3)
    out = search(store, run_id, problem, FakeProposer([src(f"c{i}", 5.0 + i) for i in range(4)]), pool,
                 max_evals=10, screen_batch=4, finalists=1, time_budget_s=0.1)
    assert len(pool.batches) == 1 and pool.submitted == [src("c0", 5.0)]
    assert out.evaluations == 1 and out.best is not None and "time-budget" in out.stop_reason


class NamedProposer(FakeProposer):
    def __init__(self, name: str, sources: list[str], weight: int = 1):
        super().__init__(sources)
        self.name, self.weight = name, weight
        self.asked: list[int] = []  # n per call

    def propose(self, ctx, n):
        self.asked.append(n)
        return super().propose(ctx, n)


def test_a_batch_holds_one_proposers_candidates_sized_by_its_weight(store, problem):
    """Template candidates are not held up by Inductor's slow compiles: each batch is one proposer's, and the slower
    proposer's batches are smaller by its weight against the heaviest."""
    from kernelevolve.search import GreedySelector
    from kernelevolve.search.loop import SearchConfig, run_search
    from tests.search.test_loop import BASELINE

    run_id = new_run(store, problem)
    fast = NamedProposer("template", [src(f"t{i}", 5.0 + i) for i in range(6)], weight=3)
    slow = NamedProposer("inductor", [src(f"i{i}", 9.0 + i) for i in range(6)], weight=1)
    pool = ScreeningPool()
    cfg = SearchConfig(max_evals=20, stall=None, screen_batch=6, finalists=1)
    run_search(store, run_id, problem, "cpu", "cpu", pool, [fast, slow], GreedySelector(), cfg, BASELINE, None, None)
    families = [{s[2] for s in batch} for batch in pool.batches]  # "# t0 ..." -> "t"
    assert all(len(f) == 1 for f in families), families
    sizes = {"t": [], "i": []}
    for f, batch in zip(families, pool.batches):
        sizes[f.pop()].append(len(batch))
    assert max(sizes["t"]) == 6 and max(sizes["i"]) == 2, sizes
    assert sum(sizes["t"]) == 6 and sum(sizes["i"]) == 6, sizes


class SlowScreeningPool(ScreeningPool):
    """A batch takes ``screen_s`` unless cancelled, when it comes back unscreened at once."""

    def __init__(self, screen_s: float):
        super().__init__()
        self.slow_s, self.cancels = screen_s, 0
        self.wake = None

    def screen(self, candidates):
        import threading

        if not self.batches:  # the first batch is screened at once
            return super().screen(candidates)
        self.batches.append([c.source for c in candidates])
        fut: Future = Future()
        self.wake = threading.Event()

        def finish(wake=self.wake):
            cancelled = wake.wait(self.slow_s)
            fut.set_result([ScreenResult(Status.RUNTIME_ERROR, "not screened: stopped", harness=True)
                            if cancelled else screen_result(c.source) for c in candidates])

        threading.Thread(target=finish, daemon=True).start()
        return fut

    def cancel_screens(self):
        self.cancels += 1
        if self.wake is not None:
            self.wake.set()


def test_the_budget_ends_a_batch_in_flight_instead_of_waiting_for_it(store, problem):
    run_id = new_run(store, problem)
    pool = SlowScreeningPool(screen_s=30.0)
    began = time.monotonic()
    out = search(store, run_id, problem, FakeProposer([src(f"c{i}", 5.0 + i) for i in range(8)]), pool,
                 max_evals=10, screen_batch=4, finalists=1, time_budget_s=1.0)
    assert time.monotonic() - began < 10 and pool.cancels == 1
    assert len(pool.batches) == 2 and out.evaluations == 1 and "time-budget" in out.stop_reason
    pending = [n for n in store.nodes(run_id) if n.result is None and not n.screened_out]
    assert len(pending) == 4  # the cancelled batch's: a resumed run screens them


def test_a_candidate_far_slower_than_the_baseline_is_not_judged(store, problem):
    """The baselines are 10 ms (eager) and 8 ms (compile): a kernel the screen timed past 3 x 8 ms is hopeless,
    even as the fastest of the first batch."""
    run_id = new_run(store, problem)
    sources = [src("slow", 30.0), src("slower", 40.0)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=5, screen_batch=2, finalists=1,
                 max_screened=2)
    assert pool.batches == [sources]
    assert pool.submitted == [] and out.evaluations == 0 and out.best is None
    nodes = {n.source: n for n in store.nodes(run_id)}
    assert nodes[src("slow", 30.0)].screened_out and nodes[src("slower", 40.0)].screened_out
    near = [src("near", 20.0)]  # 22 ms by the screen: within 3x, judged
    run2 = new_run(store, problem)
    pool2 = ScreeningPool()
    search(store, run2, problem, FakeProposer(near), pool2, max_evals=5, screen_batch=2, finalists=1)
    assert pool2.submitted == near


def test_the_proposer_holding_the_fastest_kernel_gets_the_next_batch(store, problem):
    """The template's first batch holds the fastest kernel: its next batch (asked for anew, from the tree with that
    result in it) goes before the Inductor configurations already queued, and Inductor's turn still comes, after
    the template runs dry. Inductor is asked for a batch's worth (2 of 6, by weight) at a time."""
    from kernelevolve.search import GreedySelector
    from kernelevolve.search.loop import SearchConfig, run_search
    from tests.search.test_loop import BASELINE

    run_id = new_run(store, problem)
    fast = NamedProposer("template", [src(f"t{i}", 1.0 + 0.1 * i) for i in range(12)], weight=3)
    slow = NamedProposer("inductor", [src(f"i{i}", 5.0 + i) for i in range(6)], weight=1)
    pool = ScreeningPool()
    cfg = SearchConfig(max_evals=40, stall=None, screen_batch=6, finalists=1)
    run_search(store, run_id, problem, "cpu", "cpu", pool, [fast, slow], GreedySelector(), cfg, BASELINE, None, None)
    order = "".join(batch[0][2] for batch in pool.batches)  # "# t0 ..." -> "t"
    assert order.startswith("tt") and order.count("i") == 3, order
    assert [len(b) for b in pool.batches][:2] == [6, 6]
    assert sum(len(b) for b in pool.batches) == 18
    assert len(fast.calls) >= 3 and all(n <= 2 for n in slow.asked), slow.asked
    assert fast.calls[1][0] >= 6  # the second ask saw the first batch in the tree


def test_without_a_leader_the_slower_proposer_gets_its_turn_second(store, problem):
    """Before any judged result neither proposer leads: Inductor's first batch comes second, after one of the
    template's (three times its weight), not after all of them."""
    from kernelevolve.search import GreedySelector
    from kernelevolve.search.loop import SearchConfig, run_search
    from tests.search.test_loop import BASELINE

    run_id = new_run(store, problem)
    fast = NamedProposer("template", [src(f"t{i}", 9.0 + 0.1 * i, "incorrect") for i in range(12)], weight=3)
    slow = NamedProposer("inductor", [src(f"i{i}", 5.0 + i, "incorrect") for i in range(2)], weight=1)
    pool = ScreeningPool()
    cfg = SearchConfig(max_evals=40, stall=None, screen_batch=6, finalists=1)
    run_search(store, run_id, problem, "cpu", "cpu", pool, [fast, slow], GreedySelector(), cfg, BASELINE, None, None)
    order = "".join(batch[0][2] for batch in pool.batches)
    assert order[:2] == "ti", order


class WarmingPool(ScreeningPool):
    def __init__(self):
        super().__init__()
        self.warmed = 0

    def warm_screens(self, batch):
        self.warmed += 1


def test_the_screen_processes_are_started_before_the_first_proposal_is_in(store, problem):
    for batch, warmed in [(4, 1), (0, 0)]:
        pool = WarmingPool()
        search(store, new_run(store, problem), problem, FakeProposer([src(f"c{i}", 5.0 + i) for i in range(4)]),
               pool, max_evals=4, screen_batch=batch, finalists=1)
        assert pool.warmed == warmed, batch


class AsyncPool(ScreeningPool):
    """Screen batches and judge evaluations that finish after a random delay, on up to ``workers`` at once."""

    def __init__(self, workers: int, rng, delay_s: float):
        super().__init__(workers)
        self.rng, self.delay_s = rng, delay_s

    def _later(self, value):
        import threading

        fut: Future = Future()
        threading.Timer(self.rng.random() * self.delay_s, lambda: fut.set_result(value)).start()
        return fut

    def screen(self, candidates):
        self.batches.append([c.source for c in candidates])
        return self._later([screen_result(c.source) for c in candidates])

    def submit(self, candidate):
        from tests.search.test_loop import fake_result

        self.submitted.append(candidate.source)
        return self._later(fake_result(candidate.source))


def test_the_search_runs_every_proposer_dry_whatever_the_workers_and_timing(tmp_path, problem):
    """Random proposers (one to three, each weight and size), workers and completion orders: every search ends with
    a stop reason of its own (a limit, or the proposers with nothing left) and none with candidates still to give,
    and none hangs."""
    import random
    import threading

    from kernelevolve.search import GreedySelector
    from kernelevolve.search.loop import SearchConfig, run_search
    from kernelevolve.store import Store
    from tests.search.test_loop import BASELINE

    for seed in range(40):
        rng = random.Random(seed)
        def fake(name: str) -> str:
            ms, status = round(rng.uniform(1, 10), 2), rng.choice(["ok", "ok", "ok", "incorrect"])
            if status == "ok" and rng.random() < 0.5:  # the screen agrees with the judge: backups may be dropped
                return screened_at(name, round(ms * rng.uniform(0.97, 1.08), 3), ms)
            return src(name, ms, status)

        proposers = [NamedProposer(name, [fake(f"{name}{i}_{seed}") for i in range(rng.randint(0, 20))],
                                   weight=rng.choice([1, 1, 2, 3]))
                     for name in ["template", "inductor", "llm"][:rng.randint(1, 3)]]
        pool = AsyncPool(rng.randint(1, 3), rng, 0.01)
        cfg = SearchConfig(max_evals=rng.randint(3, 40), stall=None, screen_batch=rng.choice([2, 3, 6]),
                           finalists=rng.choice([1, 2, 3]))
        out = {}

        def go(seed=seed, pool=pool, proposers=proposers, cfg=cfg):
            store = Store(tmp_path / f"ke{seed}.db")  # a connection of this thread's own
            try:
                out["o"] = run_search(store, new_run(store, problem), problem, "cpu", "cpu", pool, proposers,
                                      GreedySelector(), cfg, BASELINE, None, None)
            finally:
                store.close()

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), f"seed {seed}: the search hangs"
        left = {p.name: len(p.sources) for p in proposers}
        reason = out["o"].stop_reason
        assert reason != "stopped", (seed, left)
        assert "max-evals" in reason or not any(left.values()), (seed, reason, left)
        assert len(set(pool.submitted)) == len(pool.submitted), (seed, "a candidate judged twice")
        assert out["o"].evaluations == len(pool.submitted) <= cfg.max_evals, seed


def screened_at(name: str, screen_ms: float, judge_ms: float, status: str = "ok") -> str:
    """A fake source the screen times at ``screen_ms`` and the judge at ``judge_ms``."""
    return src(name, judge_ms, status) + f"# screen_ms={screen_ms}\n" + ("# screen=ok\n" if status != "ok" else "")


def test_a_backup_finalist_is_not_judged_when_the_screen_ranked_the_batch_right(store, problem):
    """The first finalist judged within 5% of its screen time: the second, slower on the screen, is not judged, and
    stays in the tree as screened out (its screen result its last word)."""
    run_id = new_run(store, problem)
    sources = [screened_at("a", 2.0, 2.04), screened_at("b", 2.1, 1.5), screened_at("c", 3.0, 3.0)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=3, finalists=2)
    assert pool.submitted == [sources[0]] and out.evaluations == 1
    nodes = {n.source: n for n in store.nodes(run_id)}
    backup = nodes[sources[1]]
    assert backup.result is None and not backup.finalist and backup.screened_out and backup.screen.ms == 2.1
    assert backup.screen.details["backup"] == "not judged"  # kept, for the report and bench/finalists.py
    assert sum(n.finalist for n in nodes.values()) == 1


def test_backup_finalists_are_judged_when_the_screen_may_be_wrong(store, problem):
    """A backup goes to the judge when the finalist before it was timed there more than 5% off its screen time, or
    failed there; the first backup that agrees stands in for the rest of its batch."""
    run_id = new_run(store, problem)
    slow = [screened_at("a", 1.0, 2.0), screened_at("b", 1.2, 1.25), screened_at("c", 1.3, 0.5),
            screened_at("d", 9.0, 9.0)]
    pool = ScreeningPool()
    search(store, run_id, problem, FakeProposer(slow), pool, max_evals=10, screen_batch=4, finalists=3)
    assert pool.submitted == slow[:2]  # a disagreed (2x), b agreed (4%): c, its batch's third, is not judged

    run_id = new_run(store, problem)
    failed = [screened_at("a", 1.0, 1.0, "incorrect"), screened_at("b", 1.2, 1.2)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(failed), pool, max_evals=10, screen_batch=2, finalists=2)
    assert pool.submitted == failed and out.best.source == failed[1]


def test_backups_are_held_against_the_runs_usual_ratio_of_judge_to_screen(store, problem):
    """Where the judge times every kernel 12% slower than the screen (a power-capped clock in its longer timing), the
    screen still ranks right: once two verified nodes show that ratio, a finalist judged at it drops its backups.
    Before that, the first batch's backup is judged (12% is off by more than 5% from a ratio of 1)."""
    run_id = new_run(store, problem)
    sources = [screened_at("a", 1.0, 1.12), screened_at("b", 1.05, 1.176),
               screened_at("c", 0.9, 1.008), screened_at("d", 0.95, 1.064)]
    pool = ScreeningPool()
    search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=2, finalists=2)
    assert pool.submitted == sources[:3]  # d, c's backup, is not judged

    run_id = new_run(store, problem)  # a finalist off the usual ratio keeps its backups waiting
    sources = [screened_at("e", 1.0, 1.12), screened_at("f", 1.05, 1.176),
               screened_at("g", 0.9, 0.9), screened_at("h", 0.95, 0.8)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=2, finalists=2)
    assert pool.submitted == sources and out.best.source == sources[3]


def test_every_finalist_is_judged_without_backups(store, problem):
    run_id = new_run(store, problem)
    sources = [screened_at("a", 2.0, 2.0), screened_at("b", 2.1, 1.5), screened_at("c", 3.0, 3.0)]
    pool = ScreeningPool()
    out = search(store, run_id, problem, FakeProposer(sources), pool, max_evals=10, screen_batch=3, finalists=2,
                 backup_agree=None)
    assert pool.submitted == sources[:2] and out.best.source == sources[1]


def test_with_two_workers_a_backup_waits_for_its_batchs_verdict(store, problem):
    """A free worker does not take a backup while the judge times the finalist before it: dropped when that one
    agrees with the screen, judged when it does not, and the search waits for the verdict rather than ending."""
    run_id = new_run(store, problem)
    agree = [screened_at("a", 2.0, 2.04), screened_at("b", 2.1, 1.5), screened_at("c", 3.0, 3.0)]
    pool = ScreeningPool(workers=2)
    out = search(store, run_id, problem, FakeProposer(agree), pool, max_evals=10, screen_batch=3, finalists=2)
    assert pool.submitted == [agree[0]] and out.evaluations == 1

    run_id = new_run(store, problem)
    disagree = [screened_at("a", 1.0, 2.0), screened_at("b", 1.1, 1.1)]
    pool = ScreeningPool(workers=2)
    out = search(store, run_id, problem, FakeProposer(disagree), pool, max_evals=10, screen_batch=2, finalists=2)
    assert pool.submitted == disagree and out.best.source == disagree[1]


def test_judge_all_finalists_turns_the_backups_off():
    from kernelevolve.cli import build_parser, optimize_config

    parser = build_parser()
    assert optimize_config(parser.parse_args(["optimize", "p.py"]), "cpu").backup_agree == 0.05
    assert optimize_config(parser.parse_args(["optimize", "p.py", "--judge-all-finalists"]), "cpu").backup_agree is None
