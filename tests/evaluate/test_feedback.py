"""The feedback on a failed candidate: a one-line reason that hides no value errors, the mismatch report (where and
how outputs are wrong), and the failure text for every status."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Result, Status, checks, mismatch
from kernelevolve.evaluate.checks import compare_outputs
from kernelevolve.evaluate.feedback import describe_failure, mismatch_text
from kernelevolve.evaluate.mismatch import mismatch_details, mismatch_report
from kernelevolve.evaluate.result import ScreenResult, Timing


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _store_mask() -> tuple[torch.Tensor, torch.Tensor, int]:
    """A store mask off by a dimension: columns 64-95 never written (left 0), one of them holding a NaN. Also the
    number of finite elements outside the tolerance."""
    ref = _randn(64, 128)
    out = ref.clone()
    out[:, 64:96] = 0
    out[5, 80] = float("nan")
    region = ref[:, 64:96]
    outside = region.abs() > 1e-3 + 1e-3 * region.abs()
    outside[5, 16] = False  # the NaN: a pattern error, not a value error
    return ref, out, int(outside.sum())


# --- the one-line reason ----------------------------------------------------------------------------------------
def test_reason_names_both_the_nan_and_the_value_errors():
    ref, out, n = _store_mask()
    reason = compare_outputs((ref,), (out,))
    assert reason.startswith("output: NaN pattern differs (0 NaN in reference, 1 in output); ")
    assert f"{n} of 8192 elements outside atol=0.001 rtol=0.001; max abs err" in reason
    assert "out 0 vs ref" in reason


def test_inf_on_one_side_is_a_pattern_error_not_a_value_error():
    ref = torch.ones(8)
    out = ref.clone()
    out[3] = float("inf")
    assert compare_outputs((ref,), (out,)) == "output: Inf pattern differs"
    out[5] = 2.0
    assert compare_outputs((ref,), (out,)) == ("output: Inf pattern differs; 1 of 8 elements outside atol=0.001 "
                                               "rtol=0.001; max abs err 1 (out 2 vs ref 1)")


# --- the mismatch report ------------------------------------------------------------------------------------------
def test_store_mask_report():
    ref, out, n = _store_mask()
    report = mismatch_report((ref,), (out,))
    json.dumps(report, allow_nan=False)  # stored as JSON: NaN and Inf values are text
    assert report["output"] == 0 and report["shape"] == [64, 128] and report["dtype"] == "float32"
    assert (report["atol"], report["rtol"]) == (1e-3, 1e-3)
    assert report["wrong"] == n + 1 and report["outside_tolerance"] == n
    assert report["wrong_share"] == pytest.approx((n + 1) / 8192, abs=1e-6)
    region = ref[:, 64:96].clone()
    region[5, 16] = 0
    assert report["max_abs_err"] == pytest.approx(float(region.abs().max()), rel=1e-5)
    assert report["max_rel_err"] == 1.0
    assert report["where"]["summary"].startswith("columns 64-95 of 128 wrong in every row")
    assert report["where"]["columns"] == [[64, 95]] and report["where"]["rows"] == [[0, 63]]
    zeros = report["zeros"]
    assert zeros["count"] == n and zeros["never_written"] and zeros["columns"] == [[64, 95]]
    assert report["nan"] == {"ref": 0, "out": 1} and report["inf"] == {"ref": 0, "out": 0}
    assert report["nan_inf_differs"] == [{"index": [5, 80], "out": "nan", "ref": pytest.approx(float(ref[5, 80]),
                                                                                                 rel=1e-5)}]
    cut = report["slice"]
    assert cut["first_wrong"] == [0, 64] and cut["rows"] == [0, 3] and cut["columns"] == [62, 67]
    assert cut["out"][0][2:] == [0.0] * 4 and cut["ref"][0][2] == pytest.approx(float(ref[0, 64]), rel=1e-5)
    text = mismatch_text(report)
    assert "columns 64-95 of 128 wrong in every row" in text and "(never written?)" in text
    assert "NaN: 0 in reference, 1 in output" in text and "[5, 80]" in text
    assert len(text.splitlines()) < 40


def test_largest_errors_with_their_indices():
    ref = torch.zeros(10, 10)
    out = ref.clone()
    for k, (i, j) in enumerate([(0, 1), (9, 9), (4, 2), (2, 7), (7, 0), (5, 5)]):
        out[i, j] = k + 1.0
    report = mismatch_report((ref,), (out,))
    assert [e["index"] for e in report["largest"]] == [[5, 5], [7, 0], [2, 7], [4, 2], [9, 9]]
    assert report["largest"][0] == {"index": [5, 5], "out": 6.0, "ref": 0.0, "abs_err": 6.0}
    assert report["max_rel_err"] == "inf"  # an error beside a reference of 0


def test_rows_pattern():
    ref = _randn(1024, 16)
    out = ref.clone()
    out[:17] += 1
    assert mismatch_report((ref,), (out,))["where"]["summary"] == "rows 0-16 of 1024 wrong in every column"


def test_block_pattern():
    ref = _randn(64, 128)
    out = ref.clone()
    out[8:16, 32:48] += 1
    report = mismatch_report((ref,), (out,))
    assert report["where"]["summary"] == "a block: rows 8-15 of 64 x columns 32-47 of 128 wrong"
    assert report["zeros"] is None


def test_scattered_pattern():
    ref = _randn(64, 128)
    out = ref.clone()
    picked = torch.randperm(ref.numel(), generator=torch.Generator().manual_seed(3))[:37]
    out.view(-1)[picked] += 5
    rows, cols = (picked // 128).unique().numel(), (picked % 128).unique().numel()
    report = mismatch_report((ref,), (out,))
    assert report["where"]["summary"] == f"scattered: 37 elements in {rows} rows and {cols} columns"
    assert report["where"]["n_rows"] == rows and report["where"]["n_columns"] == cols


def test_nan_and_inf_positions():
    ref = _randn(16, 16)
    ref[3, 4] = float("inf")
    ref[1, 1] = float("nan")
    out = ref.clone()
    out[3, 4] = -float("inf")
    out[7, 9] = float("inf")
    out[1, 1] = 0.5
    report = mismatch_report((ref,), (out,))
    assert report["inf"] == {"ref": 1, "out": 2} and report["nan"] == {"ref": 1, "out": 0}
    assert [e["index"] for e in report["nan_inf_differs"]] == [[1, 1], [3, 4], [7, 9]]
    assert report["nan_inf_differs"][1] == {"index": [3, 4], "out": "-inf", "ref": "inf"}
    assert report["outside_tolerance"] == 0 and report["largest"] == [] and report["max_abs_err"] is None
    assert "positions differ at [1, 1] out 0.5 vs ref nan" in mismatch_text(report)


def test_rank_one_output():
    ref = _randn(1000)
    out = ref.clone()
    out[100:200] = 0
    report = mismatch_report((ref,), (out,))
    assert report["layout"] is None
    assert report["where"]["summary"] == "elements 100-199 of 1000"
    assert report["zeros"]["never_written"] and report["slice"]["rows"] is None
    assert report["slice"]["columns"] == [98, 103] and report["largest"][0]["index"][0] in range(100, 200)
    assert "elements 98-103 around the first wrong element [100]" in mismatch_text(report)


def test_rank_three_output_is_read_as_rows_of_its_last_dimension():
    ref = _randn(4, 8, 16)
    out = ref.clone()
    out[:, :, 3] = -ref[:, :, 3]
    report = mismatch_report((ref,), (out,))
    assert report["layout"] == {"rows": 32, "columns": 16}
    assert report["where"]["summary"] == "column 3 of 16 wrong in every row"
    assert len(report["largest"][0]["index"]) == 3 and report["slice"]["first_wrong"] == [0, 0, 3]
    assert "32 rows (dims 0-1 flattened) x 16 columns" in mismatch_text(report)


def test_integers_report_a_single_element():
    ref = torch.arange(100).reshape(10, 10)
    out = ref.clone()
    out[2, 3] = 7
    report = mismatch_report((ref,), (out,))
    assert report["where"]["summary"] == "a single element: row 2, column 3"
    assert report["largest"] == [{"index": [2, 3], "out": 7, "ref": 23, "abs_err": 16.0}]
    assert type(report["largest"][0]["out"]) is int
    assert "exact match required" in mismatch_text(report)


def test_the_first_failing_output_is_reported():
    ref = (torch.zeros(3), torch.zeros(2, 4))
    out = (torch.zeros(3), torch.ones(2, 4))
    report = mismatch_report(ref, out)
    assert report["output"] == 1 and report["outputs"] == 2
    assert mismatch_text(report).startswith("output 1 (of 2): shape (2, 4)")


def test_no_report_for_matching_outputs_or_a_structural_mismatch():
    ref = _randn(4, 4)
    assert mismatch_report((ref,), (ref.clone(),)) is None
    assert mismatch_report((ref,), (ref.T.clone()[:2],)) is None
    assert mismatch_report((ref,), (ref.double(),)) is None
    assert mismatch_report((ref,), ()) is None


@pytest.mark.parametrize("size", [1, 7, 200, 1 << 24])
def test_the_report_is_the_same_a_chunk_at_a_time(monkeypatch, size):
    cases = [_store_mask()[:2]]
    ref = _randn(1000)
    out = ref.clone()
    out[[3, 4, 5, 500, 998]] = 0
    cases.append((ref, out))
    whole = [mismatch_report((r,), (o,)) for r, o in cases]
    monkeypatch.setattr(checks, "COMPARE_CHUNK", size)
    assert [mismatch_report((r,), (o,)) for r, o in cases] == whole
    assert whole[1]["where"]["elements"] == [[3, 5], [500, 500], [998, 998]] and whole[1]["where"]["runs"] == 3


def test_the_report_judges_against_the_float64_result_as_the_comparison_does():
    ref = torch.full((16,), 0.01)  # the reference's own error: 0.01 everywhere
    out = ref.clone()
    out[[1, 9]] = torch.tensor([-0.05, 0.5])  # 1: within 8x the reference's own error of the exact result; 9: not
    exact = (lambda: (torch.zeros(16, dtype=torch.float64),))
    assert compare_outputs((ref,), (out,), exact=exact).startswith("output: 1 of 16 elements outside")
    report = mismatch_report((ref,), (out,), exact=exact)
    assert report["wrong"] == 1 and report["largest"][0]["index"] == [9]
    assert report["ref_own_error"] == pytest.approx(0.01)


def test_a_failing_report_never_fails_the_caller(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(mismatch, "mismatch_report", broken)
    with caplog.at_level("DEBUG", logger="kernelevolve.evaluate.mismatch"):
        assert mismatch_details((torch.zeros(2),), (torch.ones(2),)) == {}
    assert "boom" in caplog.text


# --- describe_failure ------------------------------------------------------------------------------------------
_KERNEL_SOURCE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _broken_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _broken_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
        return y
'''
_INTERPRETER_ERROR = '''Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/triton/runtime/interpreter.py", line 1511, in __call__
    self.fn(**args)
  File "/tmp/ke/cand_b5eac3fde430_834844.py", line 11, in _broken_kernel
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=offs < n)
                           ^^^^^^^^^^^^^^^^^^^
AttributeError: module 'triton.language' has no attribute 'no_such_function'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/src/kernelevolve/evaluate/worker.py", line 455, in _call
    out = self.model(*inputs)
          ^^^^^^^^^^^^^^^^^^^
  File "/tmp/ke/cand_b5eac3fde430_834844.py", line 17, in forward
    _broken_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
  File "/venv/lib/python3.11/site-packages/triton/runtime/interpreter.py", line 1515, in __call__
    raise InterpreterError(repr(e)) from e
triton.runtime.errors.InterpreterError: AttributeError("module 'triton.language' has no attribute 'no_such_function'")
'''
_COMPILATION_ERROR = '''Traceback (most recent call last):
  File "/src/kernelevolve/evaluate/worker.py", line 455, in _call
    out = self.model(*inputs)
  File "/tmp/ke/screen_b5eac3fde430_834844_0.py", line 17, in forward
    _broken_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
  File "/venv/lib/python3.11/site-packages/triton/compiler/compiler.py", line 80, in make_ir
    return ast_to_ttir(self.fn, self, context=context, options=options, codegen_fns=codegen_fns,
triton.compiler.errors.CompilationError: at 4:27:
def _broken_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=offs < n)
                           ^
AttributeError("module 'triton.language' has no attribute 'no_such_function'")
'''


def test_compile_error_quotes_the_candidate_lines_with_their_numbers():
    r = Result(Status.COMPILE_ERROR, "InterpreterError: AttributeError(...)", error=_INTERPRETER_ERROR)
    text = describe_failure(r, _KERNEL_SOURCE)
    assert text.startswith("compile_error: InterpreterError")
    assert "candidate line 11, in _broken_kernel:" in text and "candidate line 17, in forward:" in text
    assert "  >   11 |     tl.store(y_ptr + offs, tl.no_such_function(x), mask=offs < n)" in text
    assert "      10 |     x = tl.load(x_ptr + offs, mask=offs < n)" in text
    marker = next(x for x in text.splitlines() if x.strip().startswith("^^^"))
    assert marker.index("^") == text.splitlines()[text.splitlines().index(marker) - 1].index("tl.no_such")
    assert text.splitlines()[-1].startswith("triton.runtime.errors.InterpreterError: AttributeError(")
    bare = describe_failure(r)  # without the source: the lines as the traceback shows them
    assert "candidate line 11, in _broken_kernel:\n  > tl.store(y_ptr" in bare


def test_triton_compilation_error_message_is_kept():
    r = Result(Status.COMPILE_ERROR, "CompilationError: at 4:27: AttributeError(...)", error=_COMPILATION_ERROR)
    text = describe_failure(r, _KERNEL_SOURCE)
    assert _COMPILATION_ERROR[_COMPILATION_ERROR.index("triton.compiler.errors"):].strip() in text
    assert "candidate line 17, in forward:" in text
    assert "(Triton's line 4 of the kernel is line 11 of the candidate)" in text


def test_syntax_error_points_at_its_line():
    error = ('Traceback (most recent call last):\n  File "/src/kernelevolve/problem.py", line 68, in import_module\n'
             '    spec.loader.exec_module(module)\n  File "/tmp/ke/cand_02348bb2597e_739225.py", line 2\n'
             '    class ModelNew(torch.nn.Module:\n                                  ^\nSyntaxError: invalid syntax\n')
    r = Result(Status.COMPILE_ERROR, "syntax error at line 2: invalid syntax", error=error)
    text = describe_failure(r, "import torch\nclass ModelNew(torch.nn.Module:\n    pass\n")
    assert "  >    2 | class ModelNew(torch.nn.Module:" in text and text.endswith("SyntaxError: invalid syntax")


@pytest.mark.parametrize("reason, rule", [
    ("output is still correct with the candidate's Triton kernels disabled", "must be done in its own kernels"),
    ("defines Triton kernels but launched none of them", "compute its outputs with them"),
    ("timing functions replaced after call: time.perf_counter", "not the candidate's to replace"),
    ("1 thread(s) started by the candidate still running after call", "a thread the candidate starts"),
    ("2 child process(es) still running after import", "a process the candidate starts"),
    ("forward modified input 0 (the reference does not)", "leave its inputs as they were"),
    ("output 0 is a AlwaysClose, a torch.Tensor subclass", "plain torch.Tensor"),
    ("timed loop took 2.000 s by the parent's clock but the runs report 0.100 s: forged or hidden timing",
     "work hidden outside the timed calls"),
    ("protocol violation: expected 'output', got 'timed'", "not the candidate's"),
])
def test_rejection_explains_the_rule(reason, rule):
    text = describe_failure(Result(Status.REJECTED, reason))
    assert text.startswith(f"rejected: {reason}\n") and rule in text


def test_incorrect_result_carries_the_report_within_the_budget():
    ref, out, _ = _store_mask()
    reason = "trial 1 shape 0: " + compare_outputs((ref,), (out,))
    r = Result(Status.INCORRECT, reason, details={"mismatch": mismatch_report((ref,), (out,))})
    text = describe_failure(r)
    assert text.startswith(f"incorrect: {reason}\n") and "columns 64-95 of 128 wrong in every row" in text
    short = describe_failure(r, max_chars=400)
    assert len(short) <= 400 and short.endswith("[... cut]")


def test_timeout_and_crash_show_the_log_tail():
    log = "\n".join(f"line {k}" for k in range(100)) + "\nCUDA error: an illegal memory access was encountered\n"
    text = describe_failure(Result(Status.CRASHED, "candidate process killed by SIGSEGV", log=log))
    assert "CUDA error: an illegal memory access" in text and "line 99" in text and "line 50\n" not in text
    assert "log tail:" in describe_failure(Result(Status.TIMEOUT, "no answer within 8 s", log="stuck"))


def test_ok_result_gives_its_time_and_ratios():
    r = Result(Status.OK, "verified", timing=Timing(0.5, 0.4, 0.7, 20, "cuda-events"), timed=True)
    text = describe_failure(r, eager_ms=1.0, compile_ms=0.75, floor_ms=0.25)
    assert text.splitlines() == ["ok: 0.5 ms (median of 20, cuda-events)", "eager PyTorch: 1 ms, speedup 2.00x",
                                 "torch.compile: 0.75 ms, speedup 1.50x", "roofline floor: 0.25 ms, 2.00x the floor"]
    assert "eager PyTorch: 1.5 ms, speedup 3.00x" in describe_failure(replace(r, speedup_eager=3.0))
    assert describe_failure(ScreenResult(Status.OK, "checked once", ms=2.0)) == "ok: 2 ms"


def test_screen_result_keeps_its_details_and_reads_old_rows():
    s = ScreenResult(Status.INCORRECT, "output: wrong", details={"mismatch": {"wrong": 3}})
    assert ScreenResult.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    old = {"status": "incorrect", "reason": "output: wrong", "ms": None}
    assert ScreenResult.from_dict(old).details == {}


# --- end to end: the judge ----------------------------------------------------------------------------------------
_STORE_MASK_CANDIDATE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * self.scale + self.bias)
        y[:, 64:96] = 0  # the columns a store mask off by a dimension never writes
        return y
'''


def test_judge_puts_the_mismatch_report_into_an_incorrect_result(new_evaluator):
    r = new_evaluator("problem_scale.py", time_candidates=False).evaluate(Candidate(_STORE_MASK_CANDIDATE))
    assert r.status is Status.INCORRECT and r.reason.startswith("trial 1 shape 0: output:"), (r.reason, r.error)
    report = r.details["mismatch"]
    assert report["shape"] == [64, 128] and report["wrong"] > 0
    # relu: where the reference is 0 too, the unwritten columns hold no error; all errors are zeros in 64-95
    assert report["zeros"]["never_written"] and report["zeros"]["count"] == report["wrong"]
    assert all(64 <= a <= b <= 95 for a, b in report["where"]["columns"]), report["where"]
    assert f"{report['outside_tolerance']} of 8192 elements outside" in r.reason
    json.dumps(r.to_dict(), allow_nan=False)
    text = describe_failure(r, _STORE_MASK_CANDIDATE)
    assert "(never written?)" in text and report["where"]["summary"] in text


def test_judge_reports_a_timed_repetition_mismatch(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("stack_inspection"))
    assert r.status is Status.INCORRECT and "timed repetition" in r.reason, r.reason
    assert r.details["mismatch"]["shape"] == [64, 128]
