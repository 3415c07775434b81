"""Isolation: a hang, crash or OOM fails that candidate only, leaves no process behind, and no secret reaches it."""
from __future__ import annotations

from kernelevolve.evaluate import Status


def test_hang_times_out_and_the_process_is_killed(untimed_evaluator, candidate, gone, tmp_path):
    pidfile = tmp_path / "hang.pid"
    r = untimed_evaluator.evaluate(candidate("hang", pidfile=str(pidfile)))
    assert r.status is Status.TIMEOUT, (r.reason, r.error)
    assert "no answer within 8 s" in r.reason and "killed" in r.reason
    assert gone(int(pidfile.read_text())), "the hung candidate process is still running"


def test_hang_kills_the_forked_grandchild_too(untimed_evaluator, candidate, gone, tmp_path):
    pidfile = tmp_path / "hang.pids"
    r = untimed_evaluator.evaluate(candidate("hang_with_grandchild", pidfile=str(pidfile)))
    assert r.status is Status.TIMEOUT, (r.reason, r.error)
    child, grandchild = map(int, pidfile.read_text().split())
    assert gone(child), "the hung candidate process is still running"
    assert gone(grandchild), "the candidate's grandchild survived the process-group kill"


def test_segfault_is_a_crash(untimed_evaluator, candidate):
    r = untimed_evaluator.evaluate(candidate("segfault"))
    assert r.status is Status.CRASHED, (r.reason, r.error)
    assert "SIGSEGV" in r.reason


def test_os_exit_zero_is_a_crash(untimed_evaluator, candidate):
    r = untimed_evaluator.evaluate(candidate("os_exit"))
    assert r.status is Status.CRASHED, (r.reason, r.error)
    assert "exited with code 0 before finishing" in r.reason


def test_sys_exit_zero_is_not_success(untimed_evaluator, candidate):
    r = untimed_evaluator.evaluate(candidate("sys_exit"))
    assert r.status in (Status.RUNTIME_ERROR, Status.CRASHED), (r.reason, r.error)
    assert "SystemExit" in r.reason


def test_huge_allocation_is_a_runtime_error(untimed_evaluator, candidate):
    r = untimed_evaluator.evaluate(candidate("oom"))
    assert r.status is Status.RUNTIME_ERROR, (r.reason, r.error)
    assert "allocate" in r.reason


def test_evaluator_survives_failures(untimed_evaluator, candidate):
    """After crashes and timeouts in the same evaluator, a genuine candidate still passes."""
    r = untimed_evaluator.evaluate(candidate("genuine_torch"))
    assert r.status is Status.OK, (r.reason, r.error)
    assert "untimed" in r.reason


def test_child_environment_holds_no_secret(secret_probe_results):
    status, reason = secret_probe_results["secrets_probe.py"]
    assert status == Status.OK.value, reason


def test_sweep_removes_blob_folders_of_dead_controllers(tmp_path, monkeypatch):
    import os
    import tempfile

    from kernelevolve.evaluate import process

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    dead = tmp_path / f"{process.BLOB_PREFIX}{2**22 + 12345}-abc"
    mine = tmp_path / f"{process.BLOB_PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for d in (dead, mine, other):
        d.mkdir()
    process.sweep_stale_blob_dirs()
    assert not dead.exists() and mine.exists() and other.exists()


_CONTROLLER = """
import sys
from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator
from kernelevolve.problem import load_problem

if __name__ == "__main__":
    problem, workdir, candidate = sys.argv[1:4]
    ev = Evaluator(load_problem(problem), EvalConfig(device="cpu", timeout_s=600, time_candidates=False), workdir)
    ev.evaluate(Candidate(open(candidate).read()))
"""


def test_an_evaluation_ends_when_its_controller_is_killed(candidate, gone, tmp_path):
    """kill -9 of the evaluating process (a controller, or a Ray worker) must not leave its candidate running with no
    deadline: the fork server exits with its owner, and the child dies with the server."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import CHEATS, ROOT

    pidfile = tmp_path / "pid"
    cand = tmp_path / "hang.py"
    cand.write_text(candidate("hang", pidfile=str(pidfile)).source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", _CONTROLLER, str(CHEATS / "problem_scale.py"), str(tmp_path / "w"),
                             str(cand)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (pidfile.exists() and pidfile.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the candidate never started"
            time.sleep(0.1)
        child = int(pidfile.read_text())
        assert not gone(child, 0.5)  # hanging in forward
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert gone(child, 15.0), "the candidate outlived its controller"
    finally:
        proc.kill()
        if pidfile.exists() and pidfile.read_text():  # a failed run must not leave the spinning child behind
            with contextlib.suppress(OSError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
