"""The ghost run (the candidate with its Triton kernels disabled) must be wrong on the first informative fresh draw; a
draw whose output needs no kernel at all (an empty jagged batch) is skipped, so that it neither gets an honest kernel
rejected nor lets a kernel that does none of the work through."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import kernelevolve.evaluate.evaluator as ev  # noqa: E402
from kernelevolve.candidate import Candidate  # noqa: E402
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig  # noqa: E402
from kernelevolve.evaluate.result import Status  # noqa: E402
from kernelevolve.problem import import_module_from_path, load_problem, make_inputs  # noqa: E402
from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.template import TemplateProposer  # noqa: E402

JAGGED = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, v, offsets):
        return torch.segment_reduce(v, "sum", offsets=offsets)


def get_inputs():
    lengths = torch.randint(0, 2, (1,))  # one bag, empty on half the draws
    return [torch.randn(int(lengths.sum()), 7), torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])]


def get_init_inputs():
    return []
'''


KERNEL = JAGGED + '''

import triton
import triton.language as tl


@triton.jit
def _bag_sum(v_ptr, out_ptr, n, D: tl.constexpr, BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for r in range(0, n):
        acc += tl.load(v_ptr + r * D + d, mask=d < D, other=0.0)
    tl.store(out_ptr + d, acc, mask=d < D)


class ModelNew(Model):
    def forward(self, v, offsets):
        out = torch.zeros(1, v.shape[1], dtype=v.dtype, device=v.device)  # zeros: an empty bag needs no kernel
        _bag_sum[(1,)](v.contiguous(), out, int(offsets[1] - offsets[0]), D=v.shape[1], BLOCK_D=8)
        return out
'''


CHEAT = JAGGED + '''

import triton
import triton.language as tl


@triton.jit
def _touch(out_ptr):
    tl.store(out_ptr, tl.load(out_ptr))


class ModelNew(Model):
    def forward(self, v, offsets):
        out = super().forward(v, offsets)  # torch does the work; the kernel only shows up
        _touch[(1,)](out)
        return out
'''


def _empty_draws_first(monkeypatch, module, draws: int = ev.GHOST_DRAWS) -> None:
    """Each ghost run of the evaluation takes ``draws`` draws: two whose first input has no row, then two with rows."""
    empty = [s for s in range(64) if make_inputs(module, s)[0].shape[0] == 0][:2]
    full = [s for s in range(64) if make_inputs(module, s)[0].shape[0] > 0][:2]
    real, ghost = ev.fresh_seed, Evaluator._ghost

    def ghost_on_empty_draws_first(self, child, gpu, _draws=ev.GHOST_DRAWS, **kw):
        seeds = iter(empty + full)
        monkeypatch.setattr(ev, "fresh_seed", lambda: next(seeds))
        try:
            return ghost(self, child, gpu, draws, **kw)
        finally:
            monkeypatch.setattr(ev, "fresh_seed", real)

    monkeypatch.setattr(Evaluator, "_ghost", ghost_on_empty_draws_first)


@pytest.mark.parametrize("source, draws, verdict", [(KERNEL, ev.GHOST_DRAWS, Status.OK), (KERNEL, 1, Status.OK),
                                                    (CHEAT, ev.GHOST_DRAWS, Status.REJECTED)])
def test_empty_draws_are_skipped(source, draws, verdict, tmp_path, monkeypatch):
    path = tmp_path / "jagged_one_bag.py"
    path.write_text(JAGGED)
    problem = load_problem(path, "cpu")
    _empty_draws_first(monkeypatch, import_module_from_path(path, "_ghost_draws_problem"), draws)
    config = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3))
    result = Evaluator(problem, config, tmp_path / "work").evaluate(Candidate(source, proposer="manual"))
    assert result.status == verdict, f"{result.status.value}: {result.reason}\n{result.error[-800:]}"


def test_the_template_kernel_of_an_often_empty_jagged_problem_is_verified(tmp_path):
    path = tmp_path / "jagged_one_bag.py"
    path.write_text(JAGGED)
    problem = load_problem(path, "cpu")
    (cand,) = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 1)
    assert "segment_reduction" in {c["kind"] for c in cand.meta["configs"]}
    config = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3))
    for k in range(3):  # fresh draws each time: about half of them empty
        result = Evaluator(problem, config, tmp_path / f"work{k}").evaluate(cand)
        assert result.ok, f"{result.status.value}: {result.reason}\n{result.error[-800:]}"


ACCUMULATE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, v, w, acc):
        acc.add_((v * w).sum(0, keepdim=True))  # v has no row on half the draws
        return acc


def get_inputs():
    n = 1 if torch.initial_seed() == 0 else int(torch.randint(0, 2, (1,)))  # the draw that finds the mutation: full
    return [torch.randn(n, 7), torch.randn(7), torch.zeros(1, 7)]


def get_init_inputs():
    return []
'''
ACCUMULATE_KERNEL = ACCUMULATE + '''

import triton
import triton.language as tl


@triton.jit
def _acc(v_ptr, w_ptr, acc_ptr, n, D: tl.constexpr, BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    a = tl.load(acc_ptr + d, mask=d < D, other=0.0)
    w = tl.load(w_ptr + d, mask=d < D, other=0.0)
    for r in range(0, n):
        a += tl.load(v_ptr + r * D + d, mask=d < D, other=0.0) * w
    tl.store(acc_ptr + d, a, mask=d < D)


class ModelNew(Model):
    def forward(self, v, w, acc):
        _acc[(1,)](v.contiguous(), w, acc, v.shape[0], D=7, BLOCK_D=8)
        return acc
'''


def test_inputs_the_reference_mutates_do_not_make_an_empty_draw_informative(tmp_path, monkeypatch):
    """The mutated inputs come back beside the outputs (a weight among them, never zero): whether a draw can tell a
    kernel from none is read from the outputs alone."""
    path = tmp_path / "accumulate.py"
    path.write_text(ACCUMULATE)
    problem = load_problem(path, "cpu")
    assert problem.mutates_inputs
    _empty_draws_first(monkeypatch, import_module_from_path(path, "_ghost_accumulate"))
    config = EvalConfig(device="cpu", timeout_s=300, time_candidates=False)
    result = Evaluator(problem, config, tmp_path / "work").evaluate(Candidate(ACCUMULATE_KERNEL, proposer="manual"))
    assert result.status == Status.OK, f"{result.status.value}: {result.reason}\n{result.error[-800:]}"


def test_a_recall_and_timing_draw_of_other_sizes_do_not_fail_an_honest_kernel(tmp_path, monkeypatch):
    """The parent looks for draws with the trial's sizes for the re-call and the timing sets, and can miss (the sizes
    of a jagged problem here vary in 1 draw of 2, but may not in the handful it checks): the child then re-calls on
    the same tensor objects at the new sizes, and times only the sets of the first set's sizes."""
    path = tmp_path / "jagged_one_bag.py"
    path.write_text(JAGGED)
    problem = load_problem(path, "cpu")

    def other_sizes_seed(self, seed, shape, gpu):
        want = self._input_shapes(seed, shape, gpu)
        return next(s for s in iter(ev.fresh_seed, None) if self._input_shapes(s, shape, gpu) != want)

    monkeypatch.setattr(Evaluator, "_same_shapes_seed", other_sizes_seed)
    config = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3))
    result = Evaluator(problem, config, tmp_path / "work").evaluate(Candidate(KERNEL, proposer="manual"))
    assert result.ok, f"{result.status.value}: {result.reason}\n{result.error[-800:]}"
    assert result.details.get("recall") is None or "skipped" not in str(result.details["recall"])


