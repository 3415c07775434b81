"""Every template family, and rewrites of the same computation, yield a candidate the harness verifies (CPU, Triton
interpreter, small shapes)."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.template import TemplateProposer, plan_problem  # noqa: E402
from tests.family_cases import CASES, judge, write_problem  # noqa: E402


@pytest.mark.parametrize("name", list(CASES))
def test_family_yields_a_verified_kernel(tmp_path: Path, name: str) -> None:
    kind, _ = CASES[name]
    problem = write_problem(tmp_path, name)
    plan = plan_problem(problem, "cpu")
    assert kind in [r.match.kind for r in plan.regions], plan.describe()
    (cand,) = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 1)
    result = judge(problem, cand, tmp_path)
    assert result.ok, f"{result.status.value}: {result.reason}\n{result.error[-2000:]}"
