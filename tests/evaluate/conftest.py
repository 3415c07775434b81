"""Fixtures for the evaluator's tests: small CPU problems, cheat candidates from tests/cheats, process helpers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
from kernelevolve.problem import load_problem

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "cheats"
# Small budgets: on the CPU each repetition is dominated by the 64 MB cache flush (2-10 ms on 2 cores).
FAST_TIMING = TimingConfig(budget_ms=20.0, warmup_ms=5.0, max_reps=30)
SECRET = "sk-test-secret"


def eval_config(**overrides) -> EvalConfig:
    return EvalConfig(**{"device": "cpu", "timeout_s": 60.0, "timing": FAST_TIMING, **overrides})


def make_evaluator(problem: str, workdir: Path, **overrides) -> Evaluator:
    # loaded on the device it is judged on: a problem of 16 GB would otherwise be drawn and run on the host first
    return Evaluator(load_problem(CHEATS / problem, overrides.get("device", "cpu")), eval_config(**overrides), workdir)


@pytest.fixture(scope="module")
def scale_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return make_evaluator("problem_scale.py", tmp_path_factory.mktemp("eval-scale"))


@pytest.fixture(scope="module")
def inplace_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return make_evaluator("problem_inplace.py", tmp_path_factory.mktemp("eval-inplace"))


@pytest.fixture(scope="module")
def running_stats_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return make_evaluator("problem_running_stats.py", tmp_path_factory.mktemp("eval-running-stats"))


@pytest.fixture(scope="module")
def untimed_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    """A short deadline and no timing: for hangs, crashes and process checks."""
    return make_evaluator("problem_scale.py", tmp_path_factory.mktemp("eval-untimed"), timeout_s=8.0,
                          time_candidates=False)


@pytest.fixture(scope="module")
def gpu_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return make_evaluator("problem_scale.py", tmp_path_factory.mktemp("eval-gpu"), device="cuda")


def read_candidate(name: str, **subs: str) -> Candidate:
    """tests/cheats/<name> (``.py`` implied), with each ``__KEY__`` placeholder replaced by ``subs[key]``."""
    path = CHEATS / (name if "." in name else f"{name}.py")
    text = path.read_text()
    for key, value in subs.items():
        text = text.replace(f"__{key.upper()}__", value)
    return Candidate(text)


@pytest.fixture
def candidate() -> Callable[..., Candidate]:
    return read_candidate


def pid_gone(pid: int, wait_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (a zombie waiting for init to reap it counts as gone)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.fixture
def gone() -> Callable[..., bool]:
    return pid_gone


@pytest.fixture
def new_evaluator(tmp_path: Path) -> Callable[..., Evaluator]:
    """An evaluator with its own settings, for the one test that needs them: new_evaluator(problem_file, **config)."""
    return lambda problem, **overrides: make_evaluator(problem, tmp_path, **overrides)


_ISOLATED = """
import json, os, sys
from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator
from kernelevolve.problem import load_problem

def main():
    assert os.environ["OPENAI_API_KEY"] == %r, "the secret was not planted"
    problem, workdir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    ev = Evaluator(load_problem(problem), EvalConfig(device="cpu", timeout_s=60, time_candidates=False), workdir)
    out = {}
    for name in names:
        r = ev.evaluate(Candidate(open(name).read()))
        out[os.path.basename(name)] = [r.status.value, r.reason]
    print(json.dumps(out))

if __name__ == "__main__":
    main()
""" % SECRET


@pytest.fixture(scope="session")
def secret_probe_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Statuses of the secret probes, evaluated in a fresh interpreter whose environment holds an API key.

    A fresh interpreter because the fork server is started once per process, with the environment of that moment.
    """
    names = ["secrets_probe.py", "gap_parent_environ.py"]
    env = dict(os.environ, OPENAI_API_KEY=SECRET,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _ISOLATED, str(CHEATS / "problem_scale.py"),
                           str(tmp_path_factory.mktemp("eval-secrets"))] + [str(CHEATS / n) for n in names],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
