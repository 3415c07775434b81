"""Unit tests of the correctness and anti-cheat checks."""
from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import pytest
import torch

from kernelevolve.evaluate import checks, timing
from kernelevolve.evaluate.checks import compare_outputs, scrub_environment, tolerance

FLOATS = [(torch.float64, 1e-7), (torch.float32, 1e-3), (torch.float16, 1e-2), (torch.bfloat16, 2e-2)]


def _ref(dtype: torch.dtype = torch.float32, n: int = 1000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1)).to(dtype)


# --- tolerances --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, tol", FLOATS)
def test_tolerance_per_dtype(dtype, tol):
    assert tolerance(dtype) == (tol, tol)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integers_are_exact(dtype):
    assert tolerance(dtype) == (0.0, 0.0)


def test_tf32_loosens_float32_only():
    assert tolerance(torch.float32, allow_tf32=True) == checks.TF32_TOL
    assert tolerance(torch.float16, allow_tf32=True) == (1e-2, 1e-2)
    assert tolerance(torch.float64, allow_tf32=True) == (1e-7, 1e-7)


def test_problem_tolerances_override_defaults():
    assert tolerance(torch.float32, atol=0.5) == (0.5, 1e-3)
    assert tolerance(torch.float32, rtol=0.0) == (1e-3, 0.0)


# --- compare_outputs: values ---------------------------------------------------------------------------------------
def test_identical_outputs_pass():
    r = _ref()
    assert compare_outputs((r,), (r.clone(),)) is None


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-7), (torch.float32, 1e-3)])
def test_error_just_inside_and_just_outside_tolerance(dtype, tol):
    r = _ref(dtype)
    bound = tol + tol * r.abs()
    assert compare_outputs((r,), (r + 0.9 * bound,)) is None
    out = r.clone()
    out[17] += 1.5 * bound[17]
    reason = compare_outputs((r,), (out,))
    assert reason is not None and reason.startswith("output: 1 of 1000 elements outside")


def test_half_precision_tolerance_is_wider_than_float32():
    r = _ref(torch.float32)
    out = r + 5e-3
    assert compare_outputs((r,), (out,)) is not None
    assert compare_outputs((r.half(),), (out.half(),)) is None


def test_every_element_is_checked():
    r = torch.zeros(1 << 20)
    out = r.clone()
    out[-1] = 1.0
    assert "1 of 1048576 elements outside" in compare_outputs((r,), (out,))


def test_reason_reports_the_worst_element():
    r = torch.zeros(8)
    out = r.clone()
    out[3], out[5] = 0.5, -2.0
    reason = compare_outputs((r,), (out,))
    assert "2 of 8 elements" in reason and "max abs err 2" in reason and "out -2 vs ref 0" in reason


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integers_must_match_exactly(dtype):
    r = torch.arange(100).to(dtype)
    out = r.clone()
    out[42] += 1
    assert compare_outputs((r,), (r.clone(),)) is None
    assert compare_outputs((r,), (out,)) == "output: 1 of 100 elements differ (exact match required)"


def test_bool_must_match_exactly():
    r = torch.tensor([True, False, True])
    assert compare_outputs((r,), (torch.tensor([True, True, True]),)) is not None


def test_problem_atol_applies():
    r = torch.zeros(4)
    out = r + 0.3
    assert compare_outputs((r,), (out,)) is not None
    assert compare_outputs((r,), (out,), atol=0.5) is None


def test_tf32_tolerance_applies_when_allowed():
    r = torch.ones(4)
    out = r + 5e-3
    assert compare_outputs((r,), (out,)) is not None
    assert compare_outputs((r,), (out,), allow_tf32=True) is None


# --- compare_outputs: NaN and Inf -------------------------------------------------------------------------------
def test_matching_nan_and_inf_pass():
    r = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare_outputs((r,), (r.clone(),)) is None


@pytest.mark.parametrize("ref, out", [
    ([1.0, 2.0], [1.0, float("nan")]),
    ([1.0, float("nan")], [1.0, 2.0]),
    ([float("nan"), 2.0], [1.0, float("nan")]),
])
def test_nan_pattern_must_match(ref, out):
    assert "NaN pattern differs" in compare_outputs((torch.tensor(ref),), (torch.tensor(out),))


