"""run_search with a fake pool and a fake proposer: stop conditions, dedup and cache, resume, selection, suspects."""
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
from kernelevolve.problem import Problem, source_sha
from kernelevolve.propose.base import ProposalContext
from kernelevolve.search import GreedySelector, SearchConfig, SearchOutcome, best_node, run_search
from kernelevolve.profile import Profile
from kernelevolve.store import Store
from tests.factories import make_profile

ROOT = Path(__file__).resolve().parents[2]
PROBLEM_PATH = ROOT / "examples" / "gelu_mlp.py"
KEY = "cpu:x86_64:test"
EAGER_MS = 10.0
BASELINE = Baseline("cpu", eager=Timing.from_samples([EAGER_MS], "perf_counter"),
                    compiled=Timing.from_samples([8.0], "perf_counter"))


def src(name: str, ms: float | None = None, status: str = "ok") -> str:
    """A candidate source whose fake evaluation is encoded in its text."""
    return f"# {name}\n# status={status}\n# ms={ms}\n"


def fake_result(source: str) -> Result:
    fields = dict(line[2:].split("=", 1) for line in source.splitlines() if "=" in line)
    status = Status(fields["status"])
    if fields["ms"] == "None":
        return Result(status, "verified (untimed)" if status is Status.OK else "nope")
    ms = float(fields["ms"])
    return Result(status, "verified" if status is Status.OK else "nope",
                  timing=Timing.from_samples([ms], "perf_counter"), timed=True)


class FakePool:
    def __init__(self, workers: int = 1):
        self.workers = workers
        self.submitted: list[str] = []
        self.closed = False

    def submit(self, candidate: Candidate) -> "Future[Result]":
        self.submitted.append(candidate.source)
        fut: Future[Result] = Future()
        fut.set_result(fake_result(candidate.source))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        self.closed = True


class FakeProposer:
    name = "fake"

    def __init__(self, sources: list[str]):
        self.sources = list(sources)
        self.calls: list[tuple[int, list[int]]] = []  # (history length, parent node ids) per call

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        parents = [p.id for p in ctx.parents]
        self.calls.append((len(ctx.history), parents))
        out, self.sources = self.sources[:n], self.sources[n:]
        parent = parents[0] if parents else None
        return [Candidate(s, proposer=self.name, parent=parent) for s in out]


@pytest.fixture(scope="module")
def problem() -> Problem:
    source = PROBLEM_PATH.read_text()
    return Problem(path=str(PROBLEM_PATH), source=source, sha=source_sha(source), name="gelu_mlp")


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ke.db")
    yield s
    s.close()


def new_run(store: Store, problem: Problem, device_key: str = KEY) -> int:
    return store.create_run(problem, "cpu", device_key, {"device": "cpu"}, {})


def search(store: Store, run_id: int, problem: Problem, proposer: FakeProposer, pool: FakePool | None = None,
           device_key: str = KEY, profile: Profile | None = None, on_result=None, **cfg) -> SearchOutcome:
    cfg.setdefault("stall", None)
    return run_search(store, run_id, problem, "cpu", device_key, pool or FakePool(), [proposer], GreedySelector(),
                      SearchConfig(**cfg), BASELINE, profile, on_result)


def test_stops_at_max_evals(store, problem):
    run_id = new_run(store, problem)
    pool = FakePool()
    out = search(store, run_id, problem, FakeProposer([src(f"c{i}", 5.0 + i) for i in range(6)]), pool, max_evals=3)
    assert out.evaluations == 3 and "max-evals 3" in out.stop_reason
    assert len(pool.submitted) == 3
    nodes = store.nodes(run_id)
    assert len(nodes) == 3 and all(n.result is not None for n in nodes)
    assert store.count_evaluated(run_id) == 3


def test_max_evals_exact_with_parallel_workers(store, problem):
    run_id = new_run(store, problem)
    pool = FakePool(workers=3)
    out = search(store, run_id, problem, FakeProposer([src(f"c{i}", 5.0 + i) for i in range(10)]), pool, max_evals=4)
    assert out.evaluations == 4 and len(pool.submitted) == 4
    assert store.count_evaluated(run_id) == 4


