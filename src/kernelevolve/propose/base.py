"""The proposer seam: a small Protocol and the context every proposer receives."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kernelevolve.candidate import Candidate
from kernelevolve.problem import Problem
from kernelevolve.rows import Experience, Node

if TYPE_CHECKING:
    from kernelevolve.profile import Profile


class ProposerError(Exception):
    pass


@dataclass(frozen=True)
class ProposalContext:
    problem: Problem
    device: str
    profile: Profile | None
    history: list[Node]  # the run's nodes so far, oldest first
    parents: list[Node] = field(default_factory=list)  # nodes the selector chose to expand
    # earlier runs' winners on this device model, most similar problems first
    experience: list[Experience] = field(default_factory=list)


class Proposer(Protocol):
    name: str  # an optional ``weight`` attribute (default 1) scales how many candidates it is asked for per refill
    # An optional ``fallbacks(problem) -> list[Candidate]``: candidates whose kernel a baseline timed, each naming the
    # Baseline field in meta["baseline"]; a search that stops with a slower best judges them (its closing round).
    # It is called on the search's thread while a proposal may be running on the proposal thread: keep it stateless.

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        """Up to ``n`` new candidates; an empty list means this proposer has nothing left to try."""
        ...