def _lse_problem(scale: str) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.logsumexp(x * {scale}, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(8, 4096)]


def get_init_inputs():
    return []
'''


LSE_KERNEL = '''

import triton
import triton.language as tl


@triton.jit
def _lse(x_ptr, out_ptr, scale, N: tl.constexpr):
    r = tl.program_id(0)
    x = tl.load(x_ptr + r * N + tl.arange(0, N)) * scale
    m = tl.max(x, 0)
    tl.store(out_ptr + r, m + tl.log(tl.sum(tl.exp(x - m), 0)))


class ModelNew(Model):
    """The output buffer is kept from call to call: with the kernel disabled it holds the last call's result."""
    def forward(self, x):
        if getattr(self, "out", None) is None or self.out.shape[0] != x.shape[0]:
            self.out = torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device)
        _lse[(x.shape[0],)](x.contiguous(), self.out, SCALE, N=x.shape[1])
        return self.out
'''

LSE_CHEAT = '''

import triton
import triton.language as tl


@triton.jit
def _touch(out_ptr):
    tl.store(out_ptr, tl.load(out_ptr))


class ModelNew(Model):
    def forward(self, x):
        out = super().forward(x)  # torch does the work; the kernel only shows up
        _touch[(1,)](out)
        return out
'''


LOSS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.mean((a - b) ** 2)


def get_inputs():
    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]


def get_init_inputs():
    return []
'''

LOSS_CHEAT = LSE_CHEAT.replace("def forward(self, x):", "def forward(self, a, b):").replace(
    "super().forward(x)", "super().forward(a, b).reshape(1)").replace("return out", "return out.reshape(())")


@pytest.mark.parametrize("problem_text, source, verdict", [
    (_lse_problem("1e-4"), LSE_KERNEL.replace("SCALE", "1e-4"), Status.OK),
    (_lse_problem("1.0"), LSE_KERNEL.replace("SCALE", "1.0"), Status.OK),
    (_lse_problem("1.0"), LSE_CHEAT, Status.REJECTED),
    (_lse_problem("1e-4"), LSE_CHEAT, Status.REJECTED),
    (LOSS, LOSS_CHEAT, Status.REJECTED),
], ids=["nearly-constant-honest", "varying-honest", "varying-cheat", "nearly-constant-cheat", "loss-cheat"])
def test_an_earlier_output_left_in_memory_is_no_reason_to_reject(problem_text, source, verdict, tmp_path):
    """A logsumexp over 4096 values scaled by 1e-4 is log(4096) on every draw within the tolerance (KernelBench
    level 2's Gemm_LogSumExp comes close): an honest kernel's last output, left where the ghost run finds it (here in
    a buffer the kernel keeps), passes too, and that draw is skipped instead of failing the kernel. Outputs that are
    right without the kernels for any other reason are not skipped: torch doing the work while a kernel only shows
    up is rejected, on outputs that vary and on outputs that barely do (a mean squared error over 4M values)."""
    path = tmp_path / "p.py"
    path.write_text(problem_text)
    problem = load_problem(path, "cpu")
    config = EvalConfig(device="cpu", timeout_s=300, time_candidates=False)
    result = Evaluator(problem, config, tmp_path / "work").evaluate(Candidate(problem_text + source, proposer="manual"))
    assert result.status == verdict, f"{result.status.value}: {result.reason}\n{result.error[-800:]}"
