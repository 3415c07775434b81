"""Every benchmark problem loads at its SMALL sizes and its reference runs on the CPU; the suite's helpers hold."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.benchsuite import load_suite
from kernelevolve.problem import as_outputs, build_model, import_module_from_path, load_problem, make_inputs



suite = load_suite()
PROBLEMS = suite.problem_paths(None) + suite.gemm_paths()


def test_suite_has_the_problems() -> None:
    assert len(PROBLEMS) >= 22
    assert all(p.name != "scale_bias_relu.py" for p in PROBLEMS)


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_small_problem_runs_on_cpu(path: Path, tmp_path: Path) -> None:
    small = suite.write_small_copy(path, tmp_path)
    problem = load_problem(small, "cpu")
    assert problem.name == path.stem and problem.output_dtypes
    module = import_module_from_path(small, f"_bench_{path.stem}")
    model = build_model(module, "Model", 0)
    with torch.no_grad():
        outs = as_outputs(model(*make_inputs(module, 1)))
    assert all(torch.isfinite(o.float()).all() for o in outs if o.is_floating_point())


def test_small_source_replaces_only_named_constants() -> None:
    src = 'ROWS = 4096\nCOLS = 1_024  # wide\nSMALL = {"ROWS": 8, "COLS": 4}\nX = 5\n'
    out = suite.small_source(src)
    assert "ROWS = 8\n" in out and "COLS = 4\n" in out and "X = 5" in out


def test_small_source_rejects_unknown_name() -> None:
    with pytest.raises(suite.SuiteError):
        suite.small_source('ROWS = 4096\nSMALL = {"COLS": 4}\n')


def test_problem_selection() -> None:
    names = [p.stem for p in suite.problem_paths(["layernorm", "softmax_bf16", "dcn_*"])]
    assert names == ["layernorm_bf16", "layernorm_fp32", "softmax_bf16", "dcn_v2_cross_bf16", "dcn_v2_cross_fp32"]
    with pytest.raises(suite.SuiteError):
        suite.problem_paths(["no_such_problem"])


def test_speedups_and_summary() -> None:
    row = {"eager_ms": 2.0, "compile_ms": 1.0, "max_autotune_ms": None, "kernelevolve_ms": 0.5, "floor_ms": 0.1}
    suite.fill_speedups(row)
    assert row["best_baseline"] == "compile" and row["speedup_best_baseline"] == 2.0
    assert row["speedup_max_autotune"] is None and row["floor_fraction"] == pytest.approx(0.2)
    assert not row["suspect"]
    summary = suite.summarize([row, {"problem": "x", "status": "error"}])
    assert summary["fast_1_eager"] == 0.5 and summary["geomean_speedup_compile"] == 2.0
    assert summary["at_least_best_baseline"] == 1 and summary["errors"] == 1


@pytest.mark.slow
def test_a_second_budget_starts_from_the_first_runs_baselines(tmp_path: Path, monkeypatch) -> None:
    """--again-s: the second row has the first row's baselines and max-autotune time, measured once, and a search of
    its own in a store of its own."""
    import json

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "suite"
    assert suite.main(["--device", "cpu", "--small", "--problems", "layernorm_fp32", "--budget-s", "2",
                       "--again-s", "3", "--max-evals", "2", "--out-dir", str(out)]) == 0
    (first,) = json.loads((out / "suite.json").read_text())["rows"]
    second_file = json.loads((out / "suite-3s.json").read_text())
    (second,) = second_file["rows"]
    assert second_file["budget_s"] == 3 and second["status"] == "ok", second
    assert (second["eager_ms"], second["max_autotune_ms"]) == (first["eager_ms"], first["max_autotune_ms"])
    assert second["evals"] >= 1 and (out / "suite-3s.db").exists()


def test_shards_are_read_as_they_are_written(tmp_path: Path) -> None:
    """--gpus N reads each shard's JSON (and, with --again-s, each shard's JSON at the second budget) as it appears;
    a shard that has written nothing yet holds no rows."""
    import json

    cfg = suite.SuiteConfig("cuda", ("template",), 40.0, 40, 300.0, False, tmp_path, tmp_path / "suite.json", 120.0)
    shards = [tmp_path / f"shard{i}.json" for i in range(3)]
    for i in (0, 2):
        shards[i].write_text(json.dumps({"device_name": "H", "rows": [{"problem": f"p{i}"}]}))
        suite.again_path(suite.replace(cfg, json_path=shards[i])).write_text(
            json.dumps({"device_name": "H", "rows": [{"problem": f"p{i}", "budget": 120}]}))
    rows, name = suite.read_shards(shards)
    assert [r["problem"] for r in rows] == ["p0", "p2"] and name == "H"
    again, _ = suite.read_shards([suite.again_path(suite.replace(cfg, json_path=s)) for s in shards])
    assert [r["budget"] for r in again] == [120, 120]
    assert suite.again_path(cfg).name == "suite-120s.json"


def test_defaults_run_with_the_clis_own_limits(tmp_path: Path) -> None:
    from kernelevolve.optimize import OptimizeConfig

    base = dict(device="cuda", proposers=("template", "inductor"), budget_s=40.0, max_evals=40,
                timing_budget_ms=300.0, small=False, out_dir=tmp_path, json_path=tmp_path / "s.json")
    budgeted = suite.SuiteConfig(**base).optimize_config(40.0)
    assert (budgeted.time_budget_s, budgeted.max_evals, budgeted.stall) == (40.0, 40, None)
    plain = suite.SuiteConfig(**base, defaults=True).optimize_config(40.0)
    cli = OptimizeConfig(device="cuda")
    assert (plain.time_budget_s, plain.max_evals, plain.stall) == (cli.time_budget_s, cli.max_evals, cli.stall)
    assert suite.main(["--defaults", "--again-s", "120", "--device", "cpu", "--problems", "softmax_bf16"]) == 2


def test_a_call_stops_at_its_deadline_and_the_next_goes_on_with_resume(tmp_path: Path, monkeypatch) -> None:
    """--deadline-s starts no problem after its seconds; --resume keeps the rows already written and runs only the
    problems lacking a row at either budget (one cut off between its two runs runs again from the start)."""
    import json

    ran: list[tuple[str, str]] = []

    def fake_run(path, cfg, store):
        ran.append(("first", path.stem))
        return {"problem": path.stem, "status": "ok", "notes": [], "run_id": 1, "wall_s": 0.0}

    def fake_again(path, cfg, store, first, first_store):
        ran.append(("again", path.stem))
        return {"problem": path.stem, "status": "ok", "notes": [], "budget": cfg.again_s, "wall_s": 0.0}

    monkeypatch.setattr(suite, "run_problem", fake_run)
    monkeypatch.setattr(suite, "run_again", fake_again)
    monkeypatch.setattr(suite, "print_table", lambda *a, **k: None)
    out = tmp_path / "suite"
    common = ["--device", "cpu", "--small", "--budget-s", "2", "--again-s", "3", "--out-dir", str(out)]
    three = ["--problems", "softmax_bf16", "layernorm_fp32", "column_sum"]
    assert suite.main([*common, *three, "--deadline-s", "0"]) == 0
    assert ran == [] and not (out / "suite.json").exists()

    assert suite.main([*common, "--problems", "softmax_bf16", "layernorm_fp32"]) == 0
    # layernorm_fp32 cut off after its first run: its row at the second budget is missing
    again = json.loads((out / "suite-3s.json").read_text())
    again["rows"] = [r for r in again["rows"] if r["problem"] != "layernorm_fp32"]
    (out / "suite-3s.json").write_text(json.dumps(again))
    ran.clear()
    assert suite.main([*common, *three, "--resume"]) == 0
    assert ran == [("first", "layernorm_fp32"), ("again", "layernorm_fp32"), ("first", "column_sum"),
                   ("again", "column_sum")]
    first = json.loads((out / "suite.json").read_text())
    assert sorted(r["problem"] for r in first["rows"]) == ["column_sum", "layernorm_fp32", "softmax_bf16"]
    assert sorted(r["problem"] for r in json.loads((out / "suite-3s.json").read_text())["rows"]) == \
        ["column_sum", "layernorm_fp32", "softmax_bf16"]
    assert len(first["commands"]) == 2  # the call that wrote softmax_bf16's rows, and this one

    # rows of another budget are not this run's to go on from
    assert suite.main([*common[:4], "5", *common[5:], *three, "--resume"]) == 2


def test_a_rows_speedups_come_from_its_head_to_head_and_the_do_bench_check(tmp_path: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    from kernelevolve.evaluate.headtohead import CANDIDATE, decide

    row = {"kernelevolve_ms": 0.9, "speedup_eager": 2.4, "speedup_compile": 1.2, "speedup_max_autotune": 1.1,
           "speedup_best_baseline": 1.1, "notes": []}
    h2h = decide({CANDIDATE: [1.0] * 10, "eager": [2.0] * 10, "compiled": [1.5] * 10, "max_autotune": [1.25] * 10})
    suite.fill_head_to_head(row, SimpleNamespace(head_to_head=h2h))
    assert row["kernelevolve_ms"] == 1.0 and row["judge_ms"] == 0.9 and row["judge_speedup_eager"] == 2.4
    assert (row["speedup_eager"], row["speedup_compile"], row["speedup_max_autotune"]) == (2.0, 1.5, 1.25)
    assert row["best_baseline"] == "max_autotune" and row["speedup_best_baseline"] == 1.25

    def fake_run(cmd, **kwargs):  # bench/dobench.py's one line of JSON
        return SimpleNamespace(returncode=0, stdout='{"eager_ms": 2.0, "kernel_ms": 1.0, "speedup_eager": 1.8}\n',
                               stderr="")

    monkeypatch.setattr(suite.subprocess, "run", fake_run)
    suite.check_clock(row, tmp_path / "p.py", tmp_path / "best.py")
    assert row["do_bench"]["speedup_eager"] == 1.8 and row["clock_ratio"] == pytest.approx(2.0 / 1.8)
    assert row["clocks_disagree"] and "clocks disagree" in row["notes"][-1]
    assert suite.summarize([row])["clocks_disagree"] == 1


def test_a_baseline_answer_carries_the_baselines_clocks_not_the_losing_candidates() -> None:
    from types import SimpleNamespace

    from kernelevolve.evaluate.headtohead import CANDIDATE, decide
    from kernelevolve.evaluate.result import Timing

    candidate = {"call_ms": 13.6, "device_ms": 13.6, "host_ms": 0.36}
    row = {"kernelevolve_ms": 13.6, "speedup_eager": 0.17, "notes": [], "clocks": candidate}
    eager = Timing(median_ms=2.27, min_ms=2.2, max_ms=2.3, reps=10, method="cuda-events", call_ms=2.27, device_ms=2.26,
                   host_ms=0.05)
    h2h = decide({CANDIDATE: [13.6] * 10, "eager": [2.27] * 10, "compiled": [13.6] * 10})
    run = SimpleNamespace(head_to_head=h2h, baseline=SimpleNamespace(eager=eager, compiled=None))
    suite.fill_head_to_head(row, run)
    assert row["best_proposer"] == "baseline" and row["best_label"] == "eager"
    assert row["clocks"]["device_ms"] == 2.26 and row["fastest_candidate_clocks"] == candidate


def test_the_markdown_table_merges_files_and_marks_disagreeing_clocks(tmp_path: Path) -> None:
    import json

    def row(problem: str, ratio: float, commit: str, **kw) -> dict:
        return {"problem": problem, "best_proposer": "template", "kernelevolve_ms": 0.5, "speedup_eager": 2.0,
                "speedup_best_baseline": 1.2, "best_baseline": "max_autotune", "clock_ratio": ratio,
                "clocks_disagree": abs(ratio - 1) > suite.CLOCK_AGREEMENT, "commit": commit,
                "do_bench": {"speedup_eager": 2.0 / ratio}, "clocks": {"device_ms": 0.4, "host_ms": 0.6,
                                                                        "launch_bound": True}, **kw}

    old = tmp_path / "old.json"
    new = tmp_path / "new.json"
    old.write_text(json.dumps({"device_name": "NVIDIA H200", "rows": [row("a", 1.2, "old"), row("b", 1.0, "old")]}))
    new.write_text(json.dumps({"device_name": "NVIDIA H200", "rows": [
        row("a", 1.01, "new", best_proposer="baseline", best_label="compiled")]}))
    lines = suite.markdown_table([old, new]).splitlines()
    a = next(line for line in lines if line.startswith("| a |"))
    b = next(line for line in lines if line.startswith("| b |"))
    assert "torch.compile's kernel" in a and "| new |" in a and "**" not in a  # the later file's row
    assert "| old |" in b and "| yes |" in b and "| H200 |" in b
    assert "2 problems" in lines[-1] and "0 of 2 differ" in lines[-1]
    assert "**1.200**" in suite.markdown_table([old])
