"""A whole model planned on the CPU: its problems written and loadable, the budget shared, the plan on disk, and a
problem's region optimized through the operator loop."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelevolve.model.plan import ModelError, optimize_regions, plan_model
from kernelevolve.problem import load_problem

from tests.model.test_regions import BLOCKS


def test_a_model_plan_writes_one_problem_per_distinct_region(tmp_path: Path) -> None:
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    out = tmp_path / "out"
    plan = plan_model(path, "cpu", out, budget_s=60.0, min_share=0.0)
    assert (out / "blocks.py").exists()
    assert len(plan.groups) == 3 and sorted(len(g.regions) for g in plan.groups) == [1, 3, 3]
    for g in plan.groups:
        assert load_problem(g.path).name == g.path.stem
        assert g.floor_ms is not None and g.floor_ms > 0
    assert [g.ms for g in plan.groups] == sorted((g.ms for g in plan.groups), reverse=True)
    assert sum(g.share.budget_s for g in plan.groups) == pytest.approx(60.0, rel=1e-6) or \
        any(g.share.why.startswith("left alone") for g in plan.groups)
    saved = json.loads((out / "model_plan.json").read_text())
    assert saved["regions"] == 7 and len(saved["problems"]) == 3
    assert "Region r0" in plan.groups[0].path.read_text().splitlines()[0]

    # problems too small to matter are written and listed, but not loaded to place them on the roofline
    plan = plan_model(path, "cpu", tmp_path / "again", budget_s=60.0, min_share=0.5)
    small = [g for g in plan.groups if g.ms / plan.times.total_ms < 0.5]
    assert small and all(g.floor_ms is None and g.share.why.startswith("left alone") and g.path.exists()
                         for g in small)


def test_a_model_that_cannot_be_captured_says_so(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text(BLOCKS.replace("return torch.sigmoid(self.head(x))",
                                   "return torch.sigmoid(self.head(x)) * float(x.sum().item() > 0)"))
    with pytest.raises(ModelError, match="bad.py: the model could not be captured"):
        plan_model(path, "cpu", tmp_path / "out")


@pytest.mark.slow
def test_the_regions_go_through_the_operator_loop(tmp_path: Path) -> None:
    from kernelevolve.optimize import OptimizeConfig
    from kernelevolve.store import Store

    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    plan = plan_model(path, "cpu", tmp_path / "out", budget_s=40.0, min_share=0.0)
    cfg = OptimizeConfig(device="cpu", max_evals=2, timing_budget_ms=50.0, counters=False)
    outcomes = optimize_regions(plan, cfg, Store(tmp_path / "runs.db"))
    ran = [o for o in outcomes if o.run_id is not None]
    assert ran and all(o.best is not None and o.best.exists() for o in ran)


def test_lanes_are_the_local_gpus_or_runs_on_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelevolve.model.lanes import MAX_RAY_RUNS, lane_devices
    from kernelevolve.optimize import OptimizeConfig

    assert lane_devices(OptimizeConfig(device="cpu"), 5) == [None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert lane_devices(OptimizeConfig(device="cuda"), 5) == ["2", "3"]
    assert lane_devices(OptimizeConfig(device="cuda"), 1) == [None]  # one problem: nothing to share
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert lane_devices(OptimizeConfig(device="cuda"), 5) == [None]
    ray = OptimizeConfig(device="cuda", executor="ray", ray_address="auto")
    assert lane_devices(ray, 3) == [None] * 3 and len(lane_devices(ray, 50)) == MAX_RAY_RUNS


@pytest.mark.slow
def test_problems_run_in_parallel_lanes_each_a_run_of_its_own(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lanes (as two GPUs would be): each problem in a process of its own, each a run in the one store."""
    from kernelevolve.model import lanes
    from kernelevolve.optimize import OptimizeConfig
    from kernelevolve.store import Store

    monkeypatch.setattr(lanes, "lane_devices", lambda cfg, n: ["", ""])
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    plan = plan_model(path, "cpu", tmp_path / "out", budget_s=200.0, min_share=0.0)
    cfg = OptimizeConfig(device="cpu", max_evals=2, timing_budget_ms=50.0, counters=False)
    stages: list[str] = []
    outcomes = optimize_regions(plan, cfg, Store(tmp_path / "runs.db"), stages.append)
    ran = [o for o in outcomes if o.run_id is not None]
    assert len(ran) >= 2 and len({o.run_id for o in ran}) == len(ran), [o.why for o in outcomes]
    assert all(o.best is not None and o.best.exists() for o in ran)
    runs = {r.id for r in Store(tmp_path / "runs.db").runs()}
    assert {o.run_id for o in ran} <= runs
    assert any(" on GPU " in s for s in stages)


