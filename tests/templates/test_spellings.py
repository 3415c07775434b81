"""Drawn spellings (tests/spellings.py): the segment family claims every spelling of a jagged sum or mean, and the
row-reduction family every spelling of a softmax, log-softmax, norm or row reduction, the matmul family every
spelling of a Linear with a pointwise epilogue, the attention family every spelling of scaled dot-product attention,
and the SwiGLU, DCN cross and feature-interaction families theirs, each as one region that leaves no op of the graph to
ATen, and the kernel of a drawn sample passes the judge (CPU, Triton interpreter). A fixed draw
here; hundreds more, and more judged, in the slow tests. A miss names the spelling's choices: make the fact it lacks,
not a pattern for it."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.template import TemplateProposer, plan_problem  # noqa: E402
from tests.spellings import spellings  # noqa: E402

SEED = int(os.environ.get("KERNELEVOLVE_SPELLING_SEED", "0"))


FAMILIES = ("segment", "row", "gemm", "attention", "swiglu", "dcn", "interaction", "scan", "pool")


def _misses(tmp_path: Path, count: int, seed: int, family: str) -> list[str]:
    """The spellings not claimed whole: one region of the family's kind, and no op of the graph left out of it."""
    misses = []
    for sp in spellings(count, seed, family):
        path = tmp_path / f"s{sp.name[:3]}.py"
        path.write_text(sp.source)
        plan = plan_problem(load_problem(path, "cpu"), "cpu")
        kinds = [r.match.kind for r in plan.regions]
        claimed = {n for r in plan.regions for n in r.match.nodes}
        left = [str(n.target) for n in plan.graph.calls() if n not in claimed] if plan.graph is not None else ["?"]
        if len(kinds) != 1 or kinds[0] not in (sp.kind, *sp.also) or left:
            misses.append(f"{sp.name}: claimed {plan.describe()}, left {left}; {plan.error or ''} {plan.skipped}")
    return misses


def _judged(tmp_path: Path, sp) -> None:
    path = tmp_path / f"{sp.name[:3]}.py"
    path.write_text(sp.source)
    problem = load_problem(path, "cpu")
    (cand,) = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 1)
    assert {sp.kind, *sp.also} & {c["kind"] for c in cand.meta["configs"]}, f"{sp.name}: {cand.meta['configs']}"
    config = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3))
    result = Evaluator(problem, config, tmp_path / f"work{sp.name[:3]}").evaluate(cand)
    assert result.ok, f"{sp.name}: {result.status.value}: {result.reason}\n{result.error[-1500:]}\n{sp.source}"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_drawn_spelling_is_claimed_whole(tmp_path, family):
    misses = _misses(tmp_path, 60, SEED, family)
    assert not misses, "\n".join(misses)


@pytest.mark.parametrize("sp", [sp for f in FAMILIES for sp in spellings(60, SEED, f)[:4]], ids=lambda sp: sp.name)
def test_a_drawn_spelling_gets_a_verified_kernel(sp, tmp_path):
    _judged(tmp_path, sp)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_hundreds_of_spellings_are_claimed_whole(tmp_path, seed, family):
    misses = _misses(tmp_path, 150, 1000 + seed, family)
    assert not misses, "\n".join(misses)


# Known, on the CPU only: Triton's interpreter casts float32 to bfloat16 by truncation, not to the nearest value as a
# GPU does (and as PyTorch does), so a kernel that rounds its intermediates as the bfloat16 graph does lands about twice
# as far from the exact result as the reference under the interpreter: the FM kernel's chain of five rounded values
# put one element of 17 past the tolerance once (interaction family, seed 2000, 022-fm2; it passed on a rerun).
BF16_FM = pytest.mark.xfail(reason="the Triton interpreter truncates float32 to bfloat16", strict=False)


@pytest.mark.slow
@pytest.mark.parametrize("sp", [pytest.param(sp, marks=BF16_FM) if "-fm" in sp.name and "bfloat16" in sp.name else sp
                                for f in FAMILIES for sp in spellings(40, 2000, f)], ids=lambda sp: sp.name)
def test_forty_more_drawn_spellings_verify(sp, tmp_path):
    _judged(tmp_path, sp)


def test_the_draw_covers_every_step():
    """Every way of writing each step appears in a draw of the size the slow tests make."""
    names = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed))
    rows = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed, "row"))
    for step in ("softmax", "log_softmax", "layernorm", "rmsnorm", "reduce", "rank2", "rank3", "up", "affine"):
        assert f"-{step}-" in rows, step
    gemms = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed, "gemm"))
    attn = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed, "attention"))
    for prefix, n in (("scores", 4), ("scale", 4), ("mask", 3), ("probs", 4), ("weighted", 3)):
        for k in range(1 if prefix == "mask" else 0, n + (1 if prefix == "mask" else 0)):
            assert f"-{prefix}{k}-" in attn, f"{prefix}{k}"
    assert "-sdpa-" in attn and "-causal-" in attn and "-full-" in attn
    others = " ".join(sp.name for f in ("swiglu", "dcn", "interaction") for seed in (1001, 1002, 1003, 1004)
                      for sp in spellings(150, seed, f))
    for prefix, n in (("halves", 5), ("gate", 5), ("cross", 5), ("fm", 3), ("product", 4), ("pick", 3)):
        for k in range(n):
            assert f"-{prefix}{k}-" in others, f"{prefix}{k}"
    scans = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed, "scan"))
    for prefix, n in (("call", 5), ("rev", 4), ("pro", 8)):
        for k in range(n):
            assert f"-{prefix}{k}-" in scans, f"{prefix}{k}"
    assert "-cumsum-" in scans and "-cumprod-" in scans and "-rank2-" in scans and "-rank3-" in scans
    pools = " ".join(sp.name for seed in (1001, 1002, 1003, 1004) for sp in spellings(150, seed, "pool"))
    for step in ("avg1d", "avg2d", "avg3d", "max1d", "max2d", "max3d", "call0", "call1", "call2", "pro4", "stride",
                 "pad", "dil", "ceil", "nopad", "div", "plain"):
        assert step in pools, step
    for prefix, n in (("linear", 6), ("act", 14), ("after", 5)):
        for k in range(n):
            assert f"-{prefix}{k}-" in gemms, f"{prefix}{k}"
    for step in ("offsets", "lengths", "sum", "mean", "values", "embedding", "index_select", "indexing", "float32",
                 "bfloat16", "float16"):
        assert f"-{step}-" in names or f"-{step} " in names + " ", step
    for prefix, n in (("pool", 5), ("counts", 3), ("divide", 4), ("lengths", 4), ("offsets", 3),
                      ("ids-lengths", 4), ("ids-offsets", 4)):
        for k in range(n):
            assert f"-{prefix}{k}" in names, f"{prefix}{k}"


def test_the_interpreter_truncates_to_bfloat16():
    """Why the bfloat16 FM spellings may fail under the interpreter (BF16_FM): its float32 -> bfloat16 cast truncates.
    When a Triton release rounds to nearest here, this fails, and BF16_FM can go."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, o_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(o_ptr + i, tl.load(x_ptr + i).to(tl.bfloat16).to(tl.float32))

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("about the interpreter")
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0)) * 30
    out = torch.empty_like(x)
    cast[(1,)](x, out, N=1024)
    assert not torch.equal(out, x.bfloat16().float())
    assert torch.equal(out.abs(), out.abs().clamp(max=x.abs()))  # toward zero, never past the value
