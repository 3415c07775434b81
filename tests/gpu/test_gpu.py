"""GPU tests: genuine kernels are verified and timed on the device; GPU-specific cheats are caught."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, Status, TimingConfig
from kernelevolve.problem import load_problem

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from candidates import TORCH, TRITON  # noqa: E402

PROBLEM = ROOT / "bench" / "problems" / "scale_bias_relu.py"

# Real work hidden on a side stream: the kernel sleeps ~20 ms first, and forward returns without joining the stream.
SIDE_STREAM = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))
        self.side = torch.cuda.Stream()

    def forward(self, x):
        y = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(SLEEP_CYCLES)
            y.copy_(torch.relu(torch.addcmul(self.bias, x, self.scale)))
        return y
'''

PATCH_EVENTS = TORCH + '''
_orig = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, other: _orig(self, other) / 10
'''

GHOST = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        scratch = torch.empty_like(x)
        _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, scratch, x.numel(), BLOCK=1024)
        return torch.relu(x * self.scale + self.bias)
'''

WRONG_TRITON = TRITON.replace("tl.maximum(y, 0.0)", "tl.maximum(y, 0.5)")


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    problem = load_problem(PROBLEM, "cuda")
    cfg = EvalConfig(device="cuda", timeout_s=120, timing=TimingConfig(budget_ms=200, warmup_ms=20))
    return Evaluator(problem, cfg, tmp_path_factory.mktemp("gpu"))


def _sleep_cycles() -> int:
    # ~20 ms at the SM clock; torch.cuda._sleep spins for a number of cycles.
    return int(20e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3) if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 40_000_000


def test_genuine_triton_is_verified_and_timed(evaluator: Evaluator) -> None:
    r = evaluator.evaluate(Candidate(TRITON))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed and r.timing.method == "cuda-events" and r.runtime_ms > 0
    assert r.details["kernels"] == ["_scale_bias_relu_kernel"]
    # 4096 x 4096 fp32: 128 MiB moved at most ~4.8 TB/s, so no honest time is below ~0.028 ms.
    assert r.runtime_ms > 0.02


def test_genuine_torch_and_baseline_speedups(evaluator: Evaluator) -> None:
    r = evaluator.evaluate(Candidate(TORCH))
    assert r.status is Status.OK and r.timed, r.reason
    b = evaluator.baseline()
    assert b.eager and b.compiled and b.compile_s and not b.error
    r = r.with_baseline(b)
    assert r.speedup_eager > 0 and r.speedup_compile > 0


def test_wrong_triton_is_incorrect(evaluator: Evaluator) -> None:
    assert evaluator.evaluate(Candidate(WRONG_TRITON)).status is Status.INCORRECT


def test_side_stream_work_is_not_hidden(evaluator: Evaluator) -> None:
    r = evaluator.evaluate(Candidate(SIDE_STREAM.replace("SLEEP_CYCLES", str(_sleep_cycles()))))
    if r.status is Status.OK:
        # Its time must include the hidden ~20 ms, not just the instant launch on the calling stream.
        assert r.runtime_ms >= 10.0, r.runtime_ms
        assert "side_stream" in r.details
    else:
        assert r.status in (Status.INCORRECT, Status.REJECTED), r.reason


def test_patched_cuda_events_rejected(evaluator: Evaluator) -> None:
    r = evaluator.evaluate(Candidate(PATCH_EVENTS))
    assert r.status is Status.REJECTED and "elapsed_time" in r.reason


def test_ghost_kernel_rejected(evaluator: Evaluator) -> None:
    r = evaluator.evaluate(Candidate(GHOST))
    assert r.status is Status.REJECTED and "disabled" in r.reason


def test_inductor_candidate_on_gpu(evaluator: Evaluator) -> None:
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.inductor import InductorProposer

    ctx = ProposalContext(evaluator.problem, "cuda", None, [])
    cands = InductorProposer("cuda").propose(ctx, 2)
    for cand in cands:
        r = evaluator.evaluate(cand)
        assert r.status is Status.OK and r.timed, (cand.meta, r.reason, r.error[-2000:])


def test_check_cli_on_gpu(tmp_path: Path) -> None:
    cand = tmp_path / "cand.py"
    cand.write_text(TRITON)
    proc = subprocess.run([sys.executable, "-m", "kernelevolve.cli", "check", str(PROBLEM), str(cand), "--device",
                           "cuda", "--json", "--timing-budget-ms", "200"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok" and out["speedup_eager"] > 0 and out["speedup_compile"] > 0


def test_optimize_on_gpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kernelevolve.cli", "optimize", str(ROOT / "examples" / "gelu_mlp.py"),
                           "--device", "cuda", "--max-evals", "3", "--db", str(tmp_path / "ke.db"), "--out",
                           str(tmp_path / "out"), "--timing-budget-ms", "200"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "out" / "best.py").is_file() and (tmp_path / "out" / "report.html").is_file()
