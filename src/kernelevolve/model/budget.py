"""One budget for a whole model, shared across its problems where Amdahl says.

A problem's claim is the time a kernel could still save: its regions' time in the model less their roofline floor.
Problems under ``min_share`` of the model's time are left alone (a perfect kernel there gains the model less than
that), and so is any problem whose share of the budget would fall under ``min_budget_s`` (too short for one
search): its share goes to the others, smallest claim first.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_SHARE = 0.02  # of the model's time
MIN_BUDGET_S = 15.0  # a search shorter than this rarely gets past the baselines


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
             min_budget_s: float = MIN_BUDGET_S) -> list[Share]:
    """Each problem's budget, in the order given."""
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
    while live:
        weight = sum(saving(c) for c in live)
        budgets = {c.name: budget_s * saving(c) / weight for c in live}
        short = [c for c in live if budgets[c.name] < min_budget_s]
        if not short:
            break
        drop = min(short, key=saving)
        why[drop.name] = f"left alone: its share of the budget ({budgets[drop.name]:.0f} s) is under " \
                         f"{min_budget_s:.0f} s"
        live.remove(drop)
    budgets = {}
    if live:
        weight = sum(saving(c) for c in live)
        budgets = {c.name: budget_s * saving(c) / weight for c in live}
    out = []
    for c in claims:
        b = budgets.get(c.name, 0.0)
        line = why.get(c.name) or (f"{b:.0f} s: {c.ms / total_ms:.1%} of the model's time, "
                                   f"{saving(c):.3f} ms to save")
        out.append(Share(c.name, b, saving(c), line))
    return out
