"""The template library's graph analysis on every benchmark problem: each gets at least one region, and the regions
it gets are the families the problem is written to exercise."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.problem import load_problem
from kernelevolve.propose.template import plan_problem
from tests.benchsuite import load_suite

suite = load_suite()
PROBLEMS = suite.problem_paths(None) + suite.gemm_paths()


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_every_bench_problem_has_a_region(path: Path, tmp_path: Path) -> None:
    plan = plan_problem(load_problem(suite.write_small_copy(path, tmp_path), "cpu"), "cpu")
    assert plan.error is None and plan.regions


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_every_bench_problem_gets_a_verified_template_kernel(path: Path, tmp_path: Path) -> None:
    """At SMALL sizes on the CPU (interpreter): the first template candidates pass the whole harness."""
    import os

    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.template import TemplateProposer

    os.environ.setdefault("TRITON_INTERPRET", "1")
    problem = load_problem(suite.write_small_copy(path, tmp_path), "cpu")
    cands = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 2)
    evaluator = Evaluator(problem, EvalConfig(device="cpu", timeout_s=300,
                                              timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3)), tmp_path / "w")
    for cand in cands:
        r = evaluator.evaluate(cand)
        assert r.ok, f"{cand.meta['label']}: {r.status.value}: {r.reason}\n{r.error[-1500:]}"
