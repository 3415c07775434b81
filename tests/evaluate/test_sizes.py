"""The judge at every size: genuine candidates with large inputs and outputs pass the wall-clock cross-check, whose
power against forged timings stays; correct reorderings of a long reduction pass, lower-precision cheats do not."""
from __future__ import annotations

from pathlib import Path

import torch

from kernelevolve.evaluate import Status, TimingConfig
from kernelevolve.evaluate.checks import compare_outputs

CHEATS = Path(__file__).resolve().parents[1] / "cheats"


def test_large_genuine_candidate_is_ok_and_timed(new_evaluator, candidate):
    """256 MB in and 256 MB out: every cost of the timed loop that grows with the data (refills, checked copies,
    moving those copies out) is covered by the calibration, or kept out of the parent's window."""
    ev = new_evaluator("problem_large.py", trials=1, timeout_s=240.0,
                       timing=TimingConfig(budget_ms=100.0, warmup_ms=20.0, max_reps=10))
    r = ev.evaluate(candidate("large_genuine"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed and r.timing is not None
    assert r.details["wall_allowed_s"] >= r.details["parent_wall_s"]
    memory = r.details["memory"]
    assert memory["input_bytes"] == memory["output_bytes"] == 256 << 20
    assert 1 <= r.details["input_sets"] <= 3


def test_large_reference_baseline_is_timed(new_evaluator):
    ev = new_evaluator("problem_large.py", timeout_s=240.0,
                       timing=TimingConfig(budget_ms=100.0, warmup_ms=20.0, max_reps=10))
    b = ev.baseline(compiled=False)
    assert b.eager is not None, b.error


def test_forged_channel_timing_is_rejected(scale_evaluator, candidate):
    """The candidate rewrites the reported times on its own channel, out of the tamper check's sight: the parent's
    clock of the timed loop still catches it."""
    r = scale_evaluator.evaluate(candidate("forged_channel_timing"))
    assert r.status is Status.REJECTED, (r.reason, r.error, r.details)
    assert "forged or hidden timing" in r.reason and "2 times" in r.reason


def test_a_loop_over_the_wall_allowance_once_is_timed_again(scale_evaluator, candidate):
    """An honest loop stalled once by a loaded machine is not a cheat: the loop is timed again, and the time that
    counts is the second loop's, which passed the check (the candidate forges its first loop only; each call sleeps
    0.2 s, so an honest time is at least 200 ms)."""
    r = scale_evaluator.evaluate(candidate("forged_first_loop_timing"))
    assert r.status is Status.OK, (r.reason, r.error, r.details)
    assert "by the parent's clock" in r.details["wall_retried"]
    assert r.details["wall_allowed_s"] >= r.details["parent_wall_s"]
    assert r.timing is not None and r.timing.median_ms >= 200.0, r.timing


def test_long_reduction_in_another_order_is_correct(new_evaluator, candidate):
    ev = new_evaluator("problem_long_reduction.py", timeout_s=240.0)  # the deadline is not what this test is about
    r = ev.evaluate(candidate("long_reduction_reordered"))
    assert r.status is Status.OK, (r.reason, r.error)


def test_lower_precision_long_reductions_are_incorrect(new_evaluator, candidate):
    ev = new_evaluator("problem_long_reduction.py", time_candidates=False, timeout_s=240.0)
    for name in ("long_reduction_bf16", "long_reduction_tf32"):
        r = ev.evaluate(candidate(name))
        assert r.status is Status.INCORRECT, (name, r.reason, r.error)
        assert "the reference's own error" in r.reason


def _long_reduction(seed: int) -> tuple[torch.Tensor, ...]:
    """(reference, exact, reordered, bf16, tf32) outputs of the long-reduction problem for one seed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("long_reduction", CHEATS / "problem_long_reduction.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(seed)
    x, w = mod.get_inputs()
    model = mod.Model()
    outs = [model(x, w), model(x.double(), w.double())]
    for name in ("long_reduction_reordered", "long_reduction_bf16", "long_reduction_tf32"):
        spec = importlib.util.spec_from_file_location(name, CHEATS / f"{name}.py")
        cand = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cand)
        outs.append(cand.ModelNew()(x, w))
    return tuple(outs)


def test_tolerance_widens_only_to_the_references_own_error():
    ref, exact, reordered, bf16, tf32 = _long_reduction(seed=4)
    # around the reference alone, the correct reordering fails: some near-zero outputs are 1e-3 away
    assert compare_outputs((ref,), (reordered,)) is not None
    assert compare_outputs((ref,), (reordered,), exact=lambda: (exact,)) is None
    for cheat in (bf16, tf32):
        assert compare_outputs((ref,), (cheat,), exact=lambda: (exact,)) is not None
    # an explicit tolerance is an override: the evaluator gives no float64 reference then (tested in the evaluator)


def test_widening_never_judges_more_strictly():
    ref = torch.randn(1000)
    exact = ref.double() + 0.5  # a float64 result far from the reference cannot reject what matches the reference
    out = ref + 1e-5
    assert compare_outputs((ref,), (out,), exact=lambda: (exact,)) is None


def test_problem_tolerances_override_the_float64_reference(new_evaluator, tmp_path):
    src = (CHEATS / "problem_long_reduction.py").read_text() + "\nATOL = 1e-3\nRTOL = 1e-3\n"
    path = tmp_path / "problem_long_reduction_tol.py"
    path.write_text(src)
    ev = new_evaluator(path)
    assert ev._exact(1, 0, None) is None
    assert new_evaluator("problem_long_reduction.py")._exact(1, 0, None) is not None


def _no_device_room(monkeypatch, name: str) -> list[bool]:
    """Make the parent's device-side ``name`` (reference or _exact_on) run out of memory; returns the ``host`` flag
    of every call."""
    from kernelevolve.evaluate.evaluator import Evaluator

    original, calls = getattr(Evaluator, name), []

    def short_of_room(self, seed, shape=0, gpu=None, host=False):
        calls.append(host)
        if not host:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB (simulated)")
        return original(self, seed, shape, gpu, host=host)

    monkeypatch.setattr(Evaluator, name, short_of_room)
    return calls


def test_references_move_to_the_host_when_the_device_has_no_room(new_evaluator, candidate, monkeypatch):
    """The parent computes its references while the child holds most of the device: a reference that finds no room
    is computed again once the child waits, then on the host. Genuine still passes, wrong still fails."""
    calls = _no_device_room(monkeypatch, "reference")
    ev = new_evaluator("problem_scale.py")
    r = ev.evaluate(candidate("genuine_torch"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed and True in calls and False in calls
    r = ev.evaluate(candidate("wrong_output"))
    assert r.status is Status.INCORRECT, (r.reason, r.error)


def test_the_exact_reference_moves_to_the_host_when_the_device_has_no_room(new_evaluator, candidate, monkeypatch):
    calls = _no_device_room(monkeypatch, "_exact_on")
    ev = new_evaluator("problem_long_reduction.py", time_candidates=False)
    r = ev.evaluate(candidate("long_reduction_reordered"))
    assert r.status is Status.OK, (r.reason, r.error)
    r = ev.evaluate(candidate("long_reduction_bf16"))
    assert r.status is Status.INCORRECT and "the reference's own error" in r.reason, (r.reason, r.error)
    assert calls[:2] == [False, True]
