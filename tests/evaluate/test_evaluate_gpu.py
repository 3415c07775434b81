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
    # the host's launch time of a call, and when the timing began: beside a GPU trace they explain a slow timing
    assert 0 < r.details["host_ms"] < 1000 and r.details["timed_at"] > 0
    assert r.details["cpu"]["self_cpu"] > 0 and r.details["cpu"]["busy_cores"] > 0


def test_a_wrong_output_on_the_gpu_carries_its_mismatch_report(gpu_evaluator, candidate):
    """The report is computed on the device's tensors, a chunk at a time, like the comparison."""
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate.feedback import describe_failure

    source = candidate("genuine_torch").source.replace("return ", "y = ", 1)
    source += "        y[:, 64:96] = 0  # columns a store mask never writes\n        return y\n"
    r = gpu_evaluator.evaluate(Candidate(source))
    assert r.status is Status.INCORRECT, (r.reason, r.error)
    report = r.details["mismatch"]
    # relu leaves some of those columns at zero in the reference too: the wrong ones lie within 64-95, in every row
    cols = report["where"]["columns"]
    assert report["wrong"] > 0 and all(64 <= a <= b <= 95 for a, b in cols), report["where"]
    assert report["where"]["rows"] == [[0, 63]] and "of 128" in describe_failure(r, source)


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
