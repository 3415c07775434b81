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
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult, Status
from kernelevolve.problem import Problem
from kernelevolve.rows import Node
from kernelevolve.search import policy
from kernelevolve.search.proposals import Proposals
from kernelevolve.search.protocols import Cancelling, Pool, Proposer, Screen, Warming
from kernelevolve.search.select import Selector, best_node
from kernelevolve.search.state import MAX_REPEATS, SearchConfig, SearchOutcome, SearchState, Step, Stop
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
        self.screen: Screen | None = pool if isinstance(pool, Screen) else None
        self.on_result, self.on_screen = on_result, on_screen
        self.tree = Tree(store, run_id, problem.sha, device_key)
        self.history = self.tree.nodes
        best, _ = best_node(self.history)
        self.state = SearchState(evaluated=store.count_evaluated(run_id), screened=store.count_screened(run_id),
                                 best_ms=best.runtime_ms if best and best.runtime_ms is not None else math.inf)
        self.proposals = Proposals(store, run_id, problem, device, device_key, profile, proposers, selector, cfg,
                                   self.state)
        self.in_flight: dict[Future[Result], Node] = {}
        self.screening: dict[Future[list[ScreenResult]], tuple[list[Node], float]] = {}  # batch, when sent
        self.began = time.monotonic()
        # Only a floor from datasheet ceilings is a hard limit; measured CPU ceilings are beaten by cache-resident ops.
        self.floor_ms = profile.floor_ms if profile and profile.ceilings_source == "table" else None

    def stop(self) -> Stop | None:
        return policy.stop_reason(self.cfg, self.state, time.monotonic(), self.speedup())

    def speedup(self) -> float:
        return policy.best_speedup(self.baseline, self.state.best_ms)

    def screen_on(self) -> bool:
        return policy.screen_on(self.cfg, self.state, self.screen is not None)

    def ask(self) -> None:
        self.proposals.ask(self.history, self.screen_on(), self.pool.workers)

    def judge(self, node: Node) -> None:
        self.in_flight[self.pool.submit(node.candidate())] = node
        self.state.judging.append(node.id)

    def judged(self, fut: Future[Result]) -> Node:
        node = self.in_flight.pop(fut)
        self.state.judging.remove(node.id)
        return node

    def send_batch(self, batch: list[Node]) -> None:
        assert self.screen is not None  # only sent while screen_on()
        sent = time.monotonic()
        self.screening[self.screen.screen([n.candidate() for n in batch])] = (batch, sent)
        self.state.batches.append(len(batch))

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
            return Step.TOOK if self.state.repeats < MAX_REPEATS else Step.DONE
        self.state.repeats = 0
        node = self.tree.add(cand)
        if node.result is not None:
            log.info("node %d: source already evaluated for this problem and device; reusing its result", node.id)
            self._record(node, node.result.with_baseline(self.baseline), save=False)
            return Step.TOOK
        return node

    def submit_batch(self) -> Step:
        """Send the next batch to the screen. A batch holds the candidates of the proposer whose turn it is
        (policy.next_proposer), so that template candidates, compiled in seconds, do not wait on Inductor's, which
        take tens of seconds each; when that proposer has nothing queued, it is asked first (WAIT: for it)."""
        state = self.state
        queued = {c.proposer for c in state.queue}
        head = policy.next_proposer(self.cfg, state, self.history, self.proposals.seats)
        if head is not None and head not in queued:
            if not self.proposals.asking:
                self.ask()
            if self.proposals.asking:
                return Step.WAIT
        if head is None or head not in queued:
            head = state.queue[0].proposer
        room = policy.batch_room(self.cfg, state, self.proposals.seats, head)
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
            self.send_batch(batch)
            return Step.TOOK
        state.dry[head] = state.recorded  # only repeats of what the run holds: others go first until the next result
        return Step.TOOK if state.repeats < MAX_REPEATS else Step.DONE

    def _screened(self, fut: Future[list[ScreenResult]], nodes: list[Node]) -> list[ScreenResult]:
        """The batch's results; a batch whose screen failed as a whole was not screened (each goes to the judge)."""
        if fut.cancelled():  # by cancel_screens(), before it started
            return [ScreenResult(Status.RUNTIME_ERROR, "not screened: the search stopped first", harness=True)] \
                * len(nodes)
        try:
            results = fut.result()
            if len(results) == len(nodes):
                return results
            reason = f"the screen returned {len(results)} results for {len(nodes)} candidates"
        except Exception as e:  # the executor's own failure, not the candidates'
            reason = f"{type(e).__name__}: {e}"
        log.warning("a screen batch failed: %s; its candidates go to the judge", reason)
        return [ScreenResult(Status.RUNTIME_ERROR, f"not screened: {reason}", harness=True)] * len(nodes)

    def _record_screen(self, fut: Future[list[ScreenResult]]) -> None:
        """Store what the screen found and queue the finalists policy.pick_finalists chose for the judge."""
        nodes, sent_at = self.screening.pop(fut)
        state = self.state
        state.batches.remove(len(nodes))
        state.screen_s += time.monotonic() - sent_at
        results = self._screened(fut, nodes)
        unscreened = [n for n, r in zip(nodes, results) if r.harness]  # the screen's own failure: to the judge
        pairs = [(n, r) for n, r in zip(nodes, results) if not r.harness]
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
        state.finalists.extend(sent[i] for i in chosen)  # the fastest first
        state.backups.update(policy.backups_of(chosen))
        state.finalists.extend(unscreened)
        if pairs and not chosen:
            state.since_best += 1
        if pairs:
            state.recorded += 1  # the tree holds new screen times: a proposer that had nothing may have some now
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
        node = self.tree.add(cand)
        if node.result is not None:  # judged for this problem and device in another run: reused as it is
            self._record(node, node.result.with_baseline(self.baseline), save=False)
            return None
        return node

    def budget_left(self) -> float | None:
        """Seconds until the time budget ends, None without one or once it has (nothing to wake up for then)."""
        if self.cfg.time_budget_s is None or self.state.start is None:
            return None
        left = self.state.start + self.cfg.time_budget_s - time.monotonic()
        return left + 0.01 if left > 0 else None

    def cancel_screens(self) -> None:
        """Stop the batches in flight: their candidates not yet screened come back as the screen's own failure and
        stay pending in the tree (a resumed run screens them)."""
        self.state.cancelled = True
        if isinstance(self.pool, Cancelling):
            log.info("the search stopped with %d screen batch(es) in flight: cancelling them", len(self.screening))
            self.pool.cancel_screens()

    def _record(self, node: Node, result: Result, save: bool = True) -> None:
        result = result.flag_suspect(self.floor_ms)
        if save:
            self.tree.save_result(node, result)
            self.state.evaluated += 1
        self.proposals.observe(self.tree.current(node))
        policy.count_result(self.state, result, judged=save)
        self.drop_backups(node, result)
        if self.on_result:
            self.on_result(node, result)

    def drop_backups(self, node: Node, result: Result) -> None:
        """Once the judge has timed a finalist as its screen time predicts (policy.screen_agrees), the batch's
        finalists still waiting behind it, slower on the screen, are not judged (their screen result is their last
        word). A finalist that failed the judge, or whose times disagree, leaves them waiting."""
        later = self.state.backups.pop(node.id, None)
        if not later or not policy.screen_agrees(self.cfg.backup_agree, node, result, self.history):
            return
        waiting = {n.id: n for n in self.state.finalists if n.id in later}
        if not waiting:
            return
        self.state.finalists = deque(n for n in self.state.finalists if n.id not in waiting)
        for node_id, backup in waiting.items():
            self.state.backups.pop(node_id, None)
            self.proposals.observe(self.tree.drop_finalist(backup))
        log.info("node %d: judged at %.4g ms against %.4g ms on the screen; %d backup finalist(s) of its batch not "
                 "judged", node.id, result.runtime_ms, node.screen.ms, len(waiting))

    def seed_known(self) -> None:
        """Start a fresh run from the fastest kernels already verified for this problem on this device model (a
        baseline stored beside the run, or an earlier run's winners). They cost no evaluation, and the run can then
        never return something slower than what is already known."""
        for cand in self.tree.known_seeds():
            node = self.tree.add(cand)
            if node.result is not None:
                log.info("node %d: reusing a kernel already verified for this problem and device (%.4g ms)", node.id,
                         node.result.runtime_ms)
                self._record(node, node.result.with_baseline(self.baseline), save=False)

    def resume_pending(self) -> None:
        """Take up what a killed run left pending: its finalists go to the judge, the nodes it had not screened yet
        to the screen again (to the judge when the screen is off)."""
        pending = self.tree.pending()
        if self.screen_on():
            self.state.finalists.extend(n for n in pending if n.finalist)
            fresh = [n for n in pending if not n.finalist]
            for i in range(0, len(fresh), self.cfg.screen_batch):
                self.send_batch(fresh[i:i + self.cfg.screen_batch])
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
            self.seed_known()
        self.resume_pending()
        if isinstance(self.pool, Warming) and self.screen_on() and not (state.busy or state.finalists) \
                and self.stop() is None:
            self.pool.warm_screens(self.cfg.screen_batch)  # the screen's processes start while the first proposal
            # is made (no judge is timing yet)
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
            pending: list[Future[Any]] = [*self.in_flight, *self.screening, *([proposing] if proposing else [])]
            if not state.busy and (stop is not None or not pending):
                break
            if self.screening and not state.cancelled and self.stop() is not None:
                self.cancel_screens()  # the search is over: a batch still compiling would only delay the answer
            done, _ = wait(pending, timeout=self.budget_left() if self.screening and not state.cancelled else None,
                           return_when=FIRST_COMPLETED)
            for fut in done:
                if fut is self.proposals.future:
                    self.proposals.take()
                elif fut in self.screening:
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
