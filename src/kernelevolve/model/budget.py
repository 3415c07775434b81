"""One budget for a whole model, shared across its problems where Amdahl says.

A problem's claim is the time a kernel could still save: its regions' time in the model less their roofline floor.
Problems under ``min_share`` of the model's time are left alone (a perfect kernel there gains the model less than
that), and so is any problem whose share of the budget would fall under ``min_budget_s`` (too short for one
search): its share goes to the others, smallest claim first.

The budget is wall time for the whole run: the plan, every problem's whole run and judging the whole come out of
it, not only the searches. Judging the whole is estimated (``closing_s``) and kept back before the problems share the
rest. A problem's run spends ``overhead_s`` beyond its search (its baselines, its head-to-head, processes that start
and load), so each problem that runs costs its share plus that; ``Pacer`` shares what is left again as each run
starts, with the overhead the finished runs measured.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

MIN_SHARE = 0.02  # of the model's time
MIN_BUDGET_S = 15.0  # a search shorter than this rarely gets past the baselines
# What a problem's run spends beyond its search before any run has finished, by device: timing the baselines
# (loads, torch.compile builds) and the head-to-head. On a GPU from twelve suite runs at a 20 s budget on the H200
# (baselines 11-19 s, head-to-heads 22-44 s; run time less budget 38-77 s, median 51 s) and a region of DLRM on an
# H100, whose run without a head-to-head took 29 s beyond its 50 s search (its problem file loads the model's 2.1 GB
# of weights); on the CPU from two region runs of a small DCN-v2 on two cores (baselines 11 s, head-to-heads 44 and
# 71 s).
BASELINE_S = {"cuda": 25.0, "cpu": 12.0}
HEAD_TO_HEAD_S = {"cuda": 35.0, "cpu": 50.0}


# What judging the whole takes after the problems' runs, kept back from the budget before it is shared: a verdict on
# each host's composition, and with the head-to-head the whole model's torch.compile and max-autotune builds and the
# rounds themselves. On a GPU from DLRM on an H100 (two hosts, one kernel: the verdicts 22 s each, the whole model
# timed in eager and under torch.compile 37 s, the head-to-head with max-autotune's build 106 s; 206 s in all with
# the closing profile); on the CPU from the six small bench/models on two cores (0-70 s).
JUDGE_WHOLE_S = {"cuda": 25.0, "cpu": 10.0}  # a host's composition
WHOLE_BUILDS_S = {"cuda": 110.0, "cpu": 20.0}  # the whole model's torch.compile and max-autotune builds, timed


def closing_s(device: str, hosts: int, head_to_head: bool = True) -> float:
    """The first estimate of judging the whole: its share of the budget, kept back from the problems."""
    dev = device if device in JUDGE_WHOLE_S else "cpu"
    rest = WHOLE_BUILDS_S[dev] + HEAD_TO_HEAD_S[dev] if head_to_head else 0.0
    return JUDGE_WHOLE_S[dev] * max(hosts, 1) + rest


def run_overhead_s(device: str, head_to_head: bool = True) -> float:
    """The first estimate of a problem's run beyond its search."""
    dev = device if device in BASELINE_S else "cpu"
    return BASELINE_S[dev] + (HEAD_TO_HEAD_S[dev] if head_to_head else 0.0)


@dataclass(frozen=True)
class Claim:
    name: str
    ms: float  # the problem's regions' time in one call of the model (all instances)
    floor_ms: float | None = None  # their roofline floor, where known


@dataclass(frozen=True)
class Share:
    name: str
    budget_s: float  # 0 where left alone
    claim_ms: float  # time a kernel could save
    why: str  # one line: the share, or why it is left alone


def saving(c: Claim) -> float:
    """What a kernel at the floor would save; half the time where the floor is unknown."""
    floor = c.ms / 2 if c.floor_ms is None else min(c.floor_ms, c.ms)
    return max(c.ms - floor, 0.0)


