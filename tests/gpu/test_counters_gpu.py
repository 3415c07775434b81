"""Hardware counters on a real GPU with Nsight Compute: the reference's kernels and a Triton candidate's, each with a
duration, its throughputs and a bound (skipped without CUDA or without ncu on the PATH)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelevolve.counters import BOUNDS, diagnose, ncu_path, render

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(ncu_path() is None, reason="needs ncu on the PATH")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("candidate", [None, "genuine_triton.py"])
def test_counters_of_the_reference_and_of_a_triton_candidate(candidate):
    path = str(ROOT / "tests" / "cheats" / candidate) if candidate else None
    kernels = diagnose(str(ROOT / "tests" / "cheats" / "problem_scale.py"), "cuda", path,
                       major=torch.cuda.get_device_capability()[0])
    assert kernels and all(k.duration_us and k.duration_us > 0 and k.bound in BOUNDS for k in kernels), kernels
    assert all(k.sm_pct is not None and k.dram_pct is not None and k.registers for k in kernels)
    if candidate:
        assert any("scale" in k.name.lower() or "kernel" in k.name.lower() for k in kernels)
    print(render(kernels))
