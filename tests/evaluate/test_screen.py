"""The screen: a batch checked once and timed briefly in isolated processes, its culprits named one by one."""
from __future__ import annotations

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Status
from kernelevolve.evaluate.screen import ScreenConfig, Screener


def _slow(candidate) -> Candidate:
    """The genuine candidate with 4 ms of sleep in every call."""
    return Candidate(candidate("genuine_torch").source.replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import time; time.sleep(0.004)\n"))


@pytest.fixture
def screener(new_evaluator):
    with Screener(new_evaluator("problem_scale.py"), ScreenConfig(timeout_s=10.0, parallel=2)) as s:
        yield s


def test_a_batch_is_ranked_and_every_culprit_is_named(screener, candidate, tmp_path):
    """Crashes, hangs and wrong outputs fail their own candidate only: those after them in the batch are still
    screened, and the genuine ones are timed in the order of their real speed."""
    names = ["genuine_torch", "wrong_output", "segfault", "slow", "hang", "no_modelnew", "os_exit", "genuine_triton",
             "mutates_input"]
    batch = [_slow(candidate) if n == "slow" else candidate(n, pidfile=str(tmp_path / "pid")) for n in names]
    seen = {}
    results = screener.screen(batch, on_screened=lambda i, r: seen.setdefault(i, r))
    got = {n: r for n, r in zip(names, results)}
    assert got["genuine_torch"].ok and got["slow"].ok and got["genuine_triton"].ok, got
    assert got["wrong_output"].status is Status.INCORRECT
    assert got["segfault"].status is Status.CRASHED
    assert got["hang"].status is Status.TIMEOUT
    assert got["no_modelnew"].status is Status.COMPILE_ERROR
    assert got["os_exit"].status in (Status.CRASHED, Status.RUNTIME_ERROR)
    assert got["mutates_input"].status is Status.REJECTED
    # timed on the CPU; Triton under the interpreter is checked only
    assert got["genuine_triton"].ms is None and "untimed" in got["genuine_triton"].reason
    assert got["genuine_torch"].ms < got["slow"].ms and got["slow"].ms >= 4.0
    assert got["slow"].host_ms >= 4.0 and got["slow"].timed_at is not None  # on the CPU the host time is the time
    assert got["genuine_triton"].host_ms is None
    assert got["slow"].details["cpu"]["self_cpu"] >= 0 and "cpu" not in got["genuine_triton"].details
    assert sorted(seen) == list(range(len(names)))


def test_a_screen_never_verifies(screener, candidate):
    """A candidate right only on the first call passes the screen's single check: the judge must still catch it."""
    cached = candidate("cache_first_call")
    r = screener.screen([cached])[0]
    assert r.status in (Status.OK, Status.INCORRECT)
    assert screener.evaluator.evaluate(cached).status is not Status.OK


def test_what_a_candidate_leaves_behind_is_not_the_next_ones_fault(screener, candidate):
    """A candidate that replaces a timer and then fails to import, and one that leaves a thread running: each is
    judged by itself, and the genuine candidate after it in the same process still passes."""
    tamper = Candidate("import time\ntime.perf_counter = lambda: 0.0\nraise ImportError('gone')\n")
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    results = one.screen([tamper, candidate("genuine_torch"), candidate("thread_outlives_call"),
                          candidate("genuine_torch")])
    assert results[0].status is Status.COMPILE_ERROR
    assert results[1].ok, results[1]
    assert results[2].status is Status.REJECTED and "thread" in results[2].reason, results[2]
    assert results[3].ok, results[3]


def test_a_candidate_that_scribbles_on_its_weights_leaves_the_next_ones_intact(screener, candidate):
    """The reference's weights are read once per process and copied into each candidate: a candidate that zeroes its
    parameters after its call does not zero those of the next candidate in the same process."""
    scribbler = Candidate(candidate("genuine_torch").source.replace(
        "        return torch.addcmul(self.bias, x, self.scale).clamp_min_(0)",
        "        y = torch.addcmul(self.bias, x, self.scale).clamp_min_(0)\n"
        "        with torch.no_grad():\n"
        "            self.scale.zero_(); self.bias.zero_()\n"
        "        return y"))
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    results = one.screen([scribbler, candidate("genuine_torch"), scribbler, candidate("genuine_torch")])
    assert results[1].ok and results[3].ok, results


def test_the_deadline_runs_only_while_the_child_works(screener, candidate, monkeypatch):
    """The parent's own comparison can take longer than a candidate's deadline: no candidate is blamed for it."""
    import time

    from kernelevolve.evaluate import screen as screen_module

    original = screen_module.compare_outputs

    def slow(*args, **kwargs):
        time.sleep(6.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(screen_module, "compare_outputs", slow)
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=4.0, parallel=1))
    results = one.screen([candidate("genuine_torch"), candidate("genuine_torch").__class__(
        candidate("genuine_torch").source + "\n# another source\n")])
    assert [r.status for r in results] == [Status.OK, Status.OK], results


