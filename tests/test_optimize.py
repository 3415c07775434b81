"""optimize end to end on the CPU: every run writes best.py and report.html, and the budget buys search."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernelevolve.optimize import OptimizeConfig, optimize
from kernelevolve.store import Store

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "cheats" / "problem_scale.py"

pytestmark = pytest.mark.slow  # the baseline compiles the reference with torch.compile


def _run(tmp_path: Path, **cfg):
    store = Store(tmp_path / "ke.db")
    config = OptimizeConfig(device="cpu", proposers=("template",), profile=False, timing_budget_ms=50.0,
                            timeout_s=300.0, **cfg)
    try:
        return optimize(PROBLEM, config, store, tmp_path / "out"), store
    except BaseException:
        store.close()
        raise


def _import(path: Path):
    spec = importlib.util.spec_from_file_location("best_candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_with_nothing_evaluated_writes_the_reference(tmp_path):
    outcome, store = _run(tmp_path, max_evals=0)
    try:
        assert outcome.search.evaluations == 0 and outcome.best_result is None
        assert outcome.best_why == ("no candidate was evaluated (stopped: reached --max-evals 0): best.py is the "
                                    "reference itself")
        best = outcome.files["best"]
        assert best.read_text().splitlines()[1].startswith('"""The reference itself: no candidate was evaluated')
        assert hasattr(_import(best), "ModelNew")
        assert "no candidate was evaluated" in outcome.files["report"].read_text()
        phases = store.run(outcome.run_id).phases
        assert phases["baseline_s"] > 0 and "search_s" in phases
    finally:
        store.close()


def test_a_budget_shorter_than_the_baselines_still_buys_search(tmp_path):
    outcome, store = _run(tmp_path, max_evals=5, time_budget_s=0.01)
    try:
        phases = store.run(outcome.run_id).phases
        assert phases["baseline_s"] > 0.01  # the baselines alone took longer than the whole budget
        assert outcome.search.evaluations >= 1
        assert "time-budget 0.01 s" in outcome.search.stop_reason
        assert outcome.files["best"].is_file() and outcome.files["report"].is_file()
        assert outcome.best_why
    finally:
        store.close()


def test_the_winner_meets_the_baselines_head_to_head_before_the_run_answers(tmp_path):
    """The reference itself as the user's start kernel: the only timed winner, and no faster than its baselines in
    the rounds, so best.py is the best baseline's kernel and the run says so."""
    source = PROBLEM.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
    outcome, store = _run(tmp_path, max_evals=1, starts=({"name": "itself.py", "source": source},))
    try:
        h2h = outcome.head_to_head
        assert h2h is not None and h2h.rounds == 10 and set(h2h.ms) == {"candidate", "eager", "compiled"}
        assert not h2h.wins and h2h.answer in ("eager", "compiled")
        assert store.run(outcome.run_id).head_to_head == h2h
        assert store.run(outcome.run_id).phases["head_to_head_s"] > 0
        best = outcome.files["best"].read_text()
        assert "head to head (10 rounds, call clock)" in best.splitlines()[0]
        assert ("torch.compile(" in best) == (h2h.answer == "compiled")
        assert hasattr(_import(outcome.files["best"]), "ModelNew")
        assert "Head to head" in outcome.files["report"].read_text()
    finally:
        store.close()
