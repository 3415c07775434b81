"""The screen batches in flight: each sent with the time it left, taken back with one result per candidate, and
cancelled when the search stops."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future

from kernelevolve.evaluate.result import ScreenResult, Status
from kernelevolve.rows import Node
from kernelevolve.search.protocols import Cancelling, Pool, Screen, Warming
from kernelevolve.search.state import SearchState

log = logging.getLogger(__name__)


class Batches:
    def __init__(self, pool: Pool, state: SearchState):
        self.screen: Screen | None = pool if isinstance(pool, Screen) else None
        self.pool, self.state = pool, state
        self.flying: dict[Future[list[ScreenResult]], tuple[list[Node], float]] = {}  # batch, when sent

    def send(self, batch: list[Node]) -> None:
        assert self.screen is not None  # sent only while policy.screen_on
        sent = time.monotonic()
        self.flying[self.screen.screen([n.candidate() for n in batch])] = (batch, sent)
        self.state.batches.append(len(batch))

    def take(self, fut: Future[list[ScreenResult]]) -> tuple[list[tuple[Node, ScreenResult]], list[Node]]:
        """A finished batch: (each node the screen screened, with its result; the nodes the screen failed to screen,
        which go to the judge)."""
        nodes, sent = self.flying.pop(fut)
        self.state.batches.remove(len(nodes))
        self.state.screen_s += time.monotonic() - sent
        results = self._results(fut, nodes)
        pairs = list(zip(nodes, results))
        return [(n, r) for n, r in pairs if not r.harness], [n for n, r in pairs if r.harness]

    def _results(self, fut: Future[list[ScreenResult]], nodes: list[Node]) -> list[ScreenResult]:
        """One result per node; a batch whose screen failed as a whole was not screened."""
        if fut.cancelled():  # by cancel(), before it started
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

    def warm(self, batch: int) -> None:
        """Start the screen's processes while the first proposal is made (no judge is timing yet)."""
        if isinstance(self.pool, Warming):
            self.pool.warm_screens(batch)

    def cancel(self) -> None:
        """Stop the batches in flight: their candidates not yet screened come back as the screen's own failure and
        stay pending in the tree (a resumed run screens them)."""
        self.state.cancelled = True
        if isinstance(self.pool, Cancelling):
            log.info("the search stopped with %d screen batch(es) in flight: cancelling them", len(self.flying))
            self.pool.cancel_screens()
