"""The closed loop: ask proposers for candidates, evaluate them in parallel, store every result at once, select, repeat.

Proposal and evaluation are pipelined: proposers run on their own thread, and the next batch is asked for as soon as
the queue runs dry while evaluations are still in flight, so a slow proposer (a language model) and the workers
overlap instead of taking turns."""
from __future__ import annotations

import hashlib
import logging
import math
import statistics
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult, Status
from kernelevolve.problem import Problem
from kernelevolve.propose.base import ProposalContext, Proposer
from kernelevolve.rows import Experience, Node
from kernelevolve.search.select import Selector, best_node
from kernelevolve.store import Store

if TYPE_CHECKING:
    from kernelevolve.profile import Profile

log = logging.getLogger(__name__)


# Proposals in a row that repeat a source the run already holds, after which the proposers count as exhausted.
MAX_REPEATS = 100
# Already-verified kernels of the same problem and device model that a fresh run starts from.
KNOWN_SEEDS = 3


def rank_experience(entries: list[Experience], profile: Profile | None) -> list[Experience]:
    """Earlier winners from problems like this one first: the same dtype, then the nearest size bucket (log2 of the
    bytes the problem moves), then the largest speedup over eager."""
    dtype, nbytes = (profile.dtype, profile.bytes) if profile else (None, None)

    def key(e: Experience) -> tuple[bool, int, float]:
        size = abs(math.log2(e.bytes / nbytes)) if e.bytes and nbytes else 64.0
        return (not (dtype and e.dtype == dtype), round(size), -(e.speedup_eager or 0.0))

    return sorted(entries, key=key)


def proposer_promise(history: list[Node], names: list[str], per: int) -> dict[str, float]:
    """How much of the next ask each proposer gets, against its weight: twice for the one whose kernel is the run's
    fastest (by the judge, else by the screen) among those it proposed, half for one whose last ``2 * per``
    candidates all failed. A kernel the run was handed (``reused``: a baseline's, an earlier run's winner) says
    nothing of how its proposer will do here: a run that starts from max-autotune's kernel would otherwise give the
    Inductor proposer, whose configurations rarely beat it, the turns after the template's first batch."""
    def ms(n: Node) -> float | None:
        if n.runtime_ms is not None:
            return n.runtime_ms
        return n.screen.ms if n.result is None and n.screen is not None and n.screen.ok else None

    out = dict.fromkeys(names, 1.0)
    timed = [n for n in history if ms(n) is not None and not n.meta.get("reused")]
    judged = [n for n in timed if n.runtime_ms is not None]
    pool = judged or timed
    if pool:
        leader = min(pool, key=lambda n: ms(n)).proposer
        if leader in out and len(names) > 1:
            out[leader] = 2.0
    for name in names:
        mine = [n for n in history if n.proposer == name and (n.result is not None or n.screen is not None)]
        recent = mine[-2 * per:]
        if len(recent) >= 2 * per and not any(n.ok or (n.screen is not None and n.screen.ok) for n in recent):
            out[name] = min(out[name], 0.5)
    return out


@dataclass(frozen=True)
class SearchConfig:
    max_evals: int = 20
    time_budget_s: float | None = None  # counted from the first proposal, so that it buys evaluations
    target_speedup: float | None = None  # against eager
    stall: int | None = 10  # evaluations without a new best (a screen batch that sends none on counts as one)
    pipeline: bool = True  # ask for the next batch while every worker is busy, rather than when one is free
    # The screen (evaluate/screen.py): candidates are checked once and timed briefly in batches of this many, and only
    # the fastest ``finalists`` of a batch go on to the judge; 0 judges every candidate. Past ``max_screened`` screened
    # candidates, the rest are judged directly.
    screen_batch: int = 0
    finalists: int = 2
    # A batch's finalists after its fastest are backups: judged only if an earlier one failed the judge or was timed
    # there more than this fraction off what its screen time predicts (the screen's ranking then in doubt; see
    # _Loop.drop_backups); None judges them all.
    backup_agree: float | None = 0.05
    max_screened: int | None = 480
    screen_share: float = 0.6  # of --time-budget, at most, spent screening; the rest is the judge's
    # After the budget (or a stall, or the proposers' end): judge what is already known to beat the best, at most
    # ``finalists`` evaluations (see _Loop.closing_round)
    closing: bool = True


