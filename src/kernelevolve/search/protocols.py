"""The seams of the search: what it asks of proposers, of the judge's worker pool and of the screen. A capability
that only some of them have is a Protocol of its own, checked with ``isinstance`` where the search uses it."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, Sequence, runtime_checkable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import HeadToHead
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult
from kernelevolve.problem import Problem
from kernelevolve.propose.base import Proposer
from kernelevolve.rows import Node
from kernelevolve.store import Store

__all__ = ["Cancelling", "Judge", "Observing", "Pool", "Proposer", "Recording", "RunPool", "Screen", "Stopping", "Warming",
           "WithExamples", "WithFallbacks", "Weighted", "examples_from_any", "weight"]


class Judge(Protocol):
    def submit(self, candidate: Candidate) -> Future[Result]:
        """Start the full evaluation of ``candidate``."""
        ...


class Pool(Judge, Protocol):
    workers: int  # evaluations it runs at once


class RunPool(Pool, Protocol):
    """What a whole run asks of the pool beyond the search's part: the baselines, the closing head to head, the end."""

    def baseline(self, compiled: bool = True) -> Baseline:
        """Time the reference in eager (and under torch.compile when ``compiled``)."""
        ...

    def head_to_head(self, candidate: Candidate, sides: Sequence[str]) -> HeadToHead:
        """Time ``candidate`` against the named baselines in interleaved rounds."""
        ...

    def shutdown(self, wait: bool = True) -> None:
        """Stop its workers."""
        ...


@runtime_checkable
class Screen(Protocol):
    def screen(self, candidates: list[Candidate]) -> Future[list[ScreenResult]]:
        """Check each candidate once and time it briefly, in one batch."""
        ...


@runtime_checkable
class Warming(Protocol):
    def warm_screens(self, batch: int) -> None:
        """Start the screen's processes before the first batch comes."""
        ...


@runtime_checkable
class Cancelling(Protocol):
    def cancel_screens(self) -> None:
        """End the batches being screened: their candidates come back as the screen's own failure."""
        ...


@runtime_checkable
class Weighted(Protocol):
    weight: int  # scales how many candidates it is asked for, and its screen batches


@runtime_checkable
class WithExamples(Protocol):
    examples_from_any: bool  # handed earlier winners of every proposer, not only its own


@runtime_checkable
class Observing(Protocol):
    def observe(self, node: Node) -> None:
        """Take the verdict of one of its candidates (the judge's, or the screen's last word)."""
        ...


@runtime_checkable
class Recording(Protocol):
    def bind(self, store: Store, run_id: int) -> None:
        """Where it records its calls: a connection of the thread that proposals run on."""
        ...


@runtime_checkable
class Stopping(Protocol):
    stopped: str  # why it proposes no more, once it does not


@runtime_checkable
class WithFallbacks(Protocol):
    def fallbacks(self, problem: Problem) -> list[Candidate]:
        """Candidates whose kernel a baseline timed, each naming the Baseline field in meta["baseline"]. Called on
        the search's thread while a proposal may be running: stateless."""
        ...


def weight(proposer: Proposer) -> int:
    return proposer.weight if isinstance(proposer, Weighted) else 1


def examples_from_any(proposer: Proposer) -> bool:
    return isinstance(proposer, WithExamples) and proposer.examples_from_any
