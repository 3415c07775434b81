"""The whole-model benchmarks (bench/models) at their SMALL sizes on the CPU: each loads as a problem, and plan_model
captures it, cuts it into regions and writes one loadable problem file per distinct region."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.model.plan import plan_model
from kernelevolve.problem import load_problem
from tests.benchsuite import ROOT, load_suite

MODELS = sorted((ROOT / "bench" / "models").glob("*.py"))


def test_the_six_models_are_there() -> None:
    assert [p.stem for p in MODELS] == ["dcn_v2", "dlrm", "hstu_block", "mmoe", "seq_target_attention",
                                        "transformer_block_bf16"]


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_a_bench_model_loads_and_plans(path: Path, tmp_path: Path) -> None:
    small = load_suite().write_small_copy(path, tmp_path / "model")
    assert small.read_text() != path.read_text()  # SMALL changed the sizes
    problem = load_problem(small)
    assert problem.output_dtypes
    plan = plan_model(small, "cpu", tmp_path / "out")
    assert plan.groups
    # every distinct region became a problem file, and each file loads on its own
    assert len(plan.groups) == len(plan.partition.groups()), plan.notes
    for g in plan.groups:
        assert load_problem(g.path).name == g.path.stem


def test_the_level3_draw_is_fixed_by_its_seed_and_spans_the_categories() -> None:
    from bench.models import CATEGORIES, DRAW, LEVEL3, draw_level3

    every = {n for names in CATEGORIES.values() for n in names}
    if LEVEL3.exists():  # each level-3 file has a category
        assert {p.stem for p in LEVEL3.glob("*.py")} <= every
    folder = LEVEL3 if LEVEL3.exists() else None
    if folder is None:
        pytest.skip("no KernelBench level 3 beside the checkout")
    a, b = draw_level3(folder, 36), draw_level3(folder, 36)
    assert a == b and len(a) == sum(DRAW.values()) >= 12
    assert draw_level3(folder, 37) != a


@pytest.mark.slow
def test_the_model_benchmark_runs_a_small_model_on_the_cpu(tmp_path: Path) -> None:
    import json

    from bench.models import main

    out = tmp_path / "m.json"
    assert main(["--device", "cpu", "--small", "--models", "mmoe", "--budget-s", "20", "--json", str(out),
                 "--out-dir", str(tmp_path / "o")]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["model"] == "mmoe" and row["status"] == "ok" and row["waterfall"], row
    assert row["problems"] and (tmp_path / "o" / "mmoe" / "best_model.py").exists()


def test_a_model_past_its_timeout_is_stopped_with_its_processes_and_says_so(tmp_path: Path, monkeypatch) -> None:
    """run_model ends a run at --timeout, its whole process group with it, and the row says it timed out."""
    import argparse
    import os
    import sys
    import time

    import bench.models as models

    pidfile = tmp_path / "child.pid"
    script = tmp_path / "slow.py"  # stands in for the CLI: it starts a child of its own, as the screen and judge do
    script.write_text("import subprocess, sys, time\n"
                      "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
                      "print('working', flush=True)\ntime.sleep(60)\n")
    real_popen = models.subprocess.Popen

    def popen(cmd, **kw):
        return real_popen([sys.executable, str(script)], **kw)

    monkeypatch.setattr(models.subprocess, "Popen", popen)
    args = argparse.Namespace(device="cpu", budget_s=1.0, out_dir=tmp_path, proposer="template", timing="call",
                              timing_budget_ms=10.0, timeout=3.0)
    t0 = time.monotonic()
    row = models.run_model(tmp_path / "model.py", args, tmp_path / "out")
    assert time.monotonic() - t0 < 30
    assert row["status"] == "failed" and row["exit"] is None and "timed out after 3 s" in row["why"]
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the grandchild went with the group
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the run's own child outlived the timeout")


def test_the_summary_tells_a_model_answered_by_itself_from_a_kernel_win() -> None:
    """The model itself beating Inductor's builds counts against max-autotune, but adds nothing over the best of
    the three: that figure is the kernels' own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_models_summary", ROOT / "bench" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    rows = [{"model": "a", "category": "ads-ranking", "status": "ok", "kept": [],
             "speedup": {"eager": 1.0, "compiled": 1.52, "max_autotune": 1.47}},
            {"model": "b", "category": "ads-ranking", "status": "ok", "kept": ["r01"],
             "speedup": {"eager": 1.44, "compiled": 1.21, "max_autotune": 1.21}}]
    got = models.summarize(rows)
    assert got["ads_geomean_vs_max_autotune"] == pytest.approx((1.47 * 1.21) ** 0.5)
    assert got["ads_geomean_vs_best_baseline"] == pytest.approx(1.21 ** 0.5)
    assert got["with_kernels"] == ["b"] and got["below_a_baseline"] == []


def test_the_glue_benchmark_times_a_models_generated_forward_beside_it(tmp_path: Path) -> None:
    """bench/glue.py: the generated forward with no kernel computes the model, and both are timed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_glue", ROOT / "bench" / "glue.py")
    glue = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glue)
    small = load_suite().write_small_copy(ROOT / "bench" / "models" / "mmoe.py", tmp_path / "model")
    row = glue.measure(small, "cpu", tmp_path / "work", compiled=False)
    assert row["ops"] > 10 and row["model_ms"] > 0 and row["generated_ms"] > 0
    assert row["eager_x"] == pytest.approx(row["generated_ms"] / row["model_ms"])