def allocate(claims: list[Claim], total_ms: float, budget_s: float, min_share: float = MIN_SHARE,
             min_budget_s: float = MIN_BUDGET_S, overhead_s: float = 0.0) -> list[Share]:
    """Each problem's search budget, in the order given: ``budget_s`` less ``overhead_s`` for each problem that
    runs, shared by claim."""
    why: dict[str, str] = {}
    live = []
    for c in claims:
        share = c.ms / total_ms if total_ms > 0 else 0.0
        if share < min_share:
            why[c.name] = f"left alone: {share:.1%} of the model's time (under {min_share:.0%})"
        elif saving(c) <= 0:
            why[c.name] = "left alone: already at its roofline floor"
        else:
            live.append(c)
    beside = f", beside about {overhead_s:.0f} s a run spends beyond its search (baselines, loads)" if overhead_s else ""
    while live:
        budgets = _shares(live, budget_s - overhead_s * len(live))
        short = [c for c in live if budgets[c.name] < min_budget_s]
        if not short:
            break
        drop = min(short, key=saving)
        why[drop.name] = f"left alone: its share of the budget ({max(budgets[drop.name], 0):.0f} s) is under " \
                         f"{min_budget_s:.0f} s{beside}"
        live.remove(drop)
    budgets = _shares(live, budget_s - overhead_s * len(live)) if live else {}
    out = []
    for c in claims:
        b = budgets.get(c.name, 0.0)
        line = why.get(c.name) or (f"{b:.0f} s: {c.ms / total_ms:.1%} of the model's time, "
                                   f"{saving(c):.3f} ms to save")
        out.append(Share(c.name, b, saving(c), line))
    return out


def _shares(live: list[Claim], seconds: float) -> dict[str, float]:
    weight = sum(saving(c) for c in live)
    return {c.name: seconds * saving(c) / weight for c in live}


@dataclass
class Pacer:
    """The model's budget, shared again as each problem's run starts: what is left before ``deadline`` (a
    ``clock`` time), over the lanes that run at once, less what the runs under way still hold, among the problems
    not started yet, each less the overhead the finished runs measured (``overhead_s`` before any has finished).
    ``claims`` are the problems that the plan gave a share, in the order they run."""
    claims: list[Claim]
    total_ms: float
    deadline: float
    overhead_s: float
    lanes: int = 1
    min_budget_s: float = MIN_BUDGET_S
    clock: Callable[[], float] = time.monotonic
    measured: list[float] = field(default_factory=list)  # each finished run's time beyond its search budget
    running: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (started, search budget)
    started: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def overhead(self) -> float:
        return statistics.median(self.measured) if self.measured else self.overhead_s

    def start(self, name: str) -> Share:
        """The search budget of ``name``'s run, starting now (0, and why, where the budget has run out)."""
        with self.lock:
            now, overhead = self.clock(), self.overhead()
            held = sum(max(0.0, t0 + b + overhead - now) for t0, b in self.running.values())
            seconds = (self.deadline - now) * self.lanes - held
            left = [c for c in self.claims if c.name not in self.started]
            share = next(s for s in allocate(left, self.total_ms, seconds, 0.0, self.min_budget_s, overhead)
                         if s.name == name)
            self.started.add(name)
            if share.budget_s <= 0:
                why = f"left alone: the model's budget ran out ({max(self.deadline - now, 0):.0f} s left, about " \
                      f"{overhead:.0f} s a run beyond its search)"
                return Share(name, 0.0, share.claim_ms, why)
            self.running[name] = (now, share.budget_s)
            return share

    def finish(self, name: str, search_s: float | None = None) -> None:
        """``name``'s run has ended: its time beyond its search (``search_s`` where the run says how long it
        searched, else its budget) is measured."""
        with self.lock:
            if name in self.running:
                t0, budget = self.running.pop(name)
                self.measured.append(max(0.0, self.clock() - t0 - (budget if search_s is None else search_s)))
