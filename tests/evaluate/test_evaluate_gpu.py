"""The evaluator on a CUDA device: compiled Triton kernels, CUDA-event timing and side streams."""
from __future__ import annotations

import pytest
import torch

from kernelevolve.evaluate import Status

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("name", ["genuine_torch", "genuine_triton"])
def test_genuine_is_ok_and_timed_with_cuda_events(gpu_evaluator, candidate, name):
    r = gpu_evaluator.evaluate(candidate(name))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed and r.timing.method == "cuda-events"
    assert "side_stream" not in r.details


@pytest.mark.parametrize("name, status, fragment", [
    ("triton_compile_error", Status.COMPILE_ERROR, "no_such_function"),
    ("triton_ghost", Status.REJECTED, "still correct with the candidate's Triton kernels disabled"),
    ("triton_never_launched", Status.REJECTED, "launched none"),
    ("patch_cuda_event", Status.REJECTED, "torch.cuda.Event.elapsed_time"),
    ("wrong_output", Status.INCORRECT, "elements outside"),
    ("cache_by_id", Status.INCORRECT, "re-call"),
])
def test_cheats_on_the_gpu(gpu_evaluator, candidate, name, status, fragment):
    r = gpu_evaluator.evaluate(candidate(name))
    assert r.status is status, (r.reason, r.error)
    assert fragment in r.reason


def test_side_stream_work_is_timed_to_device_idle(gpu_evaluator, candidate):
    r = gpu_evaluator.evaluate(candidate("side_stream"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert "side_stream" in r.details
    assert r.timing.median_ms > 0.2  # torch.cuda._sleep spins about 0.5 ms before the work