TABLES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, rows, dim):
        super().__init__()
        self.a = nn.EmbeddingBag(rows, dim, mode="sum")
        self.b = nn.EmbeddingBag(rows, dim, mode="sum")
        self.c = nn.EmbeddingBag(rows * 2, dim, mode="sum")

    def forward(self, ia, oa, ib, ob, ic, oc):
        # each bag with an op of its own after it: bags alone are pooled together in one launch (a group), and
        # this model is about bags alike that stay apart
        return torch.cat([torch.tanh(self.a(ia, oa)), torch.tanh(self.b(ib, ob)), torch.tanh(self.c(ic, oc))], dim=1)


def _bags():
    lengths = torch.randint(0, 5, (16,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return [torch.randint(0, 100, (int(lengths.sum()),)), offsets]


def get_inputs():
    return _bags() + _bags() + _bags()


def get_init_inputs():
    return [100, 8]
'''


def _composed_on_fresh_draws(tmp_path: Path, path: Path, plan, groups: list, watch: str | None = None,
                             host: str = "eager") -> int:
    """Each segment problem's own file as its kernel, composed into the model at every instance: its outputs equal
    the model's on two fresh draws (of other jagged totals). Returns how often ``watch``'s region function ran."""
    from kernelevolve.model.compose import Chosen, compose
    from kernelevolve.problem import build_model, import_module_from_path

    source = path.read_text()
    chosen = [Chosen(g.name, g.regions, g.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n", "own")
              for g in groups]
    text, skipped = compose(source, plan.graph, chosen, path.stem, plan.dynamic, plan.alt, host=host)
    assert not skipped
    (tmp_path / "best.py").write_text(text)
    ref_mod = import_module_from_path(path, f"_{path.stem}_ref")
    new_mod = import_module_from_path(tmp_path / "best.py", f"_{path.stem}_new")
    ref, new = build_model(ref_mod, "Model", 1), build_model(new_mod, "ModelNew", 1)
    new.load_state_dict(ref.state_dict())
    calls = []
    if watch is not None:
        region = getattr(new_mod, f"_ke_{watch}")
        setattr(new_mod, f"_ke_{watch}", lambda *a: calls.append(1) or region(*a))
    for seed in (4, 5):
        torch.manual_seed(seed)
        xs = ref_mod.get_inputs()
        with torch.no_grad():
            torch.testing.assert_close(new(*xs), ref(*xs))
    return len(calls)


@pytest.mark.parametrize("host", ["eager", "compile"])
def test_bags_alone_are_one_region_and_compose_on_fresh_draws(tmp_path: Path, host: str) -> None:
    """Three bags with nothing after them are one region (one launch); its problem file, standing in for its kernel,
    composes into the model in either host and computes each table with its own ids on draws of other totals."""
    path = tmp_path / "bags.py"
    path.write_text(TABLES.replace(
        "torch.tanh(self.a(ia, oa)), torch.tanh(self.b(ib, ob)), torch.tanh(self.c(ic, oc))",
        "self.a(ia, oa), self.b(ib, ob), self.c(ic, oc)"))
    plan = plan_model(path, "cpu", tmp_path / "out")
    (group,) = [g for g in plan.groups if g.kind == "segment"]
    assert len(group.regions) == 1 and len(group.regions[0].outputs) == 3
    calls = _composed_on_fresh_draws(tmp_path, path, plan, [group], watch=group.regions[0].name, host=host)
    assert calls == 2  # the region ran at each draw, not the model's own forward


def test_tables_alike_but_for_their_jagged_totals_are_one_problem(tmp_path: Path) -> None:
    """Each table gets its own number of ids in a draw: the sizes that change by draw do not split a problem, the
    tables' own sizes do."""
    path = tmp_path / "tables.py"
    path.write_text(TABLES)
    plan = plan_model(path, "cpu", tmp_path / "out")
    segments = sorted(len(g.regions) for g in plan.groups if g.kind == "segment")
    assert segments == [1, 2], [(g.name, g.kind, len(g.regions)) for g in plan.groups]
    # the shared problem's kernel, at both tables, computes each with its own ids on fresh draws
    _composed_on_fresh_draws(tmp_path, path, plan, [g for g in plan.groups if g.kind == "segment"])


def test_runs_stop_starting_when_the_models_budget_is_spent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each problem's run gets its share of what is left as it starts; once a run has spent the rest, the others
    are left alone and say why."""
    from types import SimpleNamespace

    import kernelevolve.optimize as optimize_mod
    from kernelevolve.model.budget import Claim, Pacer
    from kernelevolve.model.lanes import run_all
    from kernelevolve.optimize import OptimizeConfig

    now = [0.0]
    budgets: list[float] = []

    def fake_optimize(path, cfg, store, out, resume=None):
        budgets.append(cfg.time_budget_s)
        now[0] += cfg.time_budget_s + 100.0  # a run far over its search budget
        return SimpleNamespace(run_id=len(budgets), files={}, head_to_head=None, best_result=None,
                               best_why="the reference itself")

    monkeypatch.setattr(optimize_mod, "optimize", fake_optimize)
    cfg = OptimizeConfig(device="cpu")
    jobs = [(n, tmp_path / f"{n}.py", cfg, tmp_path / n) for n in ("a", "b", "c")]
    pacer = Pacer([Claim("a", 4.0, 0.0), Claim("b", 2.0, 0.0), Claim("c", 1.0, 0.0)], 7.0, deadline=200.0,
                  overhead_s=10.0, clock=lambda: now[0])
    stages: list[str] = []
    done = run_all(jobs, cfg, None, stages.append, pacer=pacer)
    assert budgets == [pytest.approx((200 - 30) * 4 / 7)]  # only a ran, with its share of the model's budget
    assert done["a"]["budget_s"] == budgets[0] and done["a"]["run_id"] == 1
    assert done["b"]["run_id"] is None and "budget ran out" in done["b"]["why"]
    assert done["c"]["run_id"] is None and any(s.startswith("c: left alone") for s in stages)


def test_a_run_inside_a_model_reads_no_counters() -> None:
    from kernelevolve.model.plan import region_config
    from kernelevolve.optimize import OptimizeConfig

    cfg = region_config(OptimizeConfig(device="cuda", counters=True), 42.0)
    assert cfg.time_budget_s == 42.0 and not cfg.counters


def test_a_run_inside_a_model_holds_a_head_to_head_only_when_asked() -> None:
    """The whole model's head-to-head decides which kernels stay; a region's own is held with
    --region-head-to-head, and never where the model's run holds none."""
    from kernelevolve.model.plan import region_config
    from kernelevolve.optimize import OptimizeConfig

    on, off = OptimizeConfig(device="cuda"), OptimizeConfig(device="cuda", head_to_head=False)
    assert on.head_to_head and not region_config(on, 42.0).head_to_head
    assert region_config(on, 42.0, head_to_head=True).head_to_head
    assert not region_config(off, 42.0, head_to_head=True).head_to_head


def test_a_region_run_without_a_head_to_head_answers_by_its_best_timed_baseline() -> None:
    """With no head-to-head, a region's speedup is the judge's against the faster of its baselines: the smaller of
    its eager and torch.compile figures; a run whose best.py is the reference answers nothing."""
    from types import SimpleNamespace

    from kernelevolve.model.lanes import _fields

    result = SimpleNamespace(speedup_eager=1.8, speedup_compile=1.2)
    f = _fields(3, None, None, result, "fastest timed candidate")
    assert f["answer"] == "candidate" and f["speedup"] == pytest.approx(1.2)
    assert _fields(3, None, None, SimpleNamespace(speedup_eager=1.5, speedup_compile=None), "x")["speedup"] == 1.5
    assert _fields(3, None, None, result, "best.py is the reference itself")["answer"] == ""