def test_stops_when_proposers_exhausted(store, problem):
    run_id = new_run(store, problem)
    proposer = FakeProposer([src("a", 5.0), src("b", 6.0)])
    out = search(store, run_id, problem, proposer, max_evals=10)
    assert out.stop_reason == "the proposers have nothing left to try"
    assert out.evaluations == 2
    assert proposer.calls[-1][0] == 2  # the empty answer came after both results


def test_stops_at_target_speedup(store, problem):
    run_id = new_run(store, problem)
    sources = [src("a", 8.0), src("b", 4.0), src("c", 2.0), src("d", 1.0)]
    out = search(store, run_id, problem, FakeProposer(sources), max_evals=10, target_speedup=2.5)
    assert "target speedup 2.5x" in out.stop_reason
    assert out.evaluations == 2  # 10 ms / 4 ms = 2.5x against eager
    assert out.best.result.runtime_ms == 4.0


def test_stops_on_stall(store, problem):
    run_id = new_run(store, problem)
    sources = [src("a", 5.0), src("b", 1.0, "incorrect"), src("c", 6.0), src("d", 4.0),  # d: new best, count resets
               src("e", 8.0), src("f", status="incorrect"), src("g", 9.0), src("h", 0.5)]
    out = search(store, run_id, problem, FakeProposer(sources), max_evals=20, stall=3)
    assert out.stop_reason == "no improvement in 3 evaluations"
    assert out.evaluations == 7
    assert out.best.result.runtime_ms == 4.0


def test_time_budget_zero_still_buys_the_first_evaluation(store, problem):
    run_id = new_run(store, problem)
    pool, proposer = FakePool(), FakeProposer([src("a", 5.0), src("b", 4.0)])
    out = search(store, run_id, problem, proposer, pool, max_evals=10, time_budget_s=0)
    assert "time-budget 0 s" in out.stop_reason
    assert out.evaluations == 1 and pool.submitted == [src("a", 5.0)]
    assert out.best is not None and out.best.result.runtime_ms == 5.0


class SlowFirstProposer(FakeProposer):
    """Takes 0.6 s over its first answer, as a graph capture of a large reference can."""

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        if not self.calls:
            time.sleep(0.6)
        return super().propose(ctx, n)


def test_time_budget_counts_from_the_first_proposal(store, problem):
    run_id = new_run(store, problem)
    pool = FakePool(workers=2)
    proposer = SlowFirstProposer([src(f"c{i}", 5.0 - 0.1 * i) for i in range(4)])
    out = search(store, run_id, problem, proposer, pool, max_evals=10, time_budget_s=0.3)
    assert out.first_proposal_s is not None and out.first_proposal_s >= 0.6
    assert out.evaluations >= 2  # the first batch, asked for before the clock started, is all evaluated
    assert "time-budget 0.3 s" in out.stop_reason or out.stop_reason == "the proposers have nothing left to try"


def test_same_source_twice_is_evaluated_once(store, problem):
    run_id = new_run(store, problem)
    pool = FakePool()
    out = search(store, run_id, problem, FakeProposer([src("a", 5.0), src("a", 5.0), src("b", 6.0)]), pool,
                 max_evals=10)
    assert out.evaluations == 2 and pool.submitted == [src("a", 5.0), src("b", 6.0)]
    assert [n.source for n in store.nodes(run_id)] == [src("a", 5.0), src("b", 6.0)]


def test_source_from_earlier_run_is_reused(store, problem):
    first = new_run(store, problem)
    search(store, first, problem, FakeProposer([src("a", 4.0)]), max_evals=10)
    second = new_run(store, problem)
    pool, seen = FakePool(), []
    out = search(store, second, problem, FakeProposer([src("a", 4.0), src("b", 6.0)]), pool, max_evals=10,
                 on_result=lambda node, result: seen.append((node.id, result)))
    assert pool.submitted == [src("b", 6.0)]
    assert out.evaluations == 1 and store.count_evaluated(second) == 1
    nodes = store.nodes(second)
    assert [n.cached for n in nodes] == [True, False]
    assert nodes[0].result.runtime_ms == 4.0
    assert len(seen) == 2 and seen[0][1].runtime_ms == 4.0 and seen[0][1].speedup_eager == pytest.approx(2.5)
    assert out.best.id == nodes[0].id


