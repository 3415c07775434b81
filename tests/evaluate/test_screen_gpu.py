"""The screen on a GPU: Triton candidates compiled in parallel check processes, timed with CUDA events, and a
candidate that poisons the CUDA context failing alone."""
import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Status
from kernelevolve.evaluate.screen import ScreenConfig, Screener

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# a Triton store far outside any allocation: an illegal address, which leaves the process's CUDA context unusable
POISON_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def _bad(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs + (1 << 40), tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)
"""


def _poison(candidate) -> Candidate:
    """The genuine candidate, its forward replaced by a launch of the illegal store."""
    source = candidate("genuine_torch").source
    body = "        return torch.addcmul(self.bias, x, self.scale).clamp_min_(0)\n"
    assert body in source
    return Candidate(POISON_KERNEL + source.replace(body, "        y = torch.empty_like(x)\n"
                                                          "        _bad[(1,)](y, y.numel(), BLOCK=128)\n"
                                                          "        return y\n"))


def test_the_screen_on_the_gpu(new_evaluator, candidate):
    ev = new_evaluator("problem_scale.py", device="cuda")
    batch = [candidate("genuine_triton"), _poison(candidate), candidate("genuine_torch"), candidate("wrong_output")]
    results = Screener(ev, ScreenConfig(timeout_s=120.0, parallel=1)).screen(batch)  # in order, one process
    assert results[0].ok and results[0].ms is not None and results[0].first_call_s is not None, results
    assert results[1].status in (Status.RUNTIME_ERROR, Status.CRASHED), results[1]
    assert results[2].ok and results[2].ms is not None, results  # after the poisoned one, in a fresh process
    assert results[3].status is Status.INCORRECT


def test_processes_started_ahead_screen_the_first_batch_on_the_gpu(new_evaluator, candidate):
    """warm() on the GPU: CUDA contexts made ahead, the first batch checked and timed in them, closed after."""
    ev = new_evaluator("problem_scale.py", device="cuda")
    with Screener(ev, ScreenConfig(timeout_s=120.0, parallel=2)) as screener:
        screener.warm(None)
        ahead = {c.proc.pid for kept in screener._idle.values() for c in kept}
        assert len(ahead) == 3, screener._idle
        results = screener.screen([candidate("genuine_triton"), candidate("genuine_torch")])
        assert all(r.ok and r.ms is not None for r in results), results
        after = {c.proc.pid for kept in screener._idle.values() for c in kept}
        assert after == ahead  # the same processes, kept again
