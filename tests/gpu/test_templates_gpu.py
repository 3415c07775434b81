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
from kernelevolve.evaluate import EvalConfig, Evaluator
from tests.benchsuite import load_suite
from tests.family_cases import CASES as FAMILY_CASES
from tests.family_cases import FAST, write_problem

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


GEMMS = [p for p in PROBLEMS if p.stem in ("linear_gelu_bf16", "swiglu_mlp_bf16", "dcn_v2_cross_fp32")]
GEMMS += suite.gemm_paths()


def render_with(problem, knob: str, value: str, label: str, also: dict | None = None) -> str:
    """The defaults, with ``knob`` set to ``value`` in every region whose space offers it (skips where none does), and
    each knob of ``also`` set there too where that region offers its value."""
    proposer = TemplateProposer("cuda", seed=0)
    plan = proposer.plan(problem)
    genome = {r.key: r.default() for r in plan.regions}
    keys = [r.key for r in plan.regions if value in r.space.get(knob, [])]
    if not keys:
        pytest.skip(f"no region offers {knob}={value}")
    for r in plan.regions:
        if r.key in keys:
            genome[r.key][knob] = value
            genome[r.key].update({k: v for k, v in (also or {}).items() if v in r.space.get(k, [])})
    source = proposer.render(plan, genome, label)
    assert source is not None, proposer.broken
    return source


@pytest.mark.parametrize("schedule", ["tma", "streamk"])
@pytest.mark.parametrize("path", GEMMS, ids=[p.stem for p in GEMMS])
def test_each_gemm_schedule_matches_the_reference_on_cuda(path: Path, schedule: str, tmp_path: Path) -> None:
    """Every matrix-multiply region that offers it rendered with ``SCHEDULE="tma"`` (the persistent kernel) or
    ``"streamk"`` (stream-K and its fixup), compiled for the device, not interpreted."""
    from kernelevolve.templates.matmul import has_tma

    if schedule == "tma" and not has_tma():
        pytest.skip("this Triton has no tensor descriptors")
    small = suite.write_small_copy(path, tmp_path)
    problem = load_problem(small, "cuda")
    source = render_with(problem, "SCHEDULE", schedule, schedule)
    module = import_module_from_path(small, f"_gpu_{schedule}_ref_{path.stem}")
    ref = build_model(module, "Model", 0).cuda()
    inputs = make_inputs(module, seed=4321, device="cuda")
    with torch.no_grad():
        want = as_outputs(ref(*inputs))
    new = load_source(source, f"_gpu_{schedule}_{path.stem}").ModelNew(*module.get_init_inputs()).cuda()
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        got = as_outputs(new(*inputs))
    atol = problem.atol if problem.atol is not None else 1e-4
    rtol = problem.rtol if problem.rtol is not None else 1e-4
    for g, w in zip(got, want):
        low = w.dtype in (torch.float16, torch.bfloat16)
        torch.testing.assert_close(g, w, atol=max(atol, 2e-2) if low else atol, rtol=max(rtol, 2e-2) if low else rtol)


REDUCED = [p for p in suite.gemm_paths() if p.stem in ("linear_softmax_bf16", "linear_logsumexp_fp32")]


@pytest.mark.parametrize("path", REDUCED, ids=[p.stem for p in REDUCED])
def test_a_gemm_and_its_row_reduction_in_one_kernel_pass_the_judge_on_cuda(path: Path, tmp_path: Path) -> None:
    """The matmul_reduction family at the problems' full sizes, its first candidates judged on the device."""
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig

    problem = load_problem(path, "cuda")
    proposer = TemplateProposer("cuda", seed=0)
    assert "matmul_reduction" in [r.match.family for r in proposer.plan(problem).regions]
    evaluator = Evaluator(problem, EvalConfig(device="cuda", timing=TimingConfig(budget_ms=50)), tmp_path / "w")
    for cand in proposer.propose(ProposalContext(problem, "cuda", None, []), 3):
        r = evaluator.evaluate(cand)
        assert r.ok, f"{cand.meta['label']}: {r.status.value}: {r.reason}\n{r.error[-1500:]}"


SPLIT = [p for p in GEMMS if p.stem in ("dcn_v2_cross_fp32", "swiglu_mlp_fp32", "matmul_long_k_fp32", "task_towers_fp32",
                                        "linear_logsumexp_fp32")]


@pytest.mark.parametrize("mode", ["split_tf32x3", "split_tf32x3_fp32sum"])
@pytest.mark.parametrize("schedule", ["tiles", "tma"])
@pytest.mark.parametrize("path", SPLIT, ids=[p.stem for p in SPLIT])
def test_fp32_products_on_split_operands_pass_the_judge_on_cuda(path: Path, schedule: str, mode: str,
                                                                 tmp_path: Path) -> None:
    """Each split mode (three TF32 tensor-core products on operands split in memory; ``_fp32sum``: each K tile's
    products summed apart and added in fp32, offered past IEEE_LONG) at the problems' full sizes where a region
    offers it, judged at their fp32 tolerance: the accuracy the CPU tests cannot show, since the interpreter
    multiplies in fp32. In the tile kernel, and in the persistent TMA kernel where a region offers it."""
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate import EvalConfig, Evaluator, Status, TimingConfig

    problem = load_problem(path, "cuda")
    source = render_with(problem, "INPUT_PRECISION", mode, mode, {"SCHEDULE": schedule})
    assert "_split(" in source and ("+= part" in source) == mode.endswith("fp32sum")
    if schedule == "tma" and "a_lo_desc" not in source:
        pytest.skip("no split region offers the persistent schedule")

    evaluator = Evaluator(problem, EvalConfig(device="cuda", timing=TimingConfig(budget_ms=50)), tmp_path / "w")
    r = evaluator.evaluate(Candidate(source, proposer="template", language="triton", meta={"label": mode}))
    if mode == "split_tf32x3" and path.stem == "matmul_long_k_fp32" and r.status is Status.INCORRECT:
        # 65536 products a row summed by the tensor cores, which do not round to nearest: on randn data some
        # outputs land outside the fp32 tolerance (0.0056 against 0.0012 at 78139b1 and d2f43e4); the fp32sum mode
        # is the one offered for this length
        pytest.xfail(f"tensor-core running sums over a 65536-long reduction: {r.reason[:200]}")
    assert r.ok, f"{r.status.value}: {r.reason}\n{r.error[-1500:]}"
    print(f"{path.stem} {schedule} {mode}: {r.runtime_ms} ms, {r.speedup_eager} x eager")


# the families no suite problem exercises yet: their cases of tests/family_cases.py, compiled for the device
NEW_FAMILIES = [name for name, (kind, _) in FAMILY_CASES.items() if kind in ("scan", "pool")]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_scan_and_pool_kernels_pass_the_judge_on_cuda(name: str, tmp_path: Path) -> None:
    problem = load_problem(write_problem(tmp_path, name).path, "cuda")
    cands = TemplateProposer("cuda", seed=0).propose(ProposalContext(problem, "cuda", None, []), 3)
    assert cands, "no template candidate"
    ev = Evaluator(problem, EvalConfig(device="cuda", timeout_s=300, timing=FAST), tmp_path / "work")
    for cand in cands:
        result = ev.evaluate(cand)
        assert result.ok, f"{cand.meta.get('label')}: {result.status.value}: {result.reason}\n{result.error[-1500:]}"