@pytest.mark.parametrize("ref, out", [
    ([1.0, float("inf")], [1.0, -float("inf")]),
    ([1.0, float("inf")], [1.0, 3e38]),
    ([1.0, 2.0], [1.0, float("inf")]),
])
def test_inf_pattern_and_sign_must_match(ref, out):
    assert "Inf pattern differs" in compare_outputs((torch.tensor(ref),), (torch.tensor(out),))


def test_nan_in_half_precision_is_caught():
    r = torch.ones(16, dtype=torch.float16)
    out = r.clone()
    out[0] = float("nan")
    assert "NaN pattern differs" in compare_outputs((r,), (out,))


# --- compare_outputs: structure ---------------------------------------------------------------------------------
def test_shape_mismatch():
    assert compare_outputs((torch.zeros(2, 3),), (torch.zeros(3, 2),)) == "output has shape (3, 2), expected (2, 3)"


def test_broadcastable_shape_is_still_a_mismatch():
    assert "shape" in compare_outputs((torch.zeros(2, 3),), (torch.zeros(1, 3),))


def test_dtype_mismatch():
    reason = compare_outputs((torch.zeros(3),), (torch.zeros(3, dtype=torch.float64),))
    assert reason == "output has dtype torch.float64, expected torch.float32"


def test_output_count_mismatch():
    assert compare_outputs((torch.zeros(3),), (torch.zeros(3), torch.zeros(3))) == "expected 1 output(s), got 2"


def test_multiple_outputs_are_named_by_index():
    r = (torch.zeros(3), torch.zeros(3))
    assert compare_outputs(r, (torch.zeros(3), torch.ones(3))).startswith("output 1:")


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("out, kind", [
    (torch.zeros(3).as_subclass(_Sub), "_Sub"),
    (torch.nn.Parameter(torch.zeros(3)), "Parameter"),
    (np.zeros(3, dtype=np.float32), "ndarray"),
    ([0.0, 0.0, 0.0], "list"),
])
def test_output_must_be_exactly_a_tensor(out, kind):
    assert compare_outputs((torch.zeros(3),), (out,)) == f"output is {kind}, not exactly torch.Tensor"


# --- a chunk at a time ---------------------------------------------------------------------------------------------
def _chunked(monkeypatch, size: int) -> None:
    monkeypatch.setattr(checks, "COMPARE_CHUNK", size)


@pytest.mark.parametrize("size", [1, 7, 64])
def test_chunked_comparison_gives_the_same_reasons(monkeypatch, size):
    r = _ref(n=200).reshape(10, 20)
    cases = [r.clone(), r + 1e-4]
    bad = r.clone()
    bad.view(-1)[[3, 150, 199]] += torch.tensor([0.5, 2.0, 0.25])
    cases.append(bad)
    nan_r, nan_o = r.clone(), r.clone()
    nan_r.view(-1)[[5, 120]] = float("nan")
    nan_o.view(-1)[[5, 121]] = float("nan")
    inf = r.clone()
    inf.view(-1)[190] = float("inf")
    whole = [compare_outputs((r,), (o,)) for o in cases] + [compare_outputs((nan_r,), (nan_o,)),
                                                            compare_outputs((r,), (inf,))]
    _chunked(monkeypatch, size)
    assert [compare_outputs((r,), (o,)) for o in cases] + [compare_outputs((nan_r,), (nan_o,)),
                                                           compare_outputs((r,), (inf,))] == whole
    assert whole[:2] == [None, None]
    assert whole[2] == ("output: 3 of 200 elements outside atol=0.001 rtol=0.001; max abs err 2 "
                        f"(out {float(bad.view(-1)[150]):.6g} vs ref {float(r.view(-1)[150]):.6g})")
    assert whole[3] == "output: NaN pattern differs (2 NaN in reference, 2 in output)"
    assert whole[4] == "output: Inf pattern differs"


def test_chunked_integers_count_every_difference(monkeypatch):
    _chunked(monkeypatch, 3)
    r = torch.arange(20)
    out = r.clone()
    out[[0, 19]] = -1
    assert compare_outputs((r,), (out,)) == "output: 2 of 20 elements differ (exact match required)"


def test_chunked_widening_computes_the_exact_result_once(monkeypatch):
    _chunked(monkeypatch, 4)
    exact = torch.zeros(16, dtype=torch.float64)
    ref = torch.full((16,), 0.01)  # the reference's own error: 0.01 everywhere
    out = ref.clone()
    out[[1, 9, 14]] = -0.05  # 0.06 from the reference, 0.05 from the exact result: within 8 x 0.01
    calls = []

    def exact_fn():
        calls.append(1)
        return (exact,)

    assert compare_outputs((ref,), (out,), exact=exact_fn) is None
    assert len(calls) == 1
    out[9] = 0.5
    reason = compare_outputs((ref,), (out,), exact=exact_fn)
    assert reason.startswith("output: 1 of 16 elements outside") and "reference's own error 0.01" in reason


