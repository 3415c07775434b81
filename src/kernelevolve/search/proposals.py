"""The proposers' side of the search: asks made on a thread of their own, answers taken into the queue, verdicts and
fallbacks passed between the proposers and the search."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline
from kernelevolve.problem import Problem
from kernelevolve.propose.base import ProposalContext
from kernelevolve.rows import Node
from kernelevolve.search import policy, turns
from kernelevolve.search.protocols import (Observing, Proposer, Recording, Stopping, WithFallbacks, examples_from_any,
                                           weight)
from kernelevolve.search.select import Selector
from kernelevolve.search.state import SearchConfig, SearchState
from kernelevolve.store import Store

if TYPE_CHECKING:
    from kernelevolve.profile import Profile

log = logging.getLogger(__name__)


class Proposals:
    def __init__(self, store: Store, run_id: int, problem: Problem, device: str, device_key: str,
                 profile: Profile | None, proposers: list[Proposer], selector: Selector, cfg: SearchConfig,
                 state: SearchState):
        self.store, self.run_id, self.problem, self.device, self.profile = store, run_id, problem, device, profile
        self.proposers, self.selector, self.cfg, self.state = proposers, selector, cfg, state
        self.seats = [(p.name, weight(p)) for p in proposers]
        # Proposers run on one thread of their own; those that record their calls (language models) write through
        # a connection opened on that thread (a sqlite3 connection belongs to the thread that made it).
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelevolve-propose")
        self.future: Future[list[Candidate]] | None = None  # the proposal being made
        self.recording: Store | None = None
        self.experience = {p.name: turns.rank_experience(store.experience(
            device_key, None if examples_from_any(p) else p.name, exclude_run=run_id), profile)
            for p in proposers}

    @property
    def asking(self) -> bool:
        return self.future is not None

    def ask(self, history: list[Node], screening: bool, workers: int) -> None:
        """Start the next proposal on the proposal thread, from a snapshot of the tree as it stands (turns.may_ask,
        turns.whom_to_ask)."""
        if self.future is not None or not turns.may_ask(self.state):
            return
        asked = turns.whom_to_ask(self.state, self.seats, screening)
        if not asked:
            return
        self.state.asked_at, self.state.asked_for = (self.state.recorded, bool(self.state.busy)), asked
        self.future = self.thread.submit(self.propose, list(history), set(asked), screening, workers)

    def propose(self, history: list[Node], asked: set[str], screening: bool, workers: int) -> list[Candidate]:
        if self.recording is None and any(isinstance(p, Recording) for p in self.proposers):
            self.recording = Store(self.store.path)
            for proposer in self.proposers:
                if isinstance(proposer, Recording):
                    proposer.bind(self.recording, self.run_id)
        parents = self.selector.select(history, 1)
        sizes = turns.ask_sizes(self.cfg, self.seats, history, self.cfg.screen_batch if screening else workers,
                                 screening)
        out: list[Candidate] = []
        for proposer, n in zip(self.proposers, sizes):
            if proposer.name not in asked:
                continue
            ctx = ProposalContext(self.problem, self.device, self.profile, history, parents,
                                  self.experience.get(proposer.name, []))
            out.extend(proposer.propose(ctx, n))
        return out

    def take(self) -> None:
        """Queue the finished proposal's candidates (a proposer's exception ends the search, as it would inline)."""
        assert self.future is not None
        fut, self.future = self.future, None
        cands = fut.result()
        if self.state.start is None:
            self.state.start = time.monotonic()
        turns.take_proposal(self.state, cands, len(self.proposers))

    def take_if_done(self) -> None:
        if self.future is not None and self.future.done():
            self.take()

    def observe(self, node: Node) -> None:
        """Tell the proposer of ``node`` that its verdict (the judge's, or the screen's last word) is in."""
        for p in self.proposers:
            if p.name == node.proposer and isinstance(p, Observing):
                try:
                    p.observe(node)
                except Exception as e:  # a proposer's note-taking must not end the search
                    log.warning("%s could not take the verdict of node %d: %s: %s", p.name, node.id,
                                type(e).__name__, e)

    def fallbacks(self, baseline: Baseline | None, judged: set[str]) -> list[tuple[Candidate, float]]:
        """(candidate, the baseline's time of its kernel) of each proposer's fallbacks whose source is not in
        ``judged``."""
        out: list[tuple[Candidate, float]] = []
        if baseline is None:
            return out
        for p in self.proposers:
            if not isinstance(p, WithFallbacks):
                continue
            try:
                cands = p.fallbacks(self.problem)
            except Exception as e:  # a proposer's fallback must not end the search
                log.warning("%s could not give its fallbacks: %s: %s", p.name, type(e).__name__, e)
                continue
            for cand in cands:
                ms = policy.baseline_ms(baseline, cand.meta.get("baseline"))
                if cand.sha not in judged and ms is not None:
                    out.append((cand, ms))
        return out

    def why_stopped(self) -> list[str]:
        """What the proposers that stopped said."""
        return [f"{p.name}: {p.stopped}" for p in self.proposers if isinstance(p, Stopping) and p.stopped]

    def close(self) -> None:
        if self.future is not None:
            self.future.cancel()  # a proposal already running ends on its own; its candidates are dropped
        self.thread.submit(self._close_recording)  # on the thread that owns the connection
        self.thread.shutdown(wait=False)

    def _close_recording(self) -> None:
        if self.recording is not None:
            self.recording.close()
