"""The closed loop: ask proposers for candidates, evaluate them in parallel, store every result at once, select, repeat.

Proposal and evaluation are pipelined: proposers run on their own thread, and the next batch is asked for as soon as
the queue runs dry while evaluations are still in flight, so a slow proposer (a language model) and the workers
overlap instead of taking turns. What to do next is the policy's (policy.py); this driver moves work to the pool and
results back into the tree and the state."""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult
from kernelevolve.problem import Problem
from kernelevolve.rows import Node
from kernelevolve.search import policy, turns
from kernelevolve.search.batches import Batches
from kernelevolve.search.proposals import Proposals
from kernelevolve.search.protocols import Pool, Proposer
from kernelevolve.search.select import Selector, best_node
from kernelevolve.search.state import SearchConfig, SearchOutcome, SearchState, Step, Stop
from kernelevolve.search.tree import Tree
from kernelevolve.store import Store

if TYPE_CHECKING:
    from kernelevolve.profile import Profile

log = logging.getLogger(__name__)

OnResult = Callable[[Node, Result], None]
OnScreen = Callable[[int, int], None]  # (candidates screened in a batch, sent on to the judge)


class _Loop:
    def __init__(self, store: Store, run_id: int, problem: Problem, device: str, device_key: str, pool: Pool,
                 proposers: list[Proposer], selector: Selector, cfg: SearchConfig, baseline: Baseline | None,
                 profile: Profile | None, on_result: OnResult | None, on_screen: OnScreen | None = None):
        self.pool, self.cfg, self.baseline = pool, cfg, baseline
        self.on_result, self.on_screen = on_result, on_screen
        self.tree = Tree(store, run_id, problem.sha, device_key)
        self.history = self.tree.nodes
        best, _ = best_node(self.history)
        self.state = SearchState(evaluated=store.count_evaluated(run_id), screened=store.count_screened(run_id),
                                 best_ms=best.runtime_ms if best and best.runtime_ms is not None else math.inf)
        self.proposals = Proposals(store, run_id, problem, device, device_key, profile, proposers, selector, cfg,
                                   self.state)
        self.in_flight: dict[Future[Result], Node] = {}
        self.batches = Batches(pool, self.state)
        self.began = time.monotonic()
        # Only a floor from datasheet ceilings is a hard limit; measured CPU ceilings are beaten by cache-resident ops.
        self.floor_ms = profile.floor_ms if profile and profile.ceilings_source == "table" else None

    def stop(self) -> Stop | None:
        return policy.stop_reason(self.cfg, self.state, time.monotonic(), self.speedup())

    def speedup(self) -> float:
        return policy.best_speedup(self.baseline, self.state.best_ms)

    def screen_on(self) -> bool:
        return policy.screen_on(self.cfg, self.state, self.batches.screen is not None)

    def ask(self) -> None:
        self.proposals.ask(self.history, self.screen_on(), self.pool.workers)

    def judge(self, node: Node) -> None:
        self.in_flight[self.pool.submit(node.candidate())] = node
        self.state.judging.append(node.id)

    def judged(self, fut: Future[Result]) -> Node:
        node = self.in_flight.pop(fut)
        self.state.judging.remove(node.id)
        return node

    def submit_next(self) -> Step:
        """Submit one candidate to the judge, or one batch to the screen."""
        state = self.state
        node = policy.next_finalist(state)
        if node is not None:
            state.finalists.remove(node)
            self.judge(node)
            return Step.TOOK
        if not state.queue:
            self.proposals.take_if_done()
            if not state.queue:
                if state.exhausted:
                    return Step.WAIT if state.finalists else Step.DONE  # backups wait for their batch's verdict
                self.ask()
                return Step.WAIT
        if self.screen_on():
            if policy.evals_left(self.cfg, state) <= 0:
                return Step.WAIT  # the batches being screened will want the judge evaluations left
            return self.submit_batch()
        taken = self.take()
        if isinstance(taken, Node):
            self.judge(taken)
            return Step.TOOK
        return taken

    def take(self) -> Node | Step:
        """The next queued candidate as a new node of the tree; TOOK when it was consumed without needing a worker
        (its result reused, or a repeat), DONE once the proposers only repeat themselves."""
        cand = self.state.queue.popleft()
        if any(n.sha == cand.sha for n in self.history):
            self.state.repeats += 1  # this run already holds that source
            return turns.after_repeat(self.state)
        self.state.repeats = 0
        node = self.add(cand, "source already evaluated for this problem and device; reusing its result")
        return Step.TOOK if node is None else node

    def add(self, cand: Candidate, reused: str = "") -> Node | None:
        """``cand`` as a new node of the tree; None when its source was judged for this problem and device in
        another run, whose result it takes as it is (logged with ``reused``)."""
        node = self.tree.add(cand)
        if node.result is None:
            return node
        if reused:
            log.info("node %d: %s", node.id, reused)
        self._record(node, node.result.with_baseline(self.baseline), save=False)
        return None

    def submit_batch(self) -> Step:
        """Send the next batch to the screen. A batch holds the candidates of the proposer whose turn it is
        (turns.next_proposer), so that template candidates, compiled in seconds, do not wait on Inductor's, which
        take tens of seconds each; when that proposer has nothing queued, it is asked first (WAIT: for it)."""
        state = self.state
        queued = {c.proposer for c in state.queue}
        head = turns.next_proposer(self.cfg, state, self.history, self.proposals.seats)
        if head is not None and head not in queued:
            if not self.proposals.asking:
                self.ask()
            if self.proposals.asking:
                return Step.WAIT
        if head is None or head not in queued:
            head = state.queue[0].proposer
        room = turns.batch_room(self.cfg, state, self.proposals.seats, head)
        batch: list[Node] = []
        others: list[Candidate] = []  # other proposers' candidates, back to the queue in their order
        while state.queue and len(batch) < room:
            if state.queue[0].proposer != head:
                others.append(state.queue.popleft())
                continue
            node = self.take()
            if node is Step.DONE:
                break
            if isinstance(node, Node):
                batch.append(node)
        state.queue.extendleft(reversed(others))
        if batch:
            state.batches_sent[head] += 1
            self.batches.send(batch)
            return Step.TOOK
        state.dry[head] = state.recorded  # only repeats of what the run holds: others go first until the next result
        return turns.after_repeat(state)

    def _record_screen(self, fut: Future[list[ScreenResult]]) -> None:
        """Store what the screen found and queue the finalists policy.pick_finalists chose for the judge."""
        state = self.state
        pairs, unscreened = self.batches.take(fut)
        state.screened += len(pairs)
        chosen = policy.pick_finalists(self.cfg, state, pairs, policy.screen_bar(self.history),
                                       policy.hopeless_ms(self.baseline))
        sent = {}
        for node, result in pairs:
            node = self.tree.save_screen(node, result, node.id in chosen)
            if node.finalist:
                sent[node.id] = node
            else:
                self.proposals.observe(node)  # the screen's word is its last
        policy.queue_finalists(state, [sent[i] for i in chosen], unscreened, len(pairs))
        if self.on_screen:
            self.on_screen(len(pairs), len(chosen))

    def closing_round(self, stop: Stop) -> int:
        """Once the search has stopped, judge what it already knows to be faster than its best (policy.closes,
        policy.closing_picks), at most ``finalists`` of them. Without it a run stopped by its budget can return a
        kernel slower than one the screen had found, or than torch.compile. Returns how many were sent to the judge."""
        if not policy.closes(self.cfg, self.state, stop, self.speedup()):
            return 0
        self.state.closed = True
        room = policy.closing_room(self.cfg, self.state)
        fallbacks = self.proposals.fallbacks(self.baseline, {n.sha for n in self.history if n.result is not None})
        sent: set[int] = set()
        for item in policy.closing_picks(self.state, fallbacks, policy.screen_bar(self.history)):
            if len(sent) >= room:
                break
            node = item if isinstance(item, Node) else self.node_for(item)
            if node is not None and node.id not in sent:
                sent.add(node.id)
                self.judge(node)
        if sent:
            log.info("closing round: judging %d candidate(s) the screen or a baseline timed under the best (%.4g ms)",
                     len(sent), self.state.best_ms)
        self.state.finalists = deque(n for n in self.state.finalists if n.id not in sent)
        return len(sent)

    def node_for(self, cand: Candidate) -> Node | None:
        """The node of ``cand``: the one the tree holds for its source when it has no verdict yet, else a new one."""
        held = self.tree.find(cand.sha)
        if held is not None:
            return held if held.result is None and held.id not in self.state.judging else None
        return self.add(cand)

    def _record(self, node: Node, result: Result, save: bool = True) -> None:
        result = result.flag_suspect(self.floor_ms)
        if save:
            self.tree.save_result(node, result)
            self.state.evaluated += 1
        self.proposals.observe(self.tree.current(node))
        policy.count_result(self.state, result, judged=save)
        dropped = policy.drop_backups(self.cfg, self.state, node, result, self.history)
        for backup in dropped:
            self.proposals.observe(self.tree.drop_finalist(backup))
        if dropped:
            log.info("node %d: judged at %.4g ms against %.4g ms on the screen; %d backup finalist(s) of its batch "
                     "not judged", node.id, result.runtime_ms, node.screen.ms if node.screen else None, len(dropped))
        if self.on_result:
            self.on_result(node, result)

    def resume_pending(self) -> None:
        """Take up what a killed run left pending: its finalists go to the judge, the nodes it had not screened yet
        to the screen again (to the judge when the screen is off)."""
        pending = self.tree.pending()
        if self.screen_on():
            self.state.finalists.extend(n for n in pending if n.finalist)
            fresh = [n for n in pending if not n.finalist]
            for i in range(0, len(fresh), self.cfg.screen_batch):
                self.batches.send(fresh[i:i + self.cfg.screen_batch])
            return
        for node in pending:
            self.judge(node)

    def harvest(self) -> int:
        """Record the evaluations that have already finished, without waiting; how many there were."""
        done = [fut for fut in self.in_flight if fut.done()]
        for fut in done:
            self._record(self.judged(fut), fut.result().with_baseline(self.baseline))
        return len(done)

    def run(self) -> SearchOutcome:
        try:
            return self._run()
        finally:
            self.proposals.close()

    def _run(self) -> SearchOutcome:
        state = self.state
        if all(n.meta.get("start") for n in self.history):  # a fresh run (its start kernels are judged already)
            for cand in self.tree.known_seeds():  # they cost no evaluation, and the best can never be slower
                self.add(cand, "reusing a kernel already verified for this problem and device")
        self.resume_pending()
        if self.screen_on() and not (state.busy or state.finalists) and self.stop() is None:
            self.batches.warm(self.cfg.screen_batch)
        stop: Stop | None = None
        reason = ""
        while True:
            waiting = False
            while stop is None and state.busy < self.pool.workers:
                stop = self.stop()
                if stop is None:
                    step = self.submit_next()
                    if step is Step.WAIT:
                        waiting = True
                        break
                    if step is Step.DONE:
                        stop = self.stop() or Stop.EXHAUSTED
                if stop is not None:
                    reason = policy.describe(stop, self.cfg, self.proposals.why_stopped())
            if stop is None and not waiting and self.harvest():
                continue  # results already in: take them before proposing from the tree
            if stop is not None and not state.closed and not state.busy:
                self.closing_round(stop)  # once the best is final (every evaluation and screen in or cancelled)
            if stop is None and self.cfg.pipeline and not state.queue and state.busy and self.stop() is None:
                self.ask()  # every worker is busy and nothing is queued: propose while they run
            proposing = self.proposals.future if waiting or stop is None else None
            pending: list[Future[Any]] = [*self.in_flight, *self.batches.flying, *([proposing] if proposing else [])]
            if not state.busy and (stop is not None or not pending):
                break
            if state.batches and not state.cancelled and self.stop() is not None:
                self.batches.cancel()  # the search is over: a batch still compiling would only delay the answer
            done, _ = wait(pending, timeout=policy.wait_limit(self.cfg, state, time.monotonic()),
                           return_when=FIRST_COMPLETED)
            for fut in done:
                if fut is self.proposals.future:
                    self.proposals.take()
                elif fut in self.batches.flying:
                    self._record_screen(fut)
                else:
                    self._record(self.judged(fut), fut.result().with_baseline(self.baseline))
        best, why = best_node(self.history)
        first = None if state.start is None else round(state.start - self.began, 3)
        return SearchOutcome(reason or "stopped", state.evaluated, best, why, first, state.screened)


def run_search(store: Store, run_id: int, problem: Problem, device: str, device_key: str, pool: Pool,
               proposers: list[Proposer], selector: Selector, cfg: SearchConfig, baseline: Baseline | None,
               profile: Profile | None = None, on_result: OnResult | None = None,
               on_screen: OnScreen | None = None) -> SearchOutcome:
    """Search until a stop condition holds. Every result is committed as it arrives, so a killed run resumes."""
    return _Loop(store, run_id, problem, device, device_key, pool, proposers, selector, cfg, baseline, profile,
                 on_result, on_screen).run()
