"""The model's budget across its problems, from a table of cases."""
from __future__ import annotations

import pytest

from kernelevolve.model.budget import Claim, Pacer, allocate, saving


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


def test_each_run_that_goes_costs_its_overhead_beside_its_search() -> None:
    shares = allocate([Claim("a", 6.0, 0.0), Claim("b", 3.0, 0.0), Claim("c", 1.0, 0.0)], 10.0, 200.0,
                      min_budget_s=15.0, overhead_s=40.0)
    got = {s.name: s.budget_s for s in shares}
    # three runs would leave 80 s of search, c's share 8 s: c goes, and a and b share 200 - 2 * 40
    assert got["c"] == 0 and "40 s a run spends" in next(s.why for s in shares if s.name == "c")
    assert got["a"] == pytest.approx(120 * 6 / 9) and got["b"] == pytest.approx(120 * 3 / 9)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("spent", [10.0, 0.0, 150.0])
def test_the_pacer_shares_what_is_left_as_each_run_starts(spent) -> None:
    """Each run takes its search budget and ``spent`` more: the next shares what is left of the 300 s by claim, less
    the overhead measured; where nothing is left, it does not start."""
    clock = Clock()
    claims = [Claim("a", 5.0, 0.0), Claim("b", 2.0, 0.0), Claim("c", 1.0, 0.0)]
    pacer = Pacer(claims, 8.0, deadline=300.0, overhead_s=20.0, clock=clock)
    a = pacer.start("a")
    assert a.budget_s == pytest.approx((300 - 3 * 20) * 5 / 8)  # the first estimate of the overhead
    clock.t += a.budget_s + spent
    pacer.finish("a")
    assert pacer.overhead() == pytest.approx(spent)
    b = pacer.start("b")
    if 300 - clock.t - 2 * spent < 2 * 15:  # two runs of at least 15 s each do not fit
        assert b.budget_s == 0 and "budget ran out" in b.why
        assert pacer.start("c").budget_s == 0  # a smaller claim than b's
        return
    assert b.budget_s == pytest.approx((300 - clock.t - 2 * spent) * 2 / 3)
    clock.t += b.budget_s + spent
    pacer.finish("b")
    c = pacer.start("c")
    assert c.budget_s == pytest.approx(300 - clock.t - spent)
    assert clock.t + c.budget_s + spent == pytest.approx(300)  # the last run ends with the budget


def test_a_run_that_stops_searching_early_measures_its_overhead_from_its_search() -> None:
    clock = Clock()
    pacer = Pacer([Claim("a", 1.0, 0.0), Claim("b", 1.0, 0.0)], 2.0, deadline=400.0, overhead_s=20.0, clock=clock)
    a = pacer.start("a")
    clock.t += 30.0 + 45.0  # 30 s of search (it stopped early, under its budget), 45 s of baselines and head-to-head
    pacer.finish("a", search_s=30.0)
    assert a.budget_s > 100 and pacer.overhead() == pytest.approx(45.0)
    assert pacer.start("b").budget_s == pytest.approx(400 - 75 - 45)


def test_runs_under_way_in_other_lanes_hold_their_time() -> None:
    clock = Clock()
    pacer = Pacer([Claim("a", 1.0, 0.0), Claim("b", 1.0, 0.0)], 2.0, deadline=100.0, overhead_s=10.0, lanes=2,
                  clock=clock)
    a, b = pacer.start("a"), pacer.start("b")
    # two lanes of 100 s: a's share of 200 - 2 * 10; b starts beside it, with what a does not hold
    assert a.budget_s == pytest.approx(90.0) and b.budget_s == pytest.approx(200 - (90 + 10) - 10)


@pytest.mark.parametrize("device, hosts, head_to_head", [("cuda", 2, True), ("cuda", 1, True), ("cpu", 1, True),
                                                         ("cpu", 1, False)])
def test_judging_the_whole_is_kept_back_from_the_budget(device, hosts, head_to_head) -> None:
    from kernelevolve.model.budget import closing_s, run_overhead_s

    kept = closing_s(device, hosts, head_to_head)
    one = closing_s(device, 1, head_to_head)
    assert kept >= one > 0 and (hosts == 1 or kept > one)  # each host's composition is judged
    # the head-to-head and the whole model's builds cost more than a region run's overhead
    assert (kept > run_overhead_s(device, True)) == head_to_head


def test_a_model_runs_problems_only_until_judging_the_whole_is_due(tmp_path, monkeypatch) -> None:
    """optimize_model shares the budget less the estimate of judging the whole, and says so."""
    from kernelevolve.settings import OptimizeConfig
    from kernelevolve.model import run as run_mod
    from kernelevolve.model.budget import closing_s
    from kernelevolve.store import Store
    from tests.model.test_regions import BLOCKS

    seen: dict[str, float] = {}

    def fake_plan(path, device, out_dir, budget_s, *a, **k):
        seen["plan"] = budget_s
        raise run_mod.ModelError("stop here")

    def fake_parts(*a, **k):
        return "parts"

    monkeypatch.setattr(run_mod, "plan_model", fake_plan)
    monkeypatch.setattr("kernelevolve.model.parts.optimize_parts", fake_parts)
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    cfg = OptimizeConfig(device="cpu", counters=False)
    assert run_mod.optimize_model(path, cfg, Store(tmp_path / "r.db"), tmp_path / "out", budget_s=300.0) == "parts"
    assert seen["plan"] == pytest.approx(300.0 - closing_s("cpu", 1, cfg.head_to_head))
    run_mod.optimize_model(path, cfg, Store(tmp_path / "r.db"), tmp_path / "out", budget_s=20.0)
    assert seen["plan"] == 0.0  # a budget under the estimate leaves nothing to share: every problem is left alone
