"""bench/tile_probe.py: one template configuration's kernels, error and time, here under the interpreter."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tile_probe_renders_each_configuration_and_names_the_knobs_not_offered(tmp_path):
    out = tmp_path / "tiles.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tile_probe.py"), "--device", "cpu", "--small",
                           "--problem", "gemm/linear_softmax_bf16", "--set", "BLOCK_M=32,num_warps=8",
                           "--set", "BLOCK_M=48", "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["command"].startswith("python3 bench/tile_probe.py") and len(data["rows"]) == 2
    offered, odd = data["rows"]
    assert "error" not in offered and offered["not_offered"] == [], offered
    tiles = [cfg for cfg in offered["genome"].values() if "BLOCK_M" in cfg]
    assert tiles and all(cfg["BLOCK_M"] == 32 and cfg["num_warps"] == 8 for cfg in tiles), offered["genome"]
    assert 0 <= offered["max_err"] < 0.05 and offered["mean_ms"] > 0
    assert odd["not_offered"] == ["BLOCK_M"] and "error" not in odd, odd