def test_other_device_key_is_not_cached(store, problem):
    search(store, new_run(store, problem), problem, FakeProposer([src("a", 4.0)]), max_evals=10)
    run_id = new_run(store, problem, device_key="cuda:H200")
    pool = FakePool()
    out = search(store, run_id, problem, FakeProposer([src("a", 4.0)]), pool, device_key="cuda:H200", max_evals=10)
    assert pool.submitted == [src("a", 4.0)] and out.evaluations == 1
    assert store.nodes(run_id)[0].cached is False


def test_pending_node_is_evaluated_on_resume(store, problem):
    run_id = new_run(store, problem)
    search(store, run_id, problem, FakeProposer([src("a", 5.0), src("b", 6.0)]), max_evals=2)
    # a node added without a result, as when the process was killed mid-evaluation
    store.add_node(run_id, problem.sha, KEY, Candidate(src("c", 3.0), proposer="fake"))
    assert store.nodes(run_id)[-1].result is None
    pool, proposer = FakePool(), FakeProposer([src("d", 1.0)])
    out = search(store, run_id, problem, proposer, pool, max_evals=3)
    assert pool.submitted == [src("c", 3.0)] and proposer.calls == []
    assert out.evaluations == 3 and "max-evals 3" in out.stop_reason
    nodes = store.nodes(run_id)
    assert all(n.result is not None for n in nodes)
    assert out.best.source == src("c", 3.0)


def test_resume_then_continues_proposing(store, problem):
    run_id = new_run(store, problem)
    store.add_node(run_id, problem.sha, KEY, Candidate(src("p", 5.0), proposer="fake"))
    pool = FakePool()
    out = search(store, run_id, problem, FakeProposer([src("q", 4.0)]), pool, max_evals=10)
    assert pool.submitted == [src("p", 5.0), src("q", 4.0)]
    assert out.evaluations == 2 and out.stop_reason == "the proposers have nothing left to try"


def test_selector_passes_fastest_node_as_parent(store, problem):
    run_id = new_run(store, problem)
    proposer = FakeProposer([src("a", 5.0), src("b", 2.0), src("c", 7.0), src("d", 3.0)])
    search(store, run_id, problem, proposer, max_evals=10)
    ids = [n.id for n in store.nodes(run_id)]
    assert proposer.calls == [(0, []), (1, [ids[0]]), (2, [ids[1]]), (3, [ids[1]]), (4, [ids[1]])]
    assert [n.parent for n in store.nodes(run_id)] == [None, ids[0], ids[1], ids[1]]


def test_on_result_once_per_result(store, problem):
    search(store, new_run(store, problem), problem, FakeProposer([src("x", 9.0)]), max_evals=10)
    run_id = new_run(store, problem)
    seen = []
    sources = [src("a", 5.0), src("x", 9.0), src("a", 5.0), src("b", status="incorrect"), src("c", 4.0)]
    search(store, run_id, problem, FakeProposer(sources), max_evals=10,
           on_result=lambda node, result: seen.append(node.id))
    assert sorted(seen) == [n.id for n in store.nodes(run_id)] and len(seen) == 4


def test_best_is_fastest_ok_timed_node(store, problem):
    run_id = new_run(store, problem)
    sources = [src("a", 5.0), src("b", 1.0, "incorrect"), src("c"), src("d", 3.0), src("e", 4.0)]
    out = search(store, run_id, problem, FakeProposer(sources), max_evals=10)
    assert out.best.source == src("d", 3.0) and out.best_why == "fastest timed candidate"
    assert out.best.result.speedup_eager == pytest.approx(EAGER_MS / 3.0)


def test_best_untimed_and_none(store, problem):
    run_id = new_run(store, problem)
    out = search(store, run_id, problem, FakeProposer([src("a", 2.0, "incorrect"), src("b"), src("c")]), max_evals=9)
    assert out.best.source == src("b") and "no candidate was timed" in out.best_why
    run_id = new_run(store, problem)
    out = search(store, run_id, problem, FakeProposer([src("z", 2.0, "incorrect")]), max_evals=9)
    assert out.best is None and out.best_why == "no candidate was verified"


