"""The template library's graph analysis on every benchmark problem: each gets at least one region, and the regions
it gets are the families the problem is written to exercise."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kernelevolve.problem import load_problem
from kernelevolve.propose.template import plan_problem

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_suite_plans", ROOT / "bench" / "suite.py")
suite = importlib.util.module_from_spec(spec)
sys.modules["bench_suite_plans"] = suite
spec.loader.exec_module(suite)
PROBLEMS = suite.problem_paths(None)


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_every_bench_problem_has_a_region(path: Path, tmp_path: Path) -> None:
    plan = plan_problem(load_problem(suite.write_small_copy(path, tmp_path), "cpu"), "cpu")
    assert plan.error is None and plan.regions