@pytest.mark.parametrize("size", [1, 5, 1 << 24])
def test_same_values_a_chunk_at_a_time(size):
    from kernelevolve.problem import same_values

    a = _ref(n=50)
    a[[2, 40]] = float("nan")
    b = a.clone()
    assert same_values(a, b, chunk=size)
    b[47] += 1.0
    assert not same_values(a, b, chunk=size)
    b = a.clone()
    b[41] = float("nan")
    assert not same_values(a, b, chunk=size)
    assert not same_values(a, a[:49], chunk=size)
    assert same_values(torch.arange(9), torch.arange(9), chunk=size)


# --- environment -------------------------------------------------------------------------------------------------
SECRETS = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GITHUB_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY",
           "AWS_SESSION_TOKEN", "PGPASSWORD", "GOOGLE_APPLICATION_CREDENTIALS", "my_api_key", "NPM_AUTH_TOKEN",
           "SSH_AUTH_SOCK", "Cookie_jar"]
KEEP = ["PATH", "HOME", "USER", "LANG", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET",
        "TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS", "LD_LIBRARY_PATH"]


def test_scrub_environment_removes_secrets_and_keeps_the_rest():
    env = {k: "value" for k in SECRETS + KEEP}
    clean = scrub_environment(env)
    assert sorted(clean) == sorted(KEEP)
    assert len(env) == len(SECRETS + KEEP)  # a copy: the argument is left alone


# --- tamper snapshots ----------------------------------------------------------------------------------------------
def test_untouched_snapshot_reports_nothing():
    assert checks.tampered(checks.timer_snapshot()) == []


@pytest.mark.parametrize("target, name, key", [
    (time, "perf_counter", "time.perf_counter"),
    (torch.cuda.Event, "elapsed_time", "torch.cuda.Event.elapsed_time"),
    (timing, "_perf", "timing._perf"),
    (timing, "measure", "timing.measure"),
])
def test_replaced_timer_is_reported(monkeypatch, target, name, key):
    snap = checks.timer_snapshot()
    monkeypatch.setattr(target, name, lambda *a, **k: 0.0)
    assert checks.tampered(snap) == [key]


def test_new_thread_is_seen():
    before = checks.live_threads()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert checks.live_threads() - before == {t.ident}
    finally:
        stop.set()
        t.join()
    assert checks.live_threads() == before


def test_child_process_is_seen():
    before = checks.child_processes()
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert checks.child_processes() - before == {p.pid}
    finally:
        p.kill()
        p.wait()
    assert p.pid not in checks.child_processes()


def test_an_output_rounded_in_a_lower_precision_is_judged_at_its_tolerance():
    """A float32 output whose reference went through bfloat16 arithmetic (Problem.rounded_in) is judged at bfloat16's
    tolerance: a kernel as precise as that reference passes; the same error on a plain float32 output fails."""
    ref = _ref(torch.float32)
    off = ref + 0.01 * ref.abs() + 0.004  # about one bfloat16 rounding step away
    assert compare_outputs((ref,), (off,)) is not None
    assert compare_outputs((ref,), (off,), rounded_in=("",)) is not None
    assert compare_outputs((ref,), (off,), rounded_in=("bfloat16",)) is None
    assert compare_outputs((ref,), (ref + 0.5,), rounded_in=("bfloat16",)) is not None  # still a tolerance
    assert checks.judged_as(torch.int64, ("bfloat16",), 0) == torch.int64  # integers stay exact


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_same_values_against_a_copy_in_host_memory():
    """The mutation check of inputs too large to copy on the device keeps its copy in host memory."""
    from kernelevolve.problem import same_values

    a = torch.randn(1000, device="cuda")
    a[7] = float("nan")
    b = a.cpu()
    assert same_values(a, b, chunk=64)
    b[999] += 1.0
    assert not same_values(a, b, chunk=64)
    assert same_values(torch.arange(9, device="cuda"), torch.arange(9), chunk=4)
    assert not same_values(torch.arange(9, device="cuda"), torch.arange(1, 10), chunk=4)
