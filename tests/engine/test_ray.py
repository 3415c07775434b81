"""The Ray executor against a real local Ray head (CPUs only, on 127.0.0.1): an optimization end to end, a bad
address, a worker killed mid-task (lost, or retried), the controller's deadline; and the error mapping without one."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kernelevolve.candidate import Candidate  # noqa: E402
from kernelevolve.engine import ExecutorError, make_pool  # noqa: E402
from kernelevolve.engine.ray import RayPool, describe, lost_reason, parse_address  # noqa: E402
from kernelevolve.evaluate import EvalConfig, Evaluator, Status, TimingConfig  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.store import Store  # noqa: E402

CLI = [sys.executable, "-m", "kernelevolve.cli"]
FAST_TIMING = TimingConfig(budget_ms=20.0, warmup_ms=5.0, max_reps=30)

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
'''

# The first attempt announces its process (the fork server's pid: its parent is the Ray worker), then holds its import
# until killed; a retry finds the mark and goes straight on.
HELD_CAND = '''
import os
import time

import torch
import torch.nn as nn

MARK = {mark!r}
if not os.path.exists(MARK):
    parent = os.getppid()
    with open(MARK + ".tmp", "w") as f:
        f.write(str(parent))
    os.replace(MARK + ".tmp", MARK)
    end = time.monotonic() + 60
    while time.monotonic() < end and os.getppid() == parent:  # ends with its parent
        time.sleep(0.05)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_command() -> list[str]:
    exe = Path(sys.executable).with_name("ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


@pytest.fixture(scope="module")
def head():
    """A Ray head of our own. ``--block`` keeps the starting process in the foreground: terminating it stops exactly
    the processes it started (where ``ray stop`` would stop every Ray instance of this user on the machine)."""
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="ke-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short socket paths
    log = Path(tmp) / "head.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(_ray_command() + [
            "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
            "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", tmp],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, TMPDIR=tmp))  # the workers' scratch folders go with the head
    try:
        end = time.monotonic() + 90
        while "will now block" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"the Ray head did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def problem_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray") / "relu2.py"
    path.write_text(PROBLEM)
    return path


def _evaluator(problem_file: Path, tmp_path: Path, timeout_s: float = 60.0) -> Evaluator:
    config = EvalConfig(device="cpu", timeout_s=timeout_s, trials=1, timing=FAST_TIMING, time_candidates=False)
    return Evaluator(load_problem(problem_file), config, tmp_path / "work")


def _ray_worker_of(mark: Path, timeout_s: float = 60.0) -> int:
    """The Ray worker evaluating the held candidate: the parent of the fork server that the candidate names."""
    end = time.monotonic() + timeout_s
    while not mark.exists():
        assert time.monotonic() < end, "the candidate never started"
        time.sleep(0.05)
    server = int(mark.read_text())
    worker = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    title = Path(f"/proc/{worker}/cmdline").read_bytes()
    assert title.startswith(b"ray::"), title  # a Ray worker, running our task
    return worker


def _gone(pid: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z" or time.monotonic() >= end:
            return state == "Z"
        time.sleep(0.1)


# --- with a cluster ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_optimize_through_ray(head, problem_file, tmp_path):
    out, db = tmp_path / "out", tmp_path / "ke.db"
    proc = subprocess.run(CLI + ["optimize", str(problem_file), "--device", "cpu", "--proposer", "template",
                                 "--executor", "ray", "--ray-address", head, "--max-evals", "3", "--db", str(db),
                                 "--out", str(out), "--timing-budget-ms", "50", "--timeout", "120"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "best.py").is_file() and (out / "report.html").is_file()
    store = Store(db)
    run = store.run("latest")
    assert run.status == "finished"
    assert run.device_key.startswith("cpu:")
    nodes = store.nodes(run.id)
    assert len(nodes) == 3 and all(n.result.status is Status.OK for n in nodes)
    for n in nodes:  # evaluated by Ray workers of this head (a local pool records no "ray" details)
        where = n.result.details["ray"]
        assert where["node"] and where["host"] == socket.gethostname() and where["pid"] != os.getpid()
    assert run.baseline.eager is not None


def test_unreachable_address_fails_at_once(problem_file, tmp_path):
    address = f"127.0.0.1:{_free_port()}"  # closed
    start = time.monotonic()
    with pytest.raises(ExecutorError, match=f"cannot reach the Ray cluster at {address}: "):
        make_pool(_evaluator(problem_file, tmp_path), None, "ray", address)
    assert time.monotonic() - start < 5
    assert not ray.is_initialized()


def test_cli_bad_address_exits_2(problem_file, tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    proc = subprocess.run(CLI + ["optimize", str(problem_file), "--device", "cpu", "--executor", "ray",
                                 "--ray-address", address, "--db", str(tmp_path / "ke.db"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60  # mostly importing torch
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"kernelevolve: error: cannot reach the Ray cluster at {address}: "
                                                f"Connection refused"]


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the Ray worker through /proc")


@needs_proc
@pytest.mark.parametrize("retries", [0, 1])
def test_worker_killed_mid_task(head, problem_file, tmp_path, retries):
    mark = tmp_path / "started"
    pool = RayPool(_evaluator(problem_file, tmp_path), 1, address=head, retries=retries)
    try:
        future = pool.submit(Candidate(HELD_CAND.format(mark=str(mark))))
        worker = _ray_worker_of(mark)
        os.kill(worker, signal.SIGKILL)
        result = future.result(timeout=120)
    finally:
        pool.shutdown()
    assert not ray.is_initialized()  # the pool connected, so it disconnected
    if retries == 0:
        assert result.status is Status.CRASHED, result
        assert result.reason.startswith("lost with its Ray worker or node after 0 retries: WorkerCrashedError"), \
            result.reason
    else:
        assert result.status is Status.OK, result
        assert result.details["ray"]["pid"] != worker  # the second attempt, in another worker process


def test_a_screen_batch_runs_as_one_task(head, problem_file, tmp_path):
    """The screen on a Ray worker: the batch's right, wrong and crashing candidates come back each with its own
    outcome, in their order."""
    right = "import torch, torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" \
            "        return torch.relu(x) * 2.0\n"
    wrong = right.replace("* 2.0", "* 3.0")
    crash = right.replace("        return", "        import os; os._exit(3)\n        return")
    pool = RayPool(_evaluator(problem_file, tmp_path), 1, address=head)
    try:
        results = pool.screen([Candidate(right), Candidate(wrong), Candidate(crash)]).result(timeout=240)
    finally:
        pool.shutdown()
    assert [r.status for r in results] == [Status.OK, Status.INCORRECT, Status.CRASHED], results


def test_a_head_to_head_runs_on_one_worker(head, problem_file, tmp_path):
    """The winner against the baselines on a Ray worker: every side in a process of its own there, the rounds and the
    verdict back to the controller. The candidate is the reference's own computation: it cannot win."""
    same = "import torch, torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" \
           "        return torch.relu(x) * 2.0\n"
    pool = RayPool(_evaluator(problem_file, tmp_path), 1, address=head)
    try:
        h2h = pool.head_to_head(Candidate(same), ["eager"])
    finally:
        pool.shutdown()
    assert not h2h.error, h2h.error
    assert h2h.rounds == 10 and set(h2h.round_ms) == {"candidate", "eager"} and not h2h.wins


