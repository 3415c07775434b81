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
    return Screener(new_evaluator("problem_scale.py"), ScreenConfig(timeout_s=10.0, parallel=2))


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