def _logging(candidate, log, name: str, sleep_s: float = 0.0) -> Candidate:
    """The genuine candidate, which writes its name and process id to ``log`` when it is imported."""
    source = candidate("genuine_torch").source
    return Candidate(f"import os as _os, time as _time\nwith open({str(log)!r}, 'a') as _f:\n"
                     f"    _f.write('{name} ' + str(_os.getpid()) + '\\n')\n_time.sleep({sleep_s})\n" + source)


def test_a_slow_candidate_holds_up_one_process_not_a_share_of_the_batch(screener, candidate, tmp_path):
    """The check processes take candidates from one queue: while one compiles a slow candidate, the other checks
    every other candidate of the batch."""
    log = tmp_path / "imports.txt"
    cands = [_logging(candidate, log, "slow", 8.0)] + [_logging(candidate, log, f"c{i}") for i in range(4)]
    results = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=2)).screen(cands)
    assert all(r.ok for r in results), results
    first: dict[str, str] = {}  # the check stage imports each first; the time stage again, in one process
    for line in log.read_text().split("\n"):
        if line:
            name, pid = line.split()
            first.setdefault(name, pid)
    others = {first[f"c{i}"] for i in range(4)}
    assert first["slow"] not in others and len(others) == 1, first


def test_a_template_candidate_gets_the_shorter_deadline_on_the_gpu(screener):
    from types import SimpleNamespace

    cfg = ScreenConfig(timeout_s=120.0, template_timeout_s=30.0)
    on_gpu = Screener(SimpleNamespace(config=SimpleNamespace(device="cuda")), cfg)
    on_cpu = Screener(SimpleNamespace(config=SimpleNamespace(device="cpu")), cfg)
    template, inductor = Candidate("x = 1\n", proposer="template"), Candidate("x = 1\n", proposer="inductor")
    assert on_gpu._deadline(template) == 30.0 and on_gpu._deadline(inductor) == 120.0
    assert on_cpu._deadline(template) == 120.0  # the CPU interpreter runs template kernels slowly


def test_cancel_ends_a_batch_at_once_and_blames_no_candidate(screener, candidate, tmp_path):
    import threading
    import time

    log = tmp_path / "imports.txt"
    cands = [_logging(candidate, log, "slow", 60.0), _logging(candidate, log, "next")]
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=120.0, parallel=1))
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(one.screen(cands)))
    began = time.monotonic()
    worker.start()
    deadline = time.monotonic() + 60
    while not (log.exists() and "slow" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)  # the slow candidate is being imported
    one.cancel()
    worker.join(timeout=30)
    assert not worker.is_alive() and time.monotonic() - began < 50
    assert [r.harness for r in out] == [True, True], out
    assert all("stopped" in r.reason for r in out), out


def _pids(log) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in log.read_text().split("\n"):
        if line:
            name, pid = line.split()
            out.setdefault(name, []).append(pid)
    return out


@pytest.mark.parametrize("keep", [True, False])
def test_processes_are_kept_between_batches(screener, candidate, tmp_path, keep):
    """A fit process waits for the next batch with its torch and CUDA context ready; close() ends it."""
    from tests.evaluate.conftest import pid_gone

    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1, keep_processes=keep))
    first = one.screen([_logging(candidate, log, "a")])
    second = one.screen([_logging(candidate, log, "b")])
    assert first[0].ok and second[0].ok, (first, second)
    pids = _pids(log)  # [check stage, time stage] for each
    assert (pids["a"] == pids["b"]) is keep, pids
    one.close()
    assert all(pid_gone(int(p)) for p in pids["b"]), pids