@needs_proc
def test_deadline_cancels_a_stuck_task(head, problem_file, tmp_path):
    """A worker that stops answering (here SIGSTOPped) is cancelled past the evaluator's timeout plus the margin."""
    ray.init(address=head, logging_level="WARNING", log_to_driver=False)
    mark, worker = tmp_path / "started", None
    try:
        pool = RayPool(_evaluator(problem_file, tmp_path, timeout_s=10.0), 1, address=head, retries=0, margin_s=0.5)
        assert pool.device_key().startswith("cpu:")
        future = pool.submit(Candidate(HELD_CAND.format(mark=str(mark))))
        worker = _ray_worker_of(mark, timeout_s=9.0)
        os.kill(worker, signal.SIGSTOP)
        result = future.result(timeout=60)
        assert result.status is Status.TIMEOUT, result
        assert result.reason == "no answer from the Ray task within 10.5 s; the task was cancelled"
        assert _gone(worker, 30), "the cancelled task's worker is still there"
        pool.shutdown()
        assert ray.is_initialized()  # connected before the pool: left connected
    finally:
        if worker is not None and not _gone(worker, 0):
            os.kill(worker, signal.SIGCONT)
        ray.shutdown()


# --- without a cluster ------------------------------------------------------------------------------------------------
def test_addresses():
    assert parse_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert parse_address("ray://head.example:10001") == ("head.example", 10001)
    assert parse_address("[::1]:6379") == ("::1", 6379)
    assert parse_address("auto") is None
    for bad in ("head", "head:port", ":6379"):
        with pytest.raises(ExecutorError, match="bad Ray address"):
            parse_address(bad)


