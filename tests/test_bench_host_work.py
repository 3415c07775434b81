"""bench/host_work.py: the host work of a candidate's forward, its launches stubbed, on the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_host_work_times_the_forward_with_its_launches_stubbed(tmp_path):
    out = tmp_path / "host.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_work.py"), "--problems", "dcn_v2_cross_bf16",
                           "--calls", "20", "--loops", "2", "--json", str(out)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["problem"] == "dcn_v2_cross_bf16" and row["regions"] == 3 and row["stubbed"] >= 3, row
    assert 0 < row["host_us"] == min(row["loops_us"]) and data["command"].startswith("python3 bench/host_work.py")
