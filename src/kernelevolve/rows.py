"""The store's rows as the code passes them around: runs, the nodes of their search trees, earlier winners, and what
is read off them. The store parses every JSON column once, into these; nothing past it indexes a row by string."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Sequence

from kernelevolve.candidate import Candidate, Meta
from kernelevolve.evaluate.headtohead import HeadToHead
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult

if TYPE_CHECKING:  # profile.py sits above this module (it runs the reference); only its type is needed here
    from kernelevolve.profile import Profile


@dataclass(frozen=True)
class Node:
    """One node of a run's search tree, joined with its candidate and, once judged, its result."""

    id: int
    run_id: int
    parent: int | None  # node id of the same run
    proposer: str
    meta: Meta
    cached: bool  # the source already had a result for this problem and device when added: that result is reused
    created: str
    candidate_id: int
    sha: str
    source: str
    language: str
    result: Result | None  # None while pending, or when the screen did not send it on to the judge
    screen: ScreenResult | None = None  # what the screen found, where it screened this node
    finalist: bool = False  # the screen sent it on to the judge

    @property
    def screened_out(self) -> bool:
        """Screened, not sent on to the judge, and never judged: done with, not pending."""
        return self.screen is not None and not self.finalist and self.result is None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def failed(self) -> bool:
        """Judged, and not verified (pending is neither ok nor failed)."""
        return self.result is not None and not self.result.ok

    @property
    def runtime_ms(self) -> float | None:
        """The run time when the node was verified and timed, else None: the one time that ranks nodes."""
        r = self.result
        return r.runtime_ms if r is not None and r.ok and r.timed else None

    @property
    def label(self) -> str | None:
        return self.meta.get("label")

    def candidate(self) -> Candidate:
        """The candidate this node holds, to evaluate it again (a pending node of a resumed run)."""
        return Candidate(self.source, proposer=self.proposer, language=self.language, parent=self.parent,
                         meta=self.meta)


def fastest_timed(nodes: Sequence[Node]) -> list[Node]:
    """The verified, timed nodes, fastest first (ties in creation order)."""
    return sorted((n for n in nodes if n.runtime_ms is not None), key=attrgetter("runtime_ms"))


def best_node(history: Sequence[Node]) -> tuple[Node | None, str]:
    """The fastest timed ok node; else the first verified one; with the reason for the choice."""
    timed = fastest_timed(history)
    if timed:
        return timed[0], "fastest timed candidate"
    verified = [n for n in history if n.ok]
    if verified:
        return verified[0], "best verified candidate (no candidate was timed)"
    return None, "no candidate was verified"


@dataclass(frozen=True)
class Run:
    id: int
    problem_sha: str
    device: str
    device_key: str
    config: dict[str, Any]  # OptimizeConfig.to_dict()
    status: str
    created: str
    finished: str | None
    profile: Profile | None
    baseline: Baseline | None
    versions: dict[str, Any]  # empty when not recorded
    stop_reason: str | None
    phases: dict[str, float]  # seconds: profile_s, baseline_s, search_s, first_proposal_s; empty when not recorded
    head_to_head: HeadToHead | None = None  # the winner against the baselines, before the run answered


@dataclass(frozen=True)
class RunSummary:
    """A line of the run listing."""

    id: int
    name: str  # the problem's
    problem_sha: str
    device: str
    device_key: str
    status: str
    created: str
    finished: str | None
    stop_reason: str | None
    n_nodes: int
    screened: int = 0  # nodes the screen checked
    evaluated: int = 0  # nodes the judge evaluated (results reused from earlier runs not counted)


@dataclass(frozen=True)
class StoredProblem:
    """A problem file exactly as a run saw it."""

    sha: str
    name: str
    path: str
    source: str
    created: str


@dataclass(frozen=True)
class Experience:
    """An earlier run's winner for one proposer on a device model, with what describes its problem."""

    run_id: int
    proposer: str
    strategy: str | None
    meta: Meta
    ms: float
    speedup_eager: float | None
    problem_sha: str
    problem: str  # the problem's name
    families: list[str]
    dtype: str | None
    bytes: float | None
    size_bucket: int | None  # round(log2(bytes))
    source: str


@dataclass(frozen=True)
class Approval:
    """Who approved which source (by its sha256) of a run's node for export, when and why."""

    id: int
    run_id: int
    node_id: int
    candidate_sha: str
    approved_by: str
    note: str
    created: str


@dataclass(frozen=True)
class KnownKernel:
    """A verified, timed candidate of a problem on a device model, with the proposer and meta of its first node."""

    candidate_id: int
    source: str
    language: str
    runtime_ms: float
    proposer: str
    meta: Meta