def test_lost_or_own_failure():
    rx = ray.exceptions
    assert lost_reason(rx.WorkerCrashedError()).startswith("WorkerCrashedError: The worker died unexpectedly")
    assert lost_reason(rx.NodeDiedError("node 3 died")) == "NodeDiedError: node 3 died"
    assert lost_reason(rx.OwnerDiedError("ab" * 14, "", "")) is not None
    assert lost_reason(rx.RayTaskError("f", "Traceback", rx.WorkerCrashedError())) is not None
    own = rx.RayTaskError("f", "Traceback", ValueError("a bug\nsecond line"))
    assert lost_reason(own) is None
    assert describe(own) == "ValueError: a bug"
    missing = RuntimeError("The remote function failed to import on the worker. sys.path [...]:\n\n"
                           "ModuleNotFoundError: No module named 'kernelevolve'")
    assert describe(missing) == "ModuleNotFoundError: No module named 'kernelevolve'"


class _FakeRay:
    """What RayPool calls of Ray, answering with one scripted outcome."""

    exceptions = ray.exceptions

    def __init__(self, outcome):
        self.outcome, self.cancelled = outcome, []

    def wait(self, refs, timeout):
        return ([], refs) if self.outcome == "hang" else (refs, [])

    def get(self, ref):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self, ref, force=False):
        self.cancelled.append(force)


class _FakeTask:
    def options(self, **options):
        assert options["retry_exceptions"] is False and options["max_retries"] == 2
        return self

    def remote(self, *args):
        return object()


def _fake_pool(outcome, problem_file, tmp_path) -> RayPool:
    pool = object.__new__(RayPool)
    pool.__dict__.update(_ray=_FakeRay(outcome), _tasks={"evaluate": _FakeTask()}, _refs=set(), _futures=set(),
                         _lock=threading.Lock(), _runtime_env=None, _accelerator=None, retries=2, margin_s=1.0,
                         _problem={}, _config={}, _gpu=None,
                         evaluator=_evaluator(problem_file, tmp_path, timeout_s=3.0))
    return pool


def test_pool_maps_task_outcomes(problem_file, tmp_path):
    crashed = _fake_pool(ray.exceptions.WorkerCrashedError(), problem_file, tmp_path)._evaluate(Candidate("x = 1"))
    assert crashed.status is Status.CRASHED
    assert crashed.reason.startswith("lost with its Ray worker or node after 2 retries: WorkerCrashedError")

    stuck = _fake_pool("hang", problem_file, tmp_path)
    timeout = stuck._evaluate(Candidate("x = 1"))
    assert timeout.status is Status.TIMEOUT and stuck._ray.cancelled == [True]
    assert "within 10 s" in timeout.reason  # 3 attempts of 3 s, plus 1 s

    ok = {"status": "ok", "reason": "verified", "details": {"ray": {"pid": 1}}}
    assert _fake_pool(json.dumps(ok), problem_file, tmp_path)._evaluate(Candidate("x = 1")).ok

    bug = ray.exceptions.RayTaskError("_evaluate_task", "Traceback", OSError("disk full"))
    with pytest.raises(ExecutorError, match="a Ray task failed: OSError: disk full"):
        _fake_pool(bug, problem_file, tmp_path)._evaluate(Candidate("x = 1"))
