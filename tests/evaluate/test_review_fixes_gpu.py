"""GPU regressions from review: the reference's TF32 settings, GPU pinning and concurrent workers on several GPUs."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, Status, TimingConfig
from kernelevolve.problem import load_problem

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "cheats"
FAST = TimingConfig(budget_ms=20.0, warmup_ms=5.0, max_reps=30)

# Inputs scaled by 10: TF32 operands (10-bit mantissa) put errors of ~4e-4 of the output's spread into each output,
# far over the float32 tolerance (1e-3 + 1e-3 |ref|) for outputs near zero.
CONV = '''
import torch
import torch.nn as nn


class {cls}(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(256, 64, 3)

    def forward(self, x):
        return self.conv(x)
'''
CONV_PROBLEM = CONV.format(cls="Model") + '''

def get_inputs():
    return [torch.randn(8, 256, 34, 34) * 10]


def get_init_inputs():
    return []
'''


def test_fp32_convolution_reference_does_not_use_tf32(tmp_path):
    problem = tmp_path / "problem_conv.py"
    problem.write_text(CONV_PROBLEM)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
    try:
        ev = Evaluator(load_problem(problem), EvalConfig(device="cuda", timing=FAST), tmp_path / "work")
        r = ev.evaluate(Candidate(CONV.format(cls="ModelNew")))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert r.status is Status.OK, (r.reason, r.error)


@two_gpus
def test_workers_on_two_gpus_at_once(tmp_path):
    ev = Evaluator(load_problem(CHEATS / "problem_scale.py"), EvalConfig(device="cuda", timing=FAST), tmp_path)
    source = (CHEATS / "genuine_torch.py").read_text()
    results: dict[int, list] = {0: [], 1: []}

    def work(gpu: int) -> None:
        for _ in range(3):
            results[gpu].append(ev.evaluate(Candidate(source), gpu=gpu))

    threads = [threading.Thread(target=work, args=(g,)) for g in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for gpu, rs in results.items():
        for r in rs:
            assert r.status is Status.OK, (gpu, r.reason, r.error)


_PINNED = """
import sys
import torch
from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator
from kernelevolve.problem import load_problem

REPORT = "import torch\\nraise RuntimeError('UUID=' + str(torch.cuda.get_device_properties(0).uuid))\\n"

if __name__ == "__main__":
    ev = Evaluator(load_problem(sys.argv[1]), EvalConfig(device="cuda", timeout_s=120, time_candidates=False),
                   sys.argv[2])
    for gpu in (0, 1):
        r = ev.evaluate(Candidate(REPORT), gpu=gpu)
        print(gpu, "parent", torch.cuda.get_device_properties(gpu).uuid, "child", r.reason.split("UUID=")[-1])
"""


@two_gpus
def test_child_runs_on_the_parents_gpu_when_visible_devices_are_set(tmp_path):
    script = tmp_path / "pinned.py"
    script.write_text(_PINNED)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1,0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(CHEATS / "problem_scale.py"), str(tmp_path / "work")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.strip().splitlines()]
    assert len(lines) == 2, proc.stdout
    for _, _, parent, _, child in lines:
        assert parent == child, proc.stdout
