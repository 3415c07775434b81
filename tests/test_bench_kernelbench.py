"""bench/kernelbench.py: problem selection, a judge-only pass that appends rows and resumes, and fast_p."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import kernelbench  # noqa: E402


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A KernelBench-shaped folder holding the project's own small problems (KernelBench's stay where they are)."""
    level = tmp_path / "kb" / "level1"
    level.mkdir(parents=True)
    scale = (ROOT / "tests" / "cheats" / "problem_scale.py").read_text()
    (level / "2_Scale.py").write_text(scale)
    (level / "10_Scale_again.py").write_text(scale.replace("DIM = 128", "DIM = 96"))
    (level / "1_Broken.py").write_text("raise RuntimeError('not a problem')\n")
    return tmp_path / "kb"


def test_problems_are_chosen_in_numeric_order_and_by_name(corpus):
    every = kernelbench.select_problems(corpus, [1], None)
    assert [p.stem for p in every] == ["1_Broken", "2_Scale", "10_Scale_again"]
    assert [p.stem for p in kernelbench.select_problems(corpus, [1], ["10", "level1/2_Scale"])] == \
           ["10_Scale_again", "2_Scale"]
    with pytest.raises(kernelbench.KernelBenchError):
        kernelbench.select_problems(corpus, [1], ["99_None"])


def test_problems_matched_in_a_coverage_table(corpus, tmp_path):
    table = tmp_path / "coverage.json"
    table.write_text(json.dumps({"rows": [
        {"problem": "level1/2_Scale", "regions": [{"family": "pointwise"}], "claimed_share": 1.0},
        {"problem": "level1/10_Scale_again", "regions": [{"family": "row_reduction"}], "claimed_share": 0.5},
        {"problem": "level1/1_Broken", "status": "not traced", "regions": []}]}))
    every = kernelbench.select_problems(corpus, [1], None)
    assert [p.stem for p in kernelbench.matched_problems(every, table)] == ["2_Scale", "10_Scale_again"]
    assert [p.stem for p in kernelbench.matched_problems(every, table, ["row_reduction"])] == ["10_Scale_again"]
    assert [p.stem for p in kernelbench.matched_problems(every, table, None, 0.8)] == ["2_Scale"]
    with pytest.raises(kernelbench.KernelBenchError, match="no region of family row_reductoin"):
        kernelbench.matched_problems(every, table, ["row_reductoin"])
    assert kernelbench.main(["--root", str(corpus), "--level", "1", "--limit", "0", "--json",
                             str(tmp_path / "kb.json")]) == 2
    table.write_text("[]")
    with pytest.raises(kernelbench.KernelBenchError, match="not a coverage table"):
        kernelbench.matched_problems(every, table)


def test_judge_only_pass_appends_rows_and_resumes(corpus, tmp_path):
    out = tmp_path / "kb.json"
    cmd = [sys.executable, str(ROOT / "bench" / "kernelbench.py"), "--root", str(corpus), "--judge-only",
           "--device", "cpu", "--json", str(out), "--out-dir", str(tmp_path / "work"), "--timing-budget-ms", "20",
           "--max-eager-ms", "0"]
    first = subprocess.run(cmd + ["--problems", "1_Broken", "2_Scale"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = {r["problem"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["level1/1_Broken"]["status"] == "error" and "not a problem" in rows["level1/1_Broken"]["error"]
    scale = rows["level1/2_Scale"]
    assert scale["eager_status"] == "ok" and scale["eager_ms"] > 0 and scale["eager_judge_s"] > 0, scale
    assert scale["compile_status"] == "skipped" and "--max-eager-ms 0" in scale["compile_reason"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 already in" in again.stdout and "1 to run" in again.stdout
    data = json.loads(out.read_text())
    assert [r["problem"] for r in data["rows"]] == ["level1/1_Broken", "level1/2_Scale", "level1/10_Scale_again"]
    assert data["summary"]["genuine_failed"] == 0 and data["summary"]["errors"] == 1
    (corpus / "level1" / "1_Broken.py").write_text((corpus / "level1" / "2_Scale.py").read_text())  # fixed
    retry = subprocess.run(cmd + ["--retry-failed"], capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "2 already in" in retry.stdout and "1 to run" in retry.stdout
    data = json.loads(out.read_text())
    assert [r["problem"] for r in data["rows"]] == ["level1/1_Broken", "level1/2_Scale", "level1/10_Scale_again"]
    assert data["rows"][0]["eager_status"] == "ok" and data["summary"]["errors"] == 0, data["rows"][0]


def test_failed_rows_are_the_ones_retried():
    ok = {"mode": "judge-only", "status": "ok", "eager_status": "ok", "compile_status": "skipped"}
    assert not kernelbench.failed(ok)
    assert kernelbench.failed({**ok, "eager_status": "runtime_error"})
    assert kernelbench.failed({"mode": "judge-only", "status": "error"})
    assert kernelbench.failed({"mode": "optimize", "status": "ok", "correct": False})
    assert not kernelbench.failed({"mode": "optimize", "status": "ok", "correct": True})


def test_fast_p_counts_correct_kernels_over_all_problems():
    rows = [{"mode": "optimize", "correct": True, "speedup_eager": 2.0, "speedup_compile": 0.8},
            {"mode": "optimize", "correct": True, "speedup_eager": 0.5, "speedup_compile": 1.5},
            {"mode": "optimize", "correct": False, "speedup_eager": None, "speedup_compile": None},
            {"mode": "optimize", "status": "error"}]
    s = kernelbench.summarize(rows)
    assert s["correct"] == 0.5
    assert s["fast_0_eager"] == 0.5 and s["fast_1_eager"] == 0.25 and s["fast_1_compile"] == 0.25
    assert s["geomean_speedup_eager"] == pytest.approx(1.0)


def test_optimized_rows_render_as_a_table_with_the_summary():
    rows = [{"problem": "level1/19_ReLU", "mode": "optimize", "correct": True, "eager_ms": 2.0, "compile_ms": 1.0,
             "kernelevolve_ms": 0.5, "speedup_eager": 4.0, "speedup_compile": 2.0, "speedup_best_baseline": 2.0,
             "best_proposer": "template", "do_bench": {"speedup_eager": 3.5}, "clock_ratio": 4.0 / 3.5,
             "clocks_disagree": True, "clocks": {"device_ms": 0.4, "host_ms": 0.45, "launch_bound": True}},
            {"problem": "level2/1_Conv", "mode": "optimize", "status": "error", "error": "boom | bad"}]
    text = kernelbench.markdown_table(rows)
    assert ("| 19_ReLU | yes | 2 | 1 | 0.5 | 4.00x | 2.00x | 2.00x | 3.50x (differs) | 0.4 / 0.45 / — launch-bound "
            "| template") in text
    assert "do_bench checked 1, 1 differ by more than 5%" in text
    assert "| 1_Conv | no |" in text and "boom / bad" in text
    assert "2 problems: correct 0.50; fast_1 against eager 0.50, against torch.compile 0.50" in text


def test_a_random_draw_is_fixed_by_its_seed_and_ignores_what_matches(corpus):
    every = kernelbench.select_problems(corpus, [1], None)
    one, again = kernelbench.draw(every, 2, seed=35), kernelbench.draw(every, 2, seed=35)
    assert one == again and len(one) == 2 and set(one) <= set(every)
    assert one == sorted(one, key=lambda p: every.index(p))  # in KernelBench's order
    assert {tuple(kernelbench.draw(every, 2, seed=s)) for s in range(20)} != {tuple(one)}  # the seed matters
    assert kernelbench.draw(every, 10, seed=0) == every