@pytest.mark.parametrize("ceilings, flagged", [("table", True), ("measured", False)])
def test_suspect_mark_from_roofline_floor(store, problem, ceilings, flagged):
    run_id = new_run(store, problem)
    profile = make_profile(ceilings_source=ceilings, floor_ms=3.0)
    # 2 ms is 5x over eager: below the speedup mark, so only the floor can flag it
    search(store, run_id, problem, FakeProposer([src("fast", 2.0), src("slow", 5.0)]), profile=profile, max_evals=9)
    fast, slow = store.nodes(run_id)
    assert ("roofline floor" in fast.result.details.get("suspect", "")) is flagged
    assert "suspect" not in slow.result.details



def test_proposals_that_only_repeat_the_run_end_the_search(store, problem):
    """A proposer stuck on a source the run already holds counts as exhausted instead of looping forever."""

    class Stuck(FakeProposer):
        def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
            return [Candidate(src("stuck", 2.0), proposer=self.name)]

    out = search(store, new_run(store, problem), problem, Stuck([]), max_evals=10)
    assert out.evaluations == 1 and out.stop_reason == "the proposers have nothing left to try"


def test_fresh_run_starts_from_kernels_already_verified_for_the_problem(store, problem):
    earlier = new_run(store, problem)  # e.g. a baseline stored beside the run, or an earlier run
    search(store, earlier, problem, FakeProposer([src("fast", 2.0), src("wrong", 0.1, "incorrect"), src("slow", 7.0)]),
           max_evals=10)
    other = new_run(store, problem, device_key="cuda:H200")
    search(store, other, problem, FakeProposer([src("elsewhere", 0.5)]), device_key="cuda:H200", max_evals=10)
    run_id = new_run(store, problem)
    pool = FakePool()
    out = search(store, run_id, problem, FakeProposer([src("new", 3.0)]), pool, max_evals=10)
    assert pool.submitted == [src("new", 3.0)]  # the known kernels cost no evaluation
    nodes = store.nodes(run_id)
    assert [n.source for n in nodes] == [src("fast", 2.0), src("slow", 7.0), src("new", 3.0)]
    assert [n.cached for n in nodes] == [True, True, False] and nodes[0].meta["reused"] is True
    assert out.best.source == src("fast", 2.0) and out.evaluations == 1


class HistoryProposer(FakeProposer):
    """Keeps the tree each proposal was made from."""

    def __init__(self, sources):
        super().__init__(sources)
        self.seen: list[list] = []

    def propose(self, ctx, n):
        self.seen.append(list(ctx.history))
        return super().propose(ctx, n)


@pytest.mark.parametrize("resumed", [False, True])
@pytest.mark.parametrize("evals", [3, 12])
def test_the_loop_reads_the_node_table_once_however_many_evaluations(store, problem, monkeypatch, evals, resumed):
    """The tree lives in the loop: the node table is read once at the start (a resumed run's nodes), not after every
    write, and what proposers see is what the store holds (a fresh run's seeded kernels included)."""
    search(store, new_run(store, problem), problem, FakeProposer([src("known", 9.0)]), max_evals=1)
    run_id = new_run(store, problem)
    if resumed:
        store.add_node(run_id, problem.sha, KEY, Candidate(src("pending", 8.0), proposer="fake"))
    reads = []
    real = Store.nodes
    monkeypatch.setattr(Store, "nodes", lambda self, rid: reads.append(rid) or real(self, rid))
    proposer = HistoryProposer([src(f"c{i}", 5.0 + i % 4) for i in range(evals - resumed)])
    out = search(store, run_id, problem, proposer, max_evals=evals + 5)
    assert out.evaluations == evals and out.stop_reason == "the proposers have nothing left to try"
    assert reads == [run_id]
    nodes = real(store, run_id)
    assert [n.cached for n in nodes][:1] == [not resumed]  # a fresh run starts from the known kernel
    assert proposer.seen[-1] == nodes  # results included: the last ask came after every result
    assert out.best == best_node(nodes)[0]


