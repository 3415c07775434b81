"""bench/gemm_table.py: the GEMM rows of suite and KernelBench files, and the issue's targets read off them."""
from __future__ import annotations

import json

import pytest

from tests.benchsuite import load_bench

table = load_bench("gemm_table")


def row(problem, kernel, max_autotune, best=None, floor=0.5, status="ok"):
    return {"problem": problem, "status": status, "dtype": "float32", "eager_ms": 2.0, "compile_ms": 2.0,
            "max_autotune_ms": max_autotune, "kernelevolve_ms": kernel, "floor_fraction": floor,
            "speedup_best_baseline": best if best is not None else min(2.0, max_autotune or 2.0) / kernel}


def write(path, rows, **head):
    path.write_text(json.dumps({**head, "rows": rows}))
    return path


def test_suite_files_give_their_gemm_problems_and_kernelbench_files_all(tmp_path):
    suite_file = write(tmp_path / "suite.json", [row("linear_gelu_bf16", 1.0, 1.0), row("softmax_bf16", 0.5, 1.0),
                                                 row("task_towers_fp32", 1.0, 2.0)])
    kb = write(tmp_path / "kb.json", [row("level2/70_Gemm_Sigmoid", 2.0, 1.8)], kernelbench=".kb")
    rows = table.gemm_rows([suite_file, kb])
    assert [r["problem"] for r in rows] == ["linear_gelu_bf16", "task_towers_fp32", "level2/70_Gemm_Sigmoid"]
    assert [r["kind"] for r in rows] == ["suite", "suite", "kernelbench"]
    # --problems narrows both kinds; a KernelBench problem may be named without its level
    rows = table.gemm_rows([suite_file, kb], ["softmax_bf16", "70_Gemm_Sigmoid"])
    assert [r["problem"] for r in rows] == ["softmax_bf16", "level2/70_Gemm_Sigmoid"]


def test_a_later_file_replaces_the_row_of_the_same_problem(tmp_path):
    first = write(tmp_path / "a.json", [row("linear_gelu_bf16", 2.0, 1.0)])
    second = write(tmp_path / "b.json", [row("linear_gelu_bf16", 1.0, 1.0)])
    (only,) = table.gemm_rows([first, second])
    assert only["kernelevolve_ms"] == 1.0 and only["file"] == "b.json"


def test_summary_counts_the_rows_under_max_autotune_and_the_untimed_apart():
    rows = [row("a", 1.0, 1.2), row("b", 2.0, 1.8), row("c", 1.0, None, best=1.0)]
    s = table.summarize(rows)
    assert (s["problems"], s["max_autotune_timed"], s["at_least_max_autotune"]) == (3, 2, 1)
    assert s["min_vs_max_autotune"] == pytest.approx(0.9)
    assert s["geomean_vs_best_baseline"] == pytest.approx((1.2 * 0.9 * 1.0) ** (1 / 3))
    assert "at least 1.0x max-autotune on 1 of the 2" in table.markdown(rows)


def test_cli_refuses_missing_files_and_files_without_gemm_rows(tmp_path, capsys):
    assert table.main([str(tmp_path / "nope.json")]) == 2
    empty = write(tmp_path / "s.json", [row("softmax_bf16", 0.5, 1.0)])
    assert table.main([str(empty)]) == 2
    good = write(tmp_path / "g.json", [row("swiglu_mlp_fp32", 1.0, 1.1)])
    assert table.main([str(good), "--json", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["summary"]["at_least_max_autotune"] == 1
    assert "swiglu_mlp_fp32" in capsys.readouterr().out