def test_a_process_that_failed_a_candidate_is_not_kept(screener, candidate, tmp_path):
    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    crash = Candidate(_logging(candidate, log, "crash").source.replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        raise RuntimeError('boom')\n"))
    assert not one.screen([crash])[0].ok
    assert one.screen([_logging(candidate, log, "next")])[0].ok
    pids = _pids(log)
    assert pids["crash"][0] != pids["next"][0], pids
    one.close()


def test_a_kept_process_that_died_waiting_blames_no_candidate(screener, candidate, tmp_path):
    import os
    import signal

    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    assert one.screen([_logging(candidate, log, "a")])[0].ok
    for pid in _pids(log)["a"]:
        os.kill(int(pid), signal.SIGKILL)
    result = one.screen([_logging(candidate, log, "b")])[0]
    assert result.ok, result
    one.close()


def test_a_batch_started_after_cancel_does_not_undo_it(screener, candidate, tmp_path):
    import threading
    import time

    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=120.0, parallel=1))
    first: list = []
    worker = threading.Thread(target=lambda: first.extend(one.screen([_logging(candidate, log, "slow", 60.0)])))
    worker.start()
    deadline = time.monotonic() + 60
    while not (log.exists() and "slow" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    one.cancel()
    later = one.screen([_logging(candidate, log, "later")])  # starts after the cancel: runs, and cancels nothing back
    worker.join(timeout=30)
    assert not worker.is_alive() and first[0].harness, first
    assert later[0].ok, later
    one.close()


def test_a_crash_on_a_kept_process_is_retried_on_a_fresh_one_not_the_next_kept(screener, candidate, tmp_path):
    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=2))
    assert all(r.ok for r in one.screen([_logging(candidate, log, f"w{i}") for i in range(2)]))
    assert len(one._idle[("check", None)]) == 2
    crash = Candidate(_logging(candidate, log, "crash").source.replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import os; os._exit(3)\n"))
    (result,) = one.screen([crash])
    assert result.status is Status.CRASHED, result
    assert len(one._idle[("check", None)]) == 1  # one kept process lost to the crash, the other still kept
    one.close()


def test_processes_started_ahead_are_the_first_batchs(screener, candidate, tmp_path):
    """warm() starts the check and timing processes before any batch; the first batch runs in those, and close()
    ends them. Without keeping processes it starts none."""
    from tests.evaluate.conftest import pid_gone

    log = tmp_path / "imports.txt"
    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=2))
    one.warm()
    ahead = {stage: sorted(c.proc.pid for c in kept) for (stage, _), kept in one._idle.items()}
    assert len(ahead["check"]) == 2 and len(ahead["time"]) == 1, ahead
    one.warm()  # once per GPU
    assert sum(len(k) for k in one._idle.values()) == 3
    results = one.screen([_logging(candidate, log, f"c{i}") for i in range(2)])
    assert all(r.ok for r in results), results
    pids = _pids(log)
    assert {int(p) for i in range(2) for p in pids[f"c{i}"]} <= set(ahead["check"] + ahead["time"]), (pids, ahead)
    one.close()
    assert all(pid_gone(p) for p in ahead["check"] + ahead["time"])

    none = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=2, keep_processes=False))
    none.warm()
    assert not any(none._idle.values())


def test_a_batch_waiting_for_the_warm_up_can_be_cancelled(screener, candidate):
    """The first batch waits for the processes being started ahead; cancel() ends that wait, and the batch comes back
    unscreened, blaming none of its candidates."""
    import threading
    import time

    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    assert one.begin_warm(None) and not one.begin_warm(None)  # claimed; its thread has not started yet
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", one.screen([candidate("genuine_torch")])))
    thread.start()
    time.sleep(0.3)
    began = time.monotonic()
    one.cancel()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - began < 5
    (r,) = out["r"]
    assert r.harness and not r.ok, r
    one.close()


def test_processes_started_ahead_after_close_are_not_kept(screener):
    from tests.evaluate.conftest import pid_gone

    one = Screener(screener.evaluator, ScreenConfig(timeout_s=30.0, parallel=1))
    assert one.begin_warm(None)
    one.close()  # before the warm-up's thread got going
    started = []
    real = one._fresh_child

    def spy(name, gpu):
        child = real(name, gpu)
        started.append(child)
        return child

    one._fresh_child = spy
    one.warm(None, 1, claimed=True)
    assert started and not any(one._idle.values())
    assert all(pid_gone(c.proc.pid) for c in started)


def test_check_processes_yield_the_cpu_to_the_process_that_times(screener):
    """The check stage's processes (compiling, checking) run at a lower CPU priority than the timing process, so that
    a kernel timed meanwhile (the judge's, another GPU's screen) does not wait on them for a core."""
    import os

    from kernelevolve.evaluate.evaluator import _expect
    from kernelevolve.evaluate.screen import CHECK_NICE

    if not hasattr(os, "getpriority"):
        pytest.skip("no process priorities here")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    children = {name: screener._fresh_child(name, None) for name in ("check", "time")}
    try:
        for child in children.values():
            _expect(child, "hello")
        assert os.getpriority(os.PRIO_PROCESS, children["check"].proc.pid) == min(19, base + CHECK_NICE)
        assert os.getpriority(os.PRIO_PROCESS, children["time"].proc.pid) == base
    finally:
        for child in children.values():
            child.kill()
