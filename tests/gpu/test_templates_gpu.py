"""Every benchmark problem, at its SMALL sizes, through the template proposer on CUDA: compiled kernels (not the
interpreter) must match the reference for the default configuration and for mutated ones."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelevolve.problem import as_outputs, build_model, import_module_from_path, load_problem, make_inputs
from kernelevolve.propose.base import ProposalContext
from kernelevolve.propose.template import TemplateProposer
from kernelevolve.templates.base import load_source
from tests.benchsuite import load_suite

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


suite = load_suite()
PROBLEMS = suite.problem_paths(None)


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_template_candidates_match_the_reference_on_cuda(path: Path, tmp_path: Path) -> None:
    small = suite.write_small_copy(path, tmp_path)
    problem = load_problem(small, "cuda")
    cands = TemplateProposer("cuda", seed=0).propose(ProposalContext(problem, "cuda", None, []), 3)
    if not cands:
        pytest.skip("no template region in this problem")
    module = import_module_from_path(small, f"_gpu_ref_{path.stem}")
    ref = build_model(module, "Model", 0).cuda()
    inputs = make_inputs(module, seed=1234, device="cuda")
    with torch.no_grad():
        want = as_outputs(ref(*inputs))
    atol = problem.atol if problem.atol is not None else 1e-4
    rtol = problem.rtol if problem.rtol is not None else 1e-4
    for i, cand in enumerate(cands):
        cls = load_source(cand.source, f"_gpu_cand_{path.stem}_{i}").ModelNew
        new = cls(*module.get_init_inputs()).cuda()
        new.load_state_dict(ref.state_dict())
        with torch.no_grad():
            got = as_outputs(new(*inputs))
        for g, w in zip(got, want):
            if w.dtype in (torch.float16, torch.bfloat16):
                torch.testing.assert_close(g, w, atol=max(atol, 2e-2), rtol=max(rtol, 2e-2))
            else:
                torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
