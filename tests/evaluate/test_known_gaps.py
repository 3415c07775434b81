"""Cheats the evaluator does not catch yet. Each test states what should happen and is marked xfail(strict=True):
when a fix lands the test passes, strict xfail turns that into a failure, and the marker must be removed."""
from __future__ import annotations

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


@gap("the child's own environment is scrubbed, but /proc/<pid>/environ of the evaluating parent (same user) is "
     "readable from the child and holds the secret")
def test_secret_readable_from_parent_environ(secret_probe_results):
    status, reason = secret_probe_results["gap_parent_environ.py"]
    assert status == Status.OK.value, reason



