"""The model's budget across its problems, from a table of cases."""
from __future__ import annotations

import pytest

from kernelevolve.model.budget import Claim, allocate, saving


def test_the_budget_follows_the_time_a_kernel_could_save() -> None:
    shares = allocate([Claim("a", 6.0, 1.0), Claim("b", 3.0, 2.0), Claim("c", 1.0, None)], 10.0, 120.0,
                      min_budget_s=1.0)
    got = {s.name: s.budget_s for s in shares}
    assert got["a"] == pytest.approx(120 * 5 / 6.5) and got["b"] == pytest.approx(120 * 1 / 6.5)
    assert got["c"] == pytest.approx(120 * 0.5 / 6.5)  # no floor known: half its time
    assert sum(got.values()) == pytest.approx(120.0)


@pytest.mark.parametrize("claims, total, budget, alone", [
    ([Claim("a", 9.9, 0.0), Claim("tiny", 0.1, 0.0)], 10.0, 100.0, {"tiny"}),  # 1% of the time
    ([Claim("a", 5.0, 5.0), Claim("b", 5.0, 1.0)], 10.0, 100.0, {"a"}),  # at its floor already
    ([Claim("a", 9.0, 0.0), Claim("b", 1.0, 0.5)], 10.0, 60.0, {"b"}),  # 3 s of the budget: too short
    ([Claim("a", 5.0, 0.0), Claim("b", 5.0, 0.0)], 10.0, 20.0, {"a"}),  # one search fits, not two
])
def test_problems_too_small_to_matter_are_left_alone(claims, total, budget, alone) -> None:
    shares = allocate(claims, total, budget, min_budget_s=15.0)
    assert {s.name for s in shares if s.budget_s == 0} == alone
    assert all(s.why.startswith("left alone") == (s.name in alone) for s in shares)
    spent = sum(s.budget_s for s in shares)
    assert spent == pytest.approx(budget) or not (set(c.name for c in claims) - alone)


def test_saving_never_negative() -> None:
    assert saving(Claim("x", 1.0, 2.0)) == 0.0
