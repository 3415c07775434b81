"""What the search is configured with, what it knows between two decisions, and how it ended."""
from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum

from kernelevolve.candidate import Candidate
from kernelevolve.rows import Node
from kernelevolve.settings import DEFAULTS

# Proposals in a row that repeat a source the run already holds, after which the proposers count as exhausted.
MAX_REPEATS = 100
# Already-verified kernels of the same problem and device model that a fresh run starts from.
KNOWN_SEEDS = 3
# A finalist of a later batch goes on to the judge only when the screen timed it within this fraction of the
# fastest screen time among the nodes the judge has verified: the screen's and the judge's timings differ, so
# screen times are compared with screen times.
FINALIST_SLACK = 0.05
# Verified nodes with a screen time the run needs before a backup finalist's agreement is held against their median
# ratio of judge to screen time rather than against 1 (see policy.screen_agrees).
RATIO_PAIRS = 2
# A candidate the screen timed at more than this many times the faster baseline is never sent on to the judge.
HOPELESS = 3.0
# The closing round judges a waiting finalist or a proposer's fallback only when its screen or baseline time is at
# least this fraction under the best judged time: screen and judge agree to a fraction of this on a GPU.
CLOSING_MARGIN = 0.02


@dataclass(frozen=True)
class SearchConfig:
    max_evals: int = DEFAULTS.max_evals
    time_budget_s: float | None = None  # counted from the first proposal, so that it buys evaluations
    target_speedup: float | None = None  # against eager
    stall: int | None = DEFAULTS.stall  # evaluations without a new best (a screen batch that sends none on counts as one)
    pipeline: bool = True  # ask for the next batch while every worker is busy, rather than when one is free
    # The screen (evaluate/screen.py): candidates are checked once and timed briefly in batches of this many, and only
    # the fastest ``finalists`` of a batch go on to the judge; 0 judges every candidate. Past ``max_screened`` screened
    # candidates, the rest are judged directly.
    screen_batch: int = 0
    finalists: int = DEFAULTS.finalists
    # A batch's finalists after its fastest are backups: judged only if an earlier one failed the judge or was timed
    # there more than this fraction off what its screen time predicts (the screen's ranking then in doubt; see
    # policy.screen_agrees); None judges them all.
    backup_agree: float | None = DEFAULTS.backup_agree
    max_screened: int | None = DEFAULTS.max_screened
    screen_share: float = DEFAULTS.screen_share  # of --time-budget, at most, spent screening; the rest is the judge's
    # After the budget (or a stall, or the proposers' end): judge what is already known to beat the best, at most
    # ``finalists`` evaluations (see policy.closing_picks)
    closing: bool = DEFAULTS.closing


@dataclass(frozen=True)
class SearchOutcome:
    stop_reason: str
    evaluations: int
    best: Node | None
    best_why: str
    first_proposal_s: float | None = None  # from the start of the search to the first candidates in hand
    screened: int = 0


class Stop(Enum):
    """Why a search stops."""
    MAX_EVALS = "max_evals"
    TIME_BUDGET = "time_budget"
    TARGET = "target"
    STALL = "stall"
    EXHAUSTED = "exhausted"  # no proposer has anything more


class Step(Enum):
    """What one attempt to hand work to a free worker did."""
    TOOK = "took"  # took work from the queue: to the judge or the screen, or used up without a worker (a repeat, a
    # reused result)
    WAIT = "wait"  # nothing to send until a proposal, a screen batch or a verdict comes back
    DONE = "done"  # the proposers have nothing more


@dataclass
class SearchState:
    """The counts and decisions a search carries from one step to the next. The driver records what it sends and
    what comes back; the policy's functions (policy.py, turns.py) read it and write their decisions into it."""
    evaluated: int = 0  # judged in this run
    screened: int = 0
    judging: list[int] = field(default_factory=list)  # ids of the nodes at the judge, one per evaluation in flight
    batches: list[int] = field(default_factory=list)  # the size of each screen batch in flight
    finalists: deque[Node] = field(default_factory=deque)  # sent on by the screen, waiting for a worker
    backups: dict[int, list[int]] = field(default_factory=dict)  # a finalist's id -> its batch's finalists after it
    queue: deque[Candidate] = field(default_factory=deque)  # proposed, not yet sent to a worker
    recorded: int = 0  # results taken into the tree so far (evaluated, reused, or a screened batch)
    screen_s: float = 0.0  # spent screening (batch wall times, summed over batches)
    best_ms: float = math.inf
    since_best: int = 0
    repeats: int = 0
    start: float | None = None  # the budget's clock: set when the first candidates are in hand
    exhausted: bool = False
    closed: bool = False  # the closing round was held
    cancelled: bool = False  # the batches in flight were cancelled when the search stopped
    asked_at: tuple[int, bool] = (0, False)  # (recorded, whether evaluations were in flight) at the last ask
    asked_for: list[str] = field(default_factory=list)  # the proposers the last ask went to
    # per proposer: ``recorded`` when an ask it was part of gave nothing of its own (dry until the next result)
    dry: dict[str, int] = field(default_factory=dict)
    batches_sent: Counter[str] = field(default_factory=Counter)  # screen batches sent, per proposer
    empty_at: int | None = None  # ``recorded`` when an ask made before some results came back empty

    @property
    def busy(self) -> int:
        return len(self.judging) + len(self.batches)

    @property
    def screening(self) -> int:
        """Candidates in the screen batches in flight."""
        return sum(self.batches)
