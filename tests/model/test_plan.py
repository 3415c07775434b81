"""A whole model planned on the CPU: its problems written and loadable, the budget shared, the plan on disk, and a
problem's region optimized through the operator loop."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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
