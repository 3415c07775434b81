"""Cheats the evaluator does not catch yet. Each test states what should happen and is marked xfail(strict=True):
when a fix lands the test passes, strict xfail turns that into a failure, and the marker must be removed."""
from __future__ import annotations

import os
import signal

import pytest

from kernelevolve.evaluate import Status


def gap(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


@gap("the tamper check runs inside the candidate's process, which can replace it (here checks.tampered) before "
     "slowing down the timing loop's clock a hundredfold; the parent's wall-clock check allows it because the "
     "cache flush dominates every repetition")
def test_disabled_tamper_check(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("gap_disable_tamper_check"))
    assert not r.ok, f"accepted with a forged timing: {r.timing}, details {r.details}"


@gap("the ghost run only asks that the output be wrong without the kernels: a kernel that merely copies a torch "
     "result into a zeroed output passes it (so would one that raises when its kernel did not run)")
def test_triton_kernel_that_only_copies(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("gap_triton_copy_kernel"))
    assert not r.ok


@gap("the input check compares with torch.equal inside the candidate's process; a TorchFunctionMode entered at "
     "import makes it always True")
def test_hidden_input_mutation(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("gap_hidden_mutation"))
    assert r.status is Status.REJECTED


@gap("when the reference mutates its input, the mutated input is not compared with the reference's, so a "
     "candidate may skip the in-place update that is part of the op's contract")
def test_in_place_update_skipped(inplace_evaluator, candidate):
    r = inplace_evaluator.evaluate(candidate("inplace_skips_mutation"))
    assert not r.ok


@gap("a helper started with setsid by a short-lived shell is neither a child of the candidate (the outlive check "
     "misses it) nor in its process group (the kill misses it)")
def test_escaped_daemon(untimed_evaluator, candidate, gone, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    r = untimed_evaluator.evaluate(candidate("gap_escaped_daemon", pidfile=str(pidfile)))
    pid = int(pidfile.read_text())
    try:
        assert gone(pid, wait_s=1.0), f"daemon {pid} survived; status {r.status.value}: {r.reason}"
    finally:
        if not gone(pid, wait_s=0):
            os.kill(pid, signal.SIGKILL)


@gap("the child's own environment is scrubbed, but /proc/<pid>/environ of the evaluating parent (same user) is "
     "readable from the child and holds the secret")
def test_secret_readable_from_parent_environ(secret_probe_results):
    status, reason = secret_probe_results["gap_parent_environ.py"]
    assert status == Status.OK.value, reason