@dataclass(frozen=True)
class SearchOutcome:
    stop_reason: str
    evaluations: int
    best: Node | None
    best_why: str
    first_proposal_s: float | None = None  # from the start of the search to the first candidates in hand
    screened: int = 0


# A finalist of a later batch goes on to the judge only when the screen timed it within this fraction of the
# fastest screen time among the nodes the judge has verified: the screen's and the judge's timings differ, so
# screen times are compared with screen times.
FINALIST_SLACK = 0.05
# Verified nodes with a screen time the run needs before a backup finalist's agreement is held against their median
# ratio of judge to screen time rather than against 1 (see _Loop.drop_backups).
RATIO_PAIRS = 2
# A candidate the screen timed at more than this many times the faster baseline is never sent on to the judge.
HOPELESS = 3.0
# The closing round judges a waiting finalist or a proposer's fallback only when its screen or baseline time is at
# least this fraction under the best judged time: screen and judge agree to a fraction of this on a GPU.
CLOSING_MARGIN = 0.02


OnResult = Callable[[Node, Result], None]
OnScreen = Callable[[int, int], None]  # (candidates screened in a batch, sent on to the judge)


class _Loop:
    def __init__(self, store: Store, run_id: int, problem: Problem, device: str, device_key: str, pool: Any,
                 proposers: list[Proposer], selector: Selector, cfg: SearchConfig, baseline: Baseline | None,
                 profile: Profile | None, on_result: OnResult | None, on_screen: OnScreen | None = None):
        self.store, self.run_id, self.problem, self.device, self.device_key = store, run_id, problem, device, device_key
        self.pool, self.proposers, self.selector, self.cfg = pool, proposers, selector, cfg
        self.baseline, self.profile, self.on_result, self.on_screen = baseline, profile, on_result, on_screen
        # The tree lives here: read once (a resumed run's nodes), then kept up to date from what the loop writes.
        self.history = store.nodes(run_id)
        self.position = {n.id: i for i, n in enumerate(self.history)}
        # Proposers run on one thread of their own; those that record their calls (language models) write through
        # a connection opened on that thread (a sqlite3 connection belongs to the thread that made it).
        self.proposal_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelevolve-propose")
        self.proposing: Future[list[Candidate]] | None = None
        self.proposal_store: Store | None = None
        self.recorded = 0  # results taken into the tree so far (evaluated, reused, or a screened batch)
        self.asked_at: tuple[int, bool] = (0, False)  # (recorded, whether evaluations were in flight) at the ask
        self.asked_for: list[str] = []  # the proposers the last ask went to
        # per proposer: ``recorded`` when an ask it was part of gave nothing of its own (dry until the next result)
        self.dry: dict[str, int] = {}
        self.batches_sent: Counter[str] = Counter()  # screen batches sent, per proposer
        self.empty_at: int | None = None  # recorded when an ask made before some results came back empty
        self.experience = {p.name: rank_experience(store.experience(
            device_key, None if getattr(p, "examples_from_any", False) else p.name, exclude_run=run_id), profile)
            for p in proposers}
        self.evaluated = store.count_evaluated(run_id)
        self.screened = store.count_screened(run_id)
        self.queue: deque[Candidate] = deque()
        self.in_flight: dict[Future[Result], Node] = {}
        self.screening: dict[Future[list[ScreenResult]], tuple[list[Node], float]] = {}  # batch, when sent
        self.screen_s = 0.0  # spent screening (batch wall times, summed over batches)
        self.finalists: deque[Node] = deque()  # sent on by the screen, waiting for a worker
        self.backups: dict[int, list[int]] = {}  # a finalist's id -> the ids of its batch's finalists after it
        self.cancelled = False  # the batches in flight were cancelled when the search stopped
        self.exhausted = False
        self.closed = False  # the closing round was held
        self.began = time.monotonic()
        self.start: float | None = None  # the budget's clock: set when the first candidates are in hand
        best, _ = best_node(self.history)
        self.best_ms = best.runtime_ms if best and best.runtime_ms is not None else math.inf
        self.since_best = 0
        self.repeats = 0
        # Only a floor from datasheet ceilings is a hard limit; measured CPU ceilings are beaten by cache-resident ops.
        self.floor_ms = profile.floor_ms if profile and profile.ceilings_source == "table" else None

    def busy(self) -> int:
        return len(self.in_flight) + len(self.screening)

    def screen_on(self) -> bool:
        cfg = self.cfg
        if cfg.screen_batch <= 0 or not hasattr(self.pool, "screen"):
            return False
        if cfg.max_screened is not None and self.screened + self.screening_count() >= cfg.max_screened:
            return False
        return cfg.time_budget_s is None or self.screen_s < cfg.screen_share * cfg.time_budget_s

    def screening_count(self) -> int:
        return sum(len(nodes) for nodes, _ in self.screening.values())

    def stop_reason(self) -> str | None:
        cfg = self.cfg
        if self.evaluated + len(self.in_flight) >= cfg.max_evals:
            return f"reached --max-evals {cfg.max_evals}"
        # The budget buys search: its clock starts with the first proposal, and it never ends a search before the
        # first judged evaluation (past the screen's share of it, candidates go to the judge directly).
        if cfg.time_budget_s is not None and self.start is not None and self.evaluated + len(self.in_flight) > 0 \
                and time.monotonic() - self.start >= cfg.time_budget_s:
            return f"reached --time-budget {cfg.time_budget_s:g} s"
        if cfg.target_speedup is not None and self.best_speedup() >= cfg.target_speedup:
            return f"reached the target speedup {cfg.target_speedup:g}x"
        if cfg.stall is not None and self.since_best >= cfg.stall:
            return f"no improvement in {cfg.stall} evaluations"
        if self.exhausted and not self.queue and not self.finalists and not self.screening:
            return self.nothing_left()
        return None

    def nothing_left(self) -> str:
        """The stop reason once no proposer has anything more, with what the proposers that stopped said."""
        why = [f"{p.name}: {p.stopped}" for p in self.proposers if getattr(p, "stopped", "")]
        return "the proposers have nothing left to try" + (f" ({'; '.join(why)})" if why else "")

    def observe(self, node: Node) -> None:
        """Tell the proposer of ``node`` that its verdict (the judge's, or the screen's last word) is in."""
        for p in self.proposers:
            if p.name == node.proposer and hasattr(p, "observe"):
                try:
                    p.observe(node)
                except Exception as e:  # a proposer's note-taking must not end the search
                    log.warning("%s could not take the verdict of node %d: %s: %s", p.name, node.id,
                                type(e).__name__, e)

    def best_speedup(self) -> float:
        if self.baseline is None or self.baseline.eager is None or not math.isfinite(self.best_ms):
            return 0.0
        return self.baseline.eager.median_ms / self.best_ms

    def ask(self) -> None:
        """Start the next proposal on the proposal thread, from a snapshot of the tree as it stands. After an ask
        made while evaluations were in flight came back empty, the next waits for a new result: proposers that
        build on results (tuning around the best) may have more to offer once those are in."""
        if self.proposing is None and not self.exhausted and self.empty_at != self.recorded:
            screening = self.screen_on()
            skip = self.queued_proposers() if screening else set()
            asked = [p.name for p in self.proposers if p.name not in skip]
            if not asked:
                return
            self.asked_at, self.asked_for = (self.recorded, bool(self.busy())), asked
            self.proposing = self.proposal_thread.submit(self.propose, list(self.history), skip, screening)

    def room(self, name: str) -> int:
        """A screen batch of ``name``'s candidates: ``screen_batch`` for the heaviest proposer, smaller in proportion
        to its weight for a slower one."""
        weights = {p.name: getattr(p, "weight", 1) for p in self.proposers}
        top = max(weights.values(), default=1)
        return max(1, round(self.cfg.screen_batch * weights.get(name, top) / top))

    def promise(self, history: list[Node], wanted: int) -> tuple[int, dict[str, float]]:
        """(candidates per proposer of an ask for ``wanted``, each proposer's promise: see proposer_promise)."""
        per = max(1, math.ceil(wanted / max(1, len(self.proposers))))
        return per, proposer_promise(history, [p.name for p in self.proposers], per)

    def queued_proposers(self) -> set[str]:
        """Proposers with candidates queued: an ask leaves them out, so that the queue does not fill with one slow
        proposer's candidates while another waits for its turn, and no proposer is asked again before its last
        answer is in the tree (it would propose the same sources again)."""
        return {c.proposer for c in self.queue}

    def propose(self, history: list[Node], skip: set[str] | frozenset[str] = frozenset(),
                screening: bool = False) -> list[Candidate]:
        if self.proposal_store is None and any(hasattr(p, "bind") for p in self.proposers):
            self.proposal_store = Store(self.store.path)
            for proposer in self.proposers:
                if hasattr(proposer, "bind"):
                    proposer.bind(self.proposal_store, self.run_id)
        parents = self.selector.select(history, 1)
        per, promise = self.promise(history, self.cfg.screen_batch if screening else self.pool.workers)
        out: list[Candidate] = []
        for proposer in self.proposers:
            if proposer.name in skip:
                continue
            ctx = ProposalContext(self.problem, self.device, self.profile, history, parents,
                                  self.experience.get(proposer.name, []))
            share = self.room(proposer.name) if screening else per * getattr(proposer, "weight", 1)
            n = max(1, round(share * promise[proposer.name]))
            out.extend(proposer.propose(ctx, n))
        return out

    def take_proposal(self) -> None:
        """Queue the finished proposal's candidates (a proposer's exception ends the search, as it would inline)."""
        fut, self.proposing = self.proposing, None
        cands = fut.result()
        if self.start is None:
            self.start = time.monotonic()
        recorded, partial = self.asked_at
        got = {c.proposer for c in cands}
        for name in self.asked_for:
            if name not in got:
                self.dry[name] = recorded
        everyone = len(self.asked_for) == len(self.proposers)  # a partial ask's silence is its proposers' (dry)
        if cands:
            self.empty_at = None
        elif partial and everyone:
            self.empty_at = recorded  # asked before some results were in: ask again after the next one
        elif everyone and not self.queue:
            self.exhausted = True
        self.queue.extend(cands)

    def submit_next(self) -> bool | None:
        """Submit one candidate to the judge, or one batch to the screen: True when work was taken from the queue,
        None while a proposal is still being made, False when the proposers are done."""
        node = self.next_finalist()
        if node is not None:
            self.in_flight[self.pool.submit(node.candidate())] = node
            return True
        if not self.queue:
            if self.proposing is not None and self.proposing.done():
                self.take_proposal()
            if not self.queue:
                if self.exhausted:
                    return None if self.finalists else False  # backups wait for their batch's verdict
                self.ask()
                return None
        if self.screen_on():
            if self.evals_left() <= 0:
                return None  # the batches being screened will want the judge evaluations left
            return self.submit_batch()
        node = self.take()
        if isinstance(node, Node):
            self.in_flight[self.pool.submit(node.candidate())] = node
            return True
        return node

    def next_finalist(self) -> Node | None:
        """The first waiting finalist that is not a backup of one the judge is still timing (with several workers,
        a backup waits for its batch's verdict rather than going to a free worker at once); taken off the queue."""
        judging = {n.id for n in self.in_flight.values()}
        for node in self.finalists:
            if not any(node.id in self.backups.get(j, ()) for j in judging):
                self.finalists.remove(node)
                return node
        return None

    def take(self) -> Node | bool:
        """The next queued candidate as a new node of the tree; True when it was consumed without needing a worker
        (its result reused), False once the proposers only repeat themselves."""
        cand = self.queue.popleft()
        if any(n.sha == cand.sha for n in self.history):
            self.repeats += 1  # this run already holds that source
            return self.repeats < MAX_REPEATS
        self.repeats = 0
        node = self.add(cand)
        if node.result is not None:
            log.info("node %d: source already evaluated for this problem and device; reusing its result", node.id)
            self._record(node, node.result.with_baseline(self.baseline), save=False)
            return True
        return node

    def evals_left(self) -> int:
        """Judge evaluations left, less those the screen batches in flight will likely ask for."""
        return (self.cfg.max_evals - self.evaluated - len(self.in_flight) - len(self.finalists)
                - self.cfg.finalists * len(self.screening))

    def turn(self, queued: Counter[str]) -> str | None:
        """The proposer whose batch goes next: the fewest batches sent against its weight times its promise (the
        leader's is twice), so that the proposer holding the fastest kernel gets most batches and a slow one
        (Inductor's, tens of seconds a batch) gets its turn without holding the GPU from the others. A proposer
        counts if it has candidates queued or may still have some (it is not dry)."""
        _, promise = self.promise(self.history, self.cfg.screen_batch)
        best: tuple[float, int, str] | None = None
        for i, p in enumerate(self.proposers):
            if not queued[p.name] and self.dry.get(p.name) == self.recorded:
                continue
            score = (self.batches_sent[p.name] + 1) / (getattr(p, "weight", 1) * promise[p.name])
            if best is None or (score, i) < best[:2]:
                best = (score, i, p.name)
        return None if best is None else best[2]

    def submit_batch(self) -> bool | None:
        """Send the next batch to the screen. A batch holds one proposer's candidates, so that template candidates,
        compiled in seconds, do not wait on Inductor's, which take tens of seconds each; a slower proposer's batch
        (a smaller ``weight``) is smaller in proportion, which keeps each batch's wall time alike. The proposer is the
        one whose turn it is (``turn``); when it has nothing queued, it is asked first (None: waiting for it)."""
        queued = Counter(c.proposer for c in self.queue)
        head = self.turn(queued)
        if head is not None and not queued[head]:
            if self.proposing is None:
                self.ask()
            if self.proposing is not None:
                return None
        if head is None or not queued[head]:
            head = self.queue[0].proposer
        room = self.room(head)
        if self.cfg.max_screened is not None:
            room = min(room, self.cfg.max_screened - self.screened - self.screening_count())
        batch: list[Node] = []
        others: list[Candidate] = []  # other proposers' candidates, back to the queue in their order
        while self.queue and len(batch) < room:
            if self.queue[0].proposer != head:
                others.append(self.queue.popleft())
                continue
            node = self.take()
            if node is False:
                break
            if isinstance(node, Node):
                batch.append(node)
        self.queue.extendleft(reversed(others))
        if batch:
            self.batches_sent[head] += 1
            self.send_batch(batch)
            return True
        self.dry[head] = self.recorded  # only repeats of what the run holds: others go first until the next result
        return self.repeats < MAX_REPEATS

    def send_batch(self, batch: list[Node]) -> None:
        sent = time.monotonic()
        self.screening[self.pool.screen([n.candidate() for n in batch])] = (batch, sent)

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

    def _record_screen(self, nodes: list[Node], results: list[ScreenResult]) -> None:
        """Store what the screen found and send the fastest of the batch on to the judge: the first batch's best
        always, a later batch's only where the screen timed them near the fastest kernel the judge has verified."""
        unscreened = [n for n, r in zip(nodes, results) if r.harness]  # the screen's own failure: to the judge
        pairs = [(n, r) for n, r in zip(nodes, results) if not r.harness]
        self.screened += len(pairs)
        passed = [(n, r) for n, r in pairs if r.ok]
        passed.sort(key=lambda nr: math.inf if nr[1].ms is None else nr[1].ms)  # untimed last, in proposal order
        bar = self.screen_bar()
        room = max(0, self.cfg.max_evals - self.evaluated - len(self.in_flight) - len(self.finalists))
        hopeless = self.hopeless_ms()
        passed = [(n, r) for n, r in passed if r.ms is None or hopeless is None or r.ms <= hopeless]
        chosen = [n.id for n, r in passed[:min(self.cfg.finalists, room)]
                  if bar is None or r.ms is None or r.ms <= bar * (1 + FINALIST_SLACK)]
        sent = {}
        for node, result in pairs:
            finalist = node.id in chosen
            self.store.save_screen(node.id, result, finalist)
            node = replace(node, screen=result, finalist=finalist)
            self.history[self.position[node.id]] = node
            if finalist:
                sent[node.id] = node
            else:
                self.observe(node)  # the screen's word is its last
        self.finalists.extend(sent[i] for i in chosen)  # the fastest first
        for i, node_id in enumerate(chosen[:-1]):
            self.backups[node_id] = chosen[i + 1:]
        self.finalists.extend(unscreened)
        if pairs and not chosen:
            self.since_best += 1
        if pairs:
            self.recorded += 1  # the tree holds new screen times: a proposer that had nothing may have some now
        if self.on_screen:
            self.on_screen(len(pairs), len(chosen))

    def closing_round(self, reason: str) -> int:
        """Once the search has stopped (except on --max-evals or the target speedup), judge what it already knows to
        be faster than its best: finalists the screen chose that are still waiting for a worker, and the proposers'
        fallbacks whose kernel a baseline timed (torch.compile's own kernel, for the inductor proposer), each at least
        CLOSING_MARGIN under the best judged time, the fastest first, at most ``finalists`` of them. Without it a
        run stopped by its budget can return a kernel slower than one the screen had found, or than torch.compile.
        Returns how many were sent to the judge."""
        target = self.cfg.target_speedup
        if self.closed or not self.cfg.closing or reason.startswith("reached --max-evals") \
                or (target is not None and self.best_speedup() >= target):
            return 0
        self.closed = True
        room = min(self.cfg.finalists, self.cfg.max_evals - self.evaluated - len(self.in_flight))
        # a screen time is held against the best judged time and against the fastest screen time of a verified node
        # (the same clock); a baseline's time, taken the judge's way, against the best judged time alone
        screen_bar = min(self.best_ms, self.screen_bar() or math.inf) * (1 - CLOSING_MARGIN)
        known: list[tuple[float, Node | Candidate]] = [
            (n.screen.ms, n) for n in self.finalists
            if n.screen is not None and n.screen.ms is not None and n.screen.ms < screen_bar]
        known += [(ms, c) for c, ms in self.fallbacks() if ms < self.best_ms * (1 - CLOSING_MARGIN)]
        sent: set[int] = set()
        for _, item in sorted(known, key=lambda k: k[0]):
            if len(sent) >= room:
                break
            node = item if isinstance(item, Node) else self.node_for(item)
            if node is not None and node.id not in sent:
                sent.add(node.id)
                self.in_flight[self.pool.submit(node.candidate())] = node
        if sent:
            log.info("closing round: judging %d candidate(s) the screen or a baseline timed under the best (%.4g ms)",
                     len(sent), self.best_ms)
        self.finalists = deque(n for n in self.finalists if n.id not in sent)
        return len(sent)

    def fallbacks(self) -> list[tuple[Candidate, float]]:
        """(candidate, the baseline's time of its kernel) of each proposer's fallbacks not judged in this run yet."""
        out: list[tuple[Candidate, float]] = []
        if self.baseline is None:
            return out
        judged = {n.sha for n in self.history if n.result is not None}
        for p in self.proposers:
            make = getattr(p, "fallbacks", None)
            if make is None:
                continue
            try:
                cands = make(self.problem)
            except Exception as e:  # a proposer's fallback must not end the search
                log.warning("%s could not give its fallbacks: %s: %s", p.name, type(e).__name__, e)
                continue
            for cand in cands:
                timing = getattr(self.baseline, str(cand.meta.get("baseline")), None)
                if cand.sha not in judged and getattr(timing, "median_ms", None) is not None:
                    out.append((cand, timing.median_ms))
        return out

    def node_for(self, cand: Candidate) -> Node | None:
        """The node of ``cand``: the one the tree holds for its source when it has no verdict yet, else a new one."""
        busy = {n.id for n in self.in_flight.values()}
        for n in self.history:
            if n.sha == cand.sha:
                return n if n.result is None and n.id not in busy else None
        node = self.add(cand)
        if node.result is not None:  # judged for this problem and device in another run: reused as it is
            self._record(node, node.result.with_baseline(self.baseline), save=False)
            return None
        return node

    def budget_left(self) -> float | None:
        """Seconds until the time budget ends, None without one or once it has (nothing to wake up for then)."""
        if self.cfg.time_budget_s is None or self.start is None:
            return None
        left = self.start + self.cfg.time_budget_s - time.monotonic()
        return left + 0.01 if left > 0 else None

    def cancel_screens(self) -> None:
        """Stop the batches in flight: their candidates not yet screened come back as the screen's own failure and
        stay pending in the tree (a resumed run screens them)."""
        self.cancelled = True
        cancel = getattr(self.pool, "cancel_screens", None)
        if cancel is not None:
            log.info("the search stopped with %d screen batch(es) in flight: cancelling them", len(self.screening))
            cancel()

    def hopeless_ms(self) -> float | None:
        """A screen time past which a candidate is not worth judging: HOPELESS times the faster baseline (eager or
        torch.compile, by the judge). The clocks differ by a few percent, the factor by far more."""
        times = [t.median_ms for t in (self.baseline.eager, self.baseline.compiled) if t is not None] \
            if self.baseline is not None else []
        return HOPELESS * min(times) if times else None

    def screen_bar(self) -> float | None:
        """The fastest screen time among the nodes the judge verified (None before the first)."""
        times = [n.screen.ms for n in self.history if n.ok and n.screen is not None and n.screen.ms is not None]
        return min(times) if times else None

    def add(self, cand: Candidate) -> Node:
        """Store ``cand`` as a node of the run and append it to the tree in memory."""
        node = self.store.add_node(self.run_id, self.problem.sha, self.device_key, cand)
        self.position[node.id] = len(self.history)
        self.history.append(node)
        return node

    def _record(self, node: Node, result: Result, save: bool = True) -> None:
        self.recorded += 1
        result = result.flag_suspect(self.floor_ms)
        if save:
            self.store.save_result(node.id, result)
            self.evaluated += 1
            self.history[self.position[node.id]] = replace(node, result=result)  # as the store now holds it
        self.observe(self.history[self.position[node.id]] if node.id in self.position else node)
        if result.ok and result.timed and result.runtime_ms is not None and result.runtime_ms < self.best_ms:
            self.best_ms, self.since_best = result.runtime_ms, 0
        elif save:
            self.since_best += 1
        self.drop_backups(node, result)
        if self.on_result:
            self.on_result(node, result)

    def drop_backups(self, node: Node, result: Result) -> None:
        """Once the judge has timed a finalist within ``backup_agree`` of what its screen time predicts, the screen
        ranked its batch right: the batch's finalists still waiting behind it, slower on the screen, are not judged
        (their screen result is their last word). A finalist that failed the judge, or whose times disagree, leaves
        them waiting. The prediction is the screen time times the run's usual ratio of the two (judge_ratio): on some
        kernels the judge's longer timing is steadily slower for every candidate alike (a GPU's power cap lowering
        its clock), which leaves the screen's ranking right."""
        later = self.backups.pop(node.id, None)
        agree = self.cfg.backup_agree
        screen_ms = node.screen.ms if node.screen is not None else None
        if not later or agree is None or not (result.ok and result.timed) or result.runtime_ms is None \
                or not screen_ms or abs(result.runtime_ms / (screen_ms * self.judge_ratio(node.id)) - 1) > agree:
            return
        waiting = {n.id: n for n in self.finalists if n.id in later}
        if not waiting:
            return
        self.finalists = deque(n for n in self.finalists if n.id not in waiting)
        for node_id, backup in waiting.items():
            self.backups.pop(node_id, None)
            # a backup is one of its batch's screened finalists: it has a screen result
            screen = replace(backup.screen, details={**backup.screen.details, "backup": "not judged"})
            self.store.drop_finalist(node_id, screen)
            backup = replace(backup, finalist=False, screen=screen)
            self.history[self.position[node_id]] = backup
            self.observe(backup)
        log.info("node %d: judged at %.4g ms against %.4g ms on the screen; %d backup finalist(s) of its batch not "
                 "judged", node.id, result.runtime_ms, screen_ms, len(waiting))

    def judge_ratio(self, leave_out: int) -> float:
        """The median ratio of the judge's time to the screen's over the run's verified nodes other than
        ``leave_out``, once there are RATIO_PAIRS of them; 1 before."""
        ratios = [n.runtime_ms / n.screen.ms for n in self.history
                  if n.id != leave_out and n.runtime_ms is not None and n.screen is not None and n.screen.ms]
        return statistics.median(ratios) if len(ratios) >= RATIO_PAIRS else 1.0

    def seed_known(self) -> None:
        """Start a fresh run from the fastest kernels already verified for this problem on this device model (a
        baseline stored beside the run, or an earlier run's winners). They cost no evaluation, and the run can then
        never return something slower than what is already known."""
        held = {n.sha for n in self.history}
        for known in self.store.fastest_known(self.problem.sha, self.device_key, KNOWN_SEEDS):
            if hashlib.sha256(known.source.encode()).hexdigest() in held:  # a start kernel of this run, say
                continue
            # what made it that run's (its call and reply file, its start-file role) stays with that run
            meta = {k: v for k, v in known.meta.items() if k not in ("llm_call", "reply", "start", "root")}
            cand = Candidate(known.source, proposer=known.proposer, language=known.language,
                             meta={**meta, "reused": True})
            node = self.add(cand)
            if node.result is not None:
                log.info("node %d: reusing a kernel already verified for this problem and device (%.4g ms)", node.id,
                         known.runtime_ms)
                self._record(node, node.result.with_baseline(self.baseline), save=False)

    def resume_pending(self) -> None:
        """Take up what a killed run left pending: its finalists go to the judge, the nodes it had not screened yet
        to the screen again (to the judge when the screen is off)."""
        pending = [n for n in self.history if n.result is None and not n.screened_out]
        if self.screen_on():
            self.finalists.extend(n for n in pending if n.finalist)
            fresh = [n for n in pending if not n.finalist]
            for i in range(0, len(fresh), self.cfg.screen_batch):
                self.send_batch(fresh[i:i + self.cfg.screen_batch])
            return
        for node in pending:
            self.in_flight[self.pool.submit(node.candidate())] = node

    def run(self) -> SearchOutcome:
        try:
            return self._run()
        finally:
            if self.proposing is not None:
                self.proposing.cancel()  # a proposal already running ends on its own; its candidates are dropped
            self.proposal_thread.submit(self._close_proposal_store)  # on the thread that owns the connection
            self.proposal_thread.shutdown(wait=False)

    def harvest(self) -> int:
        """Record the evaluations that have already finished, without waiting; how many there were."""
        done = [fut for fut in self.in_flight if fut.done()]
        for fut in done:
            self._record(self.in_flight.pop(fut), fut.result().with_baseline(self.baseline))
        return len(done)

    def _close_proposal_store(self) -> None:
        if self.proposal_store is not None:
            self.proposal_store.close()

    def _run(self) -> SearchOutcome:
        if all(n.meta.get("start") for n in self.history):  # a fresh run (its start kernels are judged already)
            self.seed_known()
        self.resume_pending()
        warm = getattr(self.pool, "warm_screens", None)
        if warm is not None and self.screen_on() and not (self.in_flight or self.screening or self.finalists) \
                and self.stop_reason() is None:
            warm(self.cfg.screen_batch)  # the screen's processes start while the first proposal is made (no judge
            # is timing yet)
        reason = None
        while True:
            waiting = False
            while reason is None and self.busy() < self.pool.workers:
                reason = self.stop_reason()
                if reason is None:
                    submitted = self.submit_next()
                    if submitted is None:
                        waiting = True
                        break
                    if not submitted:
                        reason = self.stop_reason() or self.nothing_left()
            if reason is None and not waiting and self.harvest():
                continue  # results already in: take them before proposing from the tree
            if reason is not None and not self.closed and not self.screening and not self.in_flight:
                self.closing_round(reason)  # once the best is final (every evaluation and screen in or cancelled)
            if reason is None and self.cfg.pipeline and not self.queue and self.busy() \
                    and self.stop_reason() is None:
                self.ask()  # every worker is busy and nothing is queued: propose while they run
            pending = list(self.in_flight) + list(self.screening) + (
                [self.proposing] if self.proposing and (waiting or not reason) else [])
            if not self.busy() and (reason is not None or not pending):
                break
            if self.screening and not self.cancelled and self.stop_reason() is not None:
                self.cancel_screens()  # the search is over: a batch still compiling would only delay the answer
            done, _ = wait(pending, timeout=self.budget_left() if self.screening and not self.cancelled else None,
                           return_when=FIRST_COMPLETED)
            for fut in done:
                if fut is self.proposing:
                    self.take_proposal()
                elif fut in self.screening:
                    batch, sent = self.screening.pop(fut)
                    self.screen_s += time.monotonic() - sent
                    self._record_screen(batch, self._screened(fut, batch))
                else:
                    node = self.in_flight.pop(fut)
                    self._record(node, fut.result().with_baseline(self.baseline))
        best, why = best_node(self.history)
        first = None if self.start is None else round(self.start - self.began, 3)
        return SearchOutcome(reason or "stopped", self.evaluated, best, why, first, self.screened)


def run_search(store: Store, run_id: int, problem: Problem, device: str, device_key: str, pool: Any,
               proposers: list[Proposer], selector: Selector, cfg: SearchConfig, baseline: Baseline | None,
               profile: Profile | None = None, on_result: OnResult | None = None,
               on_screen: OnScreen | None = None) -> SearchOutcome:
    """Search until a stop condition holds. Every result is committed as it arrives, so a killed run resumes."""
    return _Loop(store, run_id, problem, device, device_key, pool, proposers, selector, cfg, baseline, profile,
                 on_result, on_screen).run()
