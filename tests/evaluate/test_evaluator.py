"""Every cheat class of DESIGN.md ("The evaluator: rules that keep it honest") has a candidate in tests/cheats that
the evaluator must give the right status, with a reason that names what was wrong."""
from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from kernelevolve.evaluate import Status

SCALE_KERNEL = "_scale_bias_relu_kernel"


# --- genuine candidates -------------------------------------------------------------------------------------------
def test_genuine_torch_is_ok_and_timed(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("genuine_torch"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed and r.timing is not None
    assert r.timing.method == "perf_counter" and 5 <= r.timing.reps <= 30
    assert 0 < r.timing.median_ms < 1000
    assert r.details["weights"] == "state_dict"  # the candidate was given the reference's weights
    # the host's launch time and the start of the timing are kept, to set a judge's time beside a trace
    assert 0 < r.details["host_ms"] <= r.timing.max_ms
    assert abs(r.details["timed_at"] - time.time()) < 120
    # and what the CPU did meanwhile (Linux): this process's share of a core, the machine's busy cores
    cores = os.cpu_count() + 0.5  # torch runs its CPU ops on several threads of this process
    assert 0 < r.details["cpu"]["self_cpu"] <= cores and 0 < r.details["cpu"]["busy_cores"] <= cores


def test_genuine_triton_runs_under_the_interpreter_untimed(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("genuine_triton"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert not r.timed and r.timing is None
    assert "interpreter" in r.reason
    assert r.details["kernels"] == [SCALE_KERNEL]


def test_in_place_candidate_is_allowed_when_the_reference_mutates(inplace_evaluator, candidate):
    assert inplace_evaluator.problem.mutates_inputs
    r = inplace_evaluator.evaluate(candidate("inplace_genuine"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timed


def test_throttled_candidate_median_reflects_real_calls(new_evaluator, candidate):
    """Sleeping 0.05 s on every 10th call shows in the maximum, not in the median, and the wall check accepts it."""
    from kernelevolve.evaluate import TimingConfig

    ev = new_evaluator("problem_scale.py", timing=TimingConfig(budget_ms=20.0, warmup_ms=5.0, min_reps=40,
                                                                 max_reps=40))
    r = ev.evaluate(candidate("throttled"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.timing is not None and r.timing.reps == 40
    assert r.timing.max_ms >= 90  # the candidate sleeps 100 ms
    assert r.timing.median_ms < 50
    assert r.details["host_ms"] < 50  # a median, like the time's


# --- wrong results and outputs of the wrong kind ------------------------------------------------------------------
@pytest.mark.parametrize("name, status, fragment", [
    ("wrong_output", Status.INCORRECT, "elements outside atol"),
    ("cache_first_call", Status.INCORRECT, "trial 2 shape 0: output:"),
    ("cache_by_pointer", Status.INCORRECT, "elements outside atol"),
    ("cache_by_id", Status.INCORRECT, "re-call with new values in the same input buffers"),
    ("hardcoded_seed", Status.INCORRECT, "trial 1 shape 0: output:"),
    ("shape_specialized", Status.INCORRECT, "trial 1 shape 1: output:"),
    ("mutates_input", Status.REJECTED, "modified input 0"),
    ("tensor_subclass", Status.REJECTED, "AlwaysClose, a torch.Tensor subclass"),
    ("returns_list", Status.INCORRECT, "output 0 is list, not a torch.Tensor"),
    ("returns_numpy", Status.INCORRECT, "output 0 is ndarray, not a torch.Tensor"),
    ("wrong_dtype", Status.INCORRECT, "dtype torch.float64, expected torch.float32"),
    ("wrong_shape", Status.INCORRECT, "shape (1, 64, 128), expected (64, 128)"),
    ("nan_output", Status.INCORRECT, "NaN pattern differs (0 NaN in reference, 1 in output)"),
    ("wrong_device", Status.INCORRECT, "output 0 is on meta, expected cpu"),
])
def test_wrong_results(scale_evaluator, candidate, name, status, fragment):
    r = scale_evaluator.evaluate(candidate(name))
    assert r.status is status, (r.reason, r.error)
    assert fragment in r.reason
    assert r.timing is None and not r.timed


# --- Triton candidates that do not do their work in their kernels --------------------------------------------------
@pytest.mark.parametrize("name, fragment", [
    ("triton_ghost", "still correct with the candidate's Triton kernels disabled"),
    ("triton_never_launched", "launched none"),
])
def test_triton_kernels_must_do_the_work(scale_evaluator, candidate, name, fragment):
    r = scale_evaluator.evaluate(candidate(name))
    assert r.status is Status.REJECTED, (r.reason, r.error)
    assert fragment in r.reason


# --- tampering with the clocks and leaving work behind ---------------------------------------------------------------
@pytest.mark.parametrize("name, fragment", [
    ("patch_perf_counter", "timing functions replaced after import: time.perf_counter"),
    ("patch_cuda_event", "torch.cuda.Event.elapsed_time"),
    ("patch_harness_clock", "timing._perf"),
    ("thread_outlives_call", "thread(s) started by the candidate still running after call"),
])
def test_tampering_is_rejected(scale_evaluator, candidate, name, fragment):
    r = scale_evaluator.evaluate(candidate(name))
    assert r.status is Status.REJECTED, (r.reason, r.error)
    assert fragment in r.reason


def test_time_cannot_be_hidden_in_the_harness_flush(scale_evaluator, candidate):
    """A TorchFunctionMode that would spend 0.1 s in every cache flush never sees it: the harness flushes and refills
    inputs with modes off, so no time hides between the timed calls."""
    r = scale_evaluator.evaluate(candidate("hidden_work_in_flush"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert r.details["parent_wall_s"] < 0.1 * r.details["reps"]


@pytest.mark.parametrize("name, when", [("subprocess_at_import", "import"), ("subprocess_in_forward", "call")])
def test_process_outliving_the_call_is_rejected_and_killed(untimed_evaluator, candidate, gone, tmp_path, name, when):
    pidfile = tmp_path / "helper.pid"
    r = untimed_evaluator.evaluate(candidate(name, pidfile=str(pidfile)))
    assert r.status is Status.REJECTED, (r.reason, r.error)
    assert f"child process(es) still running after {when}" in r.reason
    assert gone(int(pidfile.read_text())), "the helper process survived the evaluation"


# --- the result channel cannot be forged by printing ---------------------------------------------------------------
@pytest.mark.parametrize("name, marker", [("forged_stdout", "FORGED-PRINT"), ("forged_fds", "FORGED-FD")])
def test_forged_output_is_only_a_log(scale_evaluator, candidate, name, marker):
    r = scale_evaluator.evaluate(candidate(name))
    assert r.status is Status.INCORRECT, (r.reason, r.error)
    assert r.log.count(marker) >= 2  # stdout and stderr both land in the log
    assert marker not in r.reason + r.error + repr(r.details)
    assert r.timing is None and r.speedup_eager is None


# --- candidates that do not load ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fragment", [
    ("syntax_error.txt", "syntax error at line 5"),
    ("import_error", "import failed: ModuleNotFoundError"),
    ("no_modelnew", "defines no class ModelNew"),
    ("triton_compile_error", "no_such_function"),
])
def test_compile_errors(scale_evaluator, candidate, name, fragment):
    r = scale_evaluator.evaluate(candidate(name))
    assert r.status is Status.COMPILE_ERROR, (r.reason, r.error)
    assert fragment in r.reason


def test_work_skipped_only_while_timed_is_caught(scale_evaluator, candidate):
    """Outputs of randomly chosen timed repetitions are checked against the reference too."""
    r = scale_evaluator.evaluate(candidate("stack_inspection"))
    assert r.status is Status.INCORRECT and "timed repetition" in r.reason, r.reason


def test_input_mutation_hidden_by_a_torch_function_mode_is_rejected(scale_evaluator, candidate):
    r = scale_evaluator.evaluate(candidate("hidden_mutation"))
    assert r.status is Status.REJECTED


def test_skipping_the_reference_in_place_update_is_incorrect(inplace_evaluator, candidate):
    r = inplace_evaluator.evaluate(candidate("inplace_skips_mutation"))
    assert r.status is Status.INCORRECT, r.reason


def test_daemon_escaping_to_its_own_session_is_rejected_and_killed(untimed_evaluator, candidate, gone, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    r = untimed_evaluator.evaluate(candidate("escaped_daemon", pidfile=str(pidfile)))
    pid = int(pidfile.read_text())
    try:
        assert gone(pid, wait_s=1.0), f"daemon {pid} survived; status {r.status.value}: {r.reason}"
        assert r.status is Status.REJECTED and "child process" in r.reason, r.reason
    finally:
        if not gone(pid, wait_s=0):
            os.kill(pid, signal.SIGKILL)


def test_large_outputs_travel_through_a_blob_file(tmp_path, candidate):
    """Outputs over a megabyte go through a file in a private blob folder, which is removed afterwards."""
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
    from kernelevolve.problem import load_problem

    problem = tmp_path / "problem_big.py"
    source = (Path(__file__).resolve().parents[1] / "cheats" / "problem_scale.py").read_text()
    problem.write_text(source.replace("DIM = 128", "DIM = 512").replace("randn(64, DIM)", "randn(1024, DIM)"))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    mine = f"kernelevolve-blobs-{os.getpid()}-"  # other processes on the machine may hold blob folders meanwhile
    before = {d for d in os.listdir(shm) if d.startswith(mine)}
    cfg = EvalConfig(device="cpu", timeout_s=60.0, timing=TimingConfig(budget_ms=20.0, warmup_ms=5.0, max_reps=30))
    ev = Evaluator(load_problem(problem), cfg, tmp_path / "work")
    r = ev.evaluate(candidate("genuine_torch"))
    assert r.status is Status.OK, (r.reason, r.error)
    wrong = ev.evaluate(candidate("wrong_output"))
    assert wrong.status is Status.INCORRECT, wrong.reason
    assert {d for d in os.listdir(shm) if d.startswith(mine)} <= before


def test_state_the_reference_updates_is_judged(running_stats_evaluator, candidate):
    """Batch norm in training mode updates its running statistics on every call: a candidate that only normalises
    is incorrect; one that does both (the reference's own module) is ok."""
    assert running_stats_evaluator.problem.mutated_state == ("bn.running_mean", "bn.running_var",
                                                             "bn.num_batches_tracked")
    r = running_stats_evaluator.evaluate(candidate("skips_running_stats"))
    assert r.status == Status.INCORRECT, f"{r.status.value}: {r.reason}"
    r = running_stats_evaluator.evaluate(candidate("keeps_running_stats"))
    assert r.ok, f"{r.status.value}: {r.reason}\n{r.error[-600:]}"
    # updates only in its first calls, none while timed: the checked timed repetitions compare the state too
    r = running_stats_evaluator.evaluate(candidate("stats_only_first_calls"))
    assert r.status == Status.INCORRECT and "timed repetition" in r.reason, f"{r.status.value}: {r.reason}"
    # sets its own starting state (the count one call leaves) and never counts: every call starts from the reference's
    r = running_stats_evaluator.evaluate(candidate("chooses_initial_state"))
    assert r.status == Status.INCORRECT, f"{r.status.value}: {r.reason}"
    # skips the update only inside the timing loop: the checked timed repetitions compare the state too
    r = running_stats_evaluator.evaluate(candidate("state_skipped_while_timed"))
    assert r.status == Status.INCORRECT and "timed repetition" in r.reason, f"{r.status.value}: {r.reason}"
