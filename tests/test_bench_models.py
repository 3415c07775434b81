"""The whole-model benchmarks (bench/models) at their SMALL sizes on the CPU: each loads as a problem, and plan_model
captures it, cuts it into regions and writes one loadable problem file per distinct region."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.model.plan import plan_model
from kernelevolve.problem import load_problem
from tests.benchsuite import ROOT, load_suite

MODELS = sorted((ROOT / "bench" / "models").glob("*.py"))


def test_the_six_models_are_there() -> None:
    assert [p.stem for p in MODELS] == ["dcn_v2", "dlrm", "hstu_block", "mmoe", "seq_target_attention",
                                        "transformer_block_bf16"]


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_a_bench_model_loads_and_plans(path: Path, tmp_path: Path) -> None:
    small = load_suite().write_small_copy(path, tmp_path / "model")
    assert small.read_text() != path.read_text()  # SMALL changed the sizes
    problem = load_problem(small)
    assert problem.output_dtypes
    plan = plan_model(small, "cpu", tmp_path / "out")
    assert plan.groups
    # every distinct region became a problem file, and each file loads on its own
    assert len(plan.groups) == len(plan.partition.groups()), plan.notes
    for g in plan.groups:
        assert load_problem(g.path).name == g.path.stem
