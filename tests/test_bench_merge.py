"""bench/merge.py: a later file's row replaces the earlier row of its problem, and runs on other setups are refused."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = {"date": "2026-11-30", "device": "cuda", "device_name": "NVIDIA H200", "torch": "2.11", "triton": "3.6",
        "python": "3.12", "budget_s": 40, "max_evals": 40, "proposers": ["template", "inductor"], "small": False}


def row(problem: str, ke: float, compile_ms: float = 2.0) -> dict:
    return {"problem": problem, "status": "ok", "notes": [], "eager_ms": 4.0, "compile_ms": compile_ms,
            "max_autotune_ms": 3.0, "kernelevolve_ms": ke, "floor_ms": 0.5, "floor_source": "table",
            "speedup_best_baseline": compile_ms / ke}


def write(path: Path, rows: list[dict], **head) -> str:
    path.write_text(json.dumps({**HEAD, **head, "command": f"python3 bench/suite.py # {path.name}", "rows": rows}))
    return str(path)


def merge(tmp_path: Path, *inputs: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "merge.py"), "--json", str(tmp_path / "m.json"),
                           *inputs], capture_output=True, text=True, cwd=ROOT)


def test_later_rows_replace_earlier_ones(tmp_path):
    a = write(tmp_path / "a.json", [row("softmax_bf16", 1.0), row("column_sum", 2.5)])
    b = write(tmp_path / "b.json", [row("column_sum", 1.6)])
    out = merge(tmp_path, a + "@aaaa", b + "@bbbb")
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    got = {r["problem"]: (r["kernelevolve_ms"], r["commit"]) for r in data["rows"]}
    assert got == {"softmax_bf16": (1.0, "aaaa"), "column_sum": (1.6, "bbbb")}
    assert [s["commit"] for s in data["sources"]] == ["aaaa", "bbbb"]
    assert data["summary"]["problems"] == 2


def test_runs_on_another_gpu_are_refused(tmp_path):
    a = write(tmp_path / "a.json", [row("softmax_bf16", 1.0)])
    b = write(tmp_path / "b.json", [row("column_sum", 1.6)], device_name="NVIDIA H100")
    out = merge(tmp_path, a, b)
    assert out.returncode != 0 and "device_name" in out.stderr


def test_a_merged_file_brings_its_rows_with_their_own_commits(tmp_path):
    a = write(tmp_path / "a.json", [row("softmax_bf16", 1.0), row("column_sum", 2.5)])
    first = tmp_path / "first"
    first.mkdir()
    assert merge(first, a + "@aaaa").returncode == 0
    b = write(tmp_path / "b.json", [row("layernorm_bf16", 1.2), row("column_sum", 1.6)])
    out = merge(tmp_path, str(first / "m.json"), b + "@bbbb")
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    got = {r["problem"]: (r["commit"], r["source"]) for r in data["rows"]}
    assert got == {"softmax_bf16": ("aaaa", "a.json"), "column_sum": ("bbbb", "b.json"),
                   "layernorm_bf16": ("bbbb", "b.json")}
    assert [(s["file"], s["commit"]) for s in data["sources"]] == [("a.json", "aaaa"), ("b.json", "bbbb")]


def test_refloor_recomputes_a_floor_with_the_profile_ceilings(tmp_path, monkeypatch):
    """--refloor's floor is the profile's: an fp32 GEMM on an H200 is bounded by three TF32 products per product."""
    import pytest

    from tests.benchsuite import load_bench

    merge_mod = load_bench("merge")
    (tmp_path / "tiny_gemm.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(512, 512, bias=False)\n\n"
        "    def forward(self, x):\n        return self.fc(x)\n\n\ndef get_inputs():\n"
        "    return [torch.randn(512, 512)]\n\n\ndef get_init_inputs():\n    return []\n")
    monkeypatch.setattr(merge_mod.suite, "PROBLEMS", tmp_path)
    floor_ms, nbytes = merge_mod.refloor("tiny_gemm", "NVIDIA H200")
    assert nbytes == 3 * 512 * 512 * 4
    assert floor_ms == pytest.approx(2 * 512 ** 3 / (494e12 / 3) * 1e3)
