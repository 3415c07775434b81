"""bench/experience.py's pieces: similar problems by scaled sizes, and evaluations counted to a target time."""
from __future__ import annotations

import pytest

from kernelevolve.evaluate.result import Result, ScreenResult, Status, Timing
from kernelevolve.problem import load_problem
from tests.benchsuite import load_bench
from tests.factories import make_node

exp = load_bench("experience")


def node(ms, cached=False, status=Status.OK, label="x"):
    timing = Timing.from_samples([ms], "cuda_event") if ms is not None else None
    return make_node(1, Result(status, "r", timing=timing, timed=ms is not None), meta={"label": label}, cached=cached)


def test_scaled_source_scales_only_the_named_constants():
    src = "ROWS = 8192\nCOLS = 8_192\nSMALL = {'ROWS': 64}\n"
    assert exp.scaled_source(src, {"ROWS": 0.5}) == "ROWS = 4096\nCOLS = 8_192\nSMALL = {'ROWS': 64}\n"
    assert exp.scaled_source("ROWS = 1\n", {"ROWS": 0.5}) == "ROWS = 1\n"
    with pytest.raises(Exception, match="HEIGHT"):
        exp.scaled_source(src, {"HEIGHT": 2})


@pytest.mark.parametrize("stem", sorted(exp.PAIRS))
def test_every_pair_makes_two_loadable_problems_of_different_sizes(stem, tmp_path):
    similar, target = exp.write_pair(stem, True, tmp_path)
    a, b = load_problem(similar, "cpu"), load_problem(target, "cpu")
    assert a.sha != b.sha and a.output_dtypes == b.output_dtypes


def test_evaluations_to_counts_own_evaluations_only():
    nodes = [node(5.0, cached=True), node(None, status=Status.INCORRECT), node(3.0), node(2.0)]
    assert exp.evaluations_to(nodes, 2.0) == 3
    assert exp.evaluations_to(nodes, 5.0) == 0  # the reused known kernel already reaches it
    assert exp.evaluations_to(nodes, 1.0) is None
    screened = [make_node(2, None, screen=ScreenResult(Status.OK, "checked", ms=9.0)), *nodes]
    assert exp.evaluations_to(screened, 2.0) == 4  # a screened candidate counts as a candidate
    assert exp.evaluations_to(screened, 2.0, judged_only=True) == 3  # not as a judged one


def test_trace_lists_own_evaluations_in_order_with_time_or_status():
    screened = make_node(2, None, meta={"label": "tile"}, screen=ScreenResult(Status.OK, "ok", ms=2.5))
    nodes = [node(5.0, cached=True, label="known"), node(None, status=Status.INCORRECT, label="bad"),
             node(3.0, label="defaults"), screened]
    got = exp.trace(nodes)
    assert [row[:3] for row in got] == [["bad", "incorrect", None], ["defaults", 3.0, None], ["tile", None, 2.5]]
    assert got[2][3] == screened.sha[:12]


def test_summary_ratio():
    rows = [{"problem": "a", "n_cold": 8, "n_warm": 2, "ratio": 4.0}, {"problem": "b", "n_cold": 3, "n_warm": 3,
                                                                      "ratio": 1.0},
            {"problem": "c", "n_cold": 5, "n_warm": None, "ratio": None}, {"problem": "d", "error": "x"}]
    s = exp.summarize(rows)
    assert s["geomean_ratio"] == pytest.approx(2.0) and s["reached"] == 2 and s["measured"] == 3
    # the sums compare the pairs the warm run reached; the cold total keeps the others
    assert (s["cold_evals_to_best"], s["warm_evals_to_reach"], s["cold_evals_all"]) == (11, 5, 16)


def test_a_call_stops_at_its_deadline_and_the_next_goes_on_with_resume(tmp_path, monkeypatch):
    """--deadline-s starts no pair after its seconds; --resume keeps the pairs measured without an error and runs
    the others; a file of other settings is refused."""
    import json

    ran = []

    def fake_pair(stem, args, work):
        ran.append(stem)
        return {"problem": stem, "error": "boom"} if stem == "layernorm_bf16" and len(ran) == 2 else {
            "problem": stem, "n_cold": 2, "n_warm": 1, "ratio": 2.0}

    monkeypatch.setattr(exp, "run_pair", fake_pair)
    out = tmp_path / "exp"
    common = ["--device", "cpu", "--small", "--budget-s", "2", "--out-dir", str(out)]
    pairs = ["--pairs", "softmax_bf16", "layernorm_bf16", "rmsnorm_residual_bf16"]
    assert exp.main([*common, *pairs, "--deadline-s", "0"]) == 0 and ran == []
    assert exp.main([*common, "--pairs", "softmax_bf16", "layernorm_bf16"]) == 0
    assert ran == ["softmax_bf16", "layernorm_bf16"]  # the second failed: it runs again on resume
    ran.clear()
    assert exp.main([*common, *pairs, "--resume"]) == 0
    assert ran == ["layernorm_bf16", "rmsnorm_residual_bf16"]
    data = json.loads((out / "experience.json").read_text())
    assert [r["problem"] for r in data["rows"]] == ["softmax_bf16", "layernorm_bf16", "rmsnorm_residual_bf16"]
    assert all("error" not in r for r in data["rows"]) and len(data["commands"]) == 2
    assert exp.main([*common[:4], "5", *common[5:], *pairs, "--resume"]) == 2