def test_resumed_run_is_not_seeded_again(store, problem):
    search(store, new_run(store, problem), problem, FakeProposer([src("fast", 2.0)]), max_evals=10)
    run_id = new_run(store, problem)
    store.add_node(run_id, problem.sha, KEY, Candidate(src("p", 5.0), proposer="fake"))
    search(store, run_id, problem, FakeProposer([]), max_evals=10)
    assert [n.source for n in store.nodes(run_id)] == [src("p", 5.0)]


class GatedPool(FakePool):
    """Each evaluation runs on a thread and finishes once a proposal has started (or after ``patience`` s); it
    records whether one did, so a test sees whether proposing overlapped evaluating."""

    def __init__(self, proposing, patience: float = 1.0, gated: int = 100):
        super().__init__()
        self.proposing, self.patience, self.gated = proposing, patience, gated  # only the first `gated` wait
        self.overlapped: list[bool] = []

    def submit(self, candidate):
        import threading

        self.submitted.append(candidate.source)
        self.proposing.clear()  # only a proposal started after this submission counts
        fut: Future[Result] = Future()

        wait = len(self.submitted) <= self.gated

        def run():
            self.overlapped.append(self.proposing.wait(self.patience) if wait else False)
            fut.set_result(fake_result(candidate.source))

        threading.Thread(target=run, daemon=True).start()
        return fut


class SignallingProposer(FakeProposer):
    def __init__(self, sources, started):
        super().__init__(sources)
        self.started = started

    def propose(self, ctx, n):
        self.started.set()
        return super().propose(ctx, n)


@pytest.mark.parametrize("pipeline", [True, False])
def test_proposals_overlap_evaluations_only_when_pipelined(store, problem, pipeline):
    import threading

    started = threading.Event()
    pool = GatedPool(started, patience=10.0 if pipeline else 0.5, gated=2)  # a wait ends when a proposal starts
    proposer = SignallingProposer([src(f"c{i}", 5.0 - i) for i in range(3)], started)
    out = search(store, new_run(store, problem), problem, proposer, pool, max_evals=3, pipeline=pipeline)
    assert out.evaluations == 3
    # the first two evaluations had a next batch to ask for; the third ran into --max-evals
    assert pool.overlapped[:2] == [pipeline, pipeline]


class AfterResultsProposer(FakeProposer):
    """Offers a second candidate only once the first one's result is in the tree (as tuning around a best does)."""

    def propose(self, ctx, n):
        self.calls.append((len(ctx.history), [p.id for p in ctx.parents]))
        if not ctx.history:
            return [Candidate(src("first", 5.0), proposer=self.name)]
        if any(h.result is not None for h in ctx.history) and len(ctx.history) == 1:
            return [Candidate(src("second", 4.0), proposer=self.name, parent=ctx.history[0].id)]
        return []


def test_an_early_empty_proposal_does_not_end_the_search(store, problem):
    import threading

    started = threading.Event()
    pool = GatedPool(started, patience=0.2)
    out = search(store, new_run(store, problem), problem, AfterResultsProposer([]), pool, max_evals=5)
    assert pool.submitted == [src("first", 5.0), src("second", 4.0)]
    assert out.evaluations == 2 and out.stop_reason == "the proposers have nothing left to try"


def test_a_reused_kernel_leaves_its_earlier_runs_call_and_reply_behind(store, problem):
    class Replied(FakeProposer):
        def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
            out = super().propose(ctx, n)
            return [Candidate(c.source, proposer=c.proposer, meta={"label": "m", "llm_call": 5, "start": "mine.py",
                                                                    "reply": "run1-001.reply.md"}) for c in out]

    search(store, new_run(store, problem), problem, Replied([src("fast", 2.0)]), max_evals=5)
    run_id = new_run(store, problem)
    search(store, run_id, problem, FakeProposer([]), max_evals=5)
    (seeded,) = store.nodes(run_id)
    assert seeded.meta["reused"] and seeded.meta["label"] == "m"
    assert "reply" not in seeded.meta and "llm_call" not in seeded.meta  # that run's verdict file stays that run's
    assert "start" not in seeded.meta  # nor is it this run's start kernel
