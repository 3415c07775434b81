"""The bench problems' template kernels compile for sm_90 with the real Triton compiler (no GPU needed)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile and run these for real")
SCRIPT = Path(__file__).with_name("compile_sm90.py")


def test_every_bench_template_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--n", "2"], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len({r["problem"] for r in rows}) >= 22
    failed = [r for r in rows if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)[:4000]
    # the configurations a search starts from must not spill registers to local memory
    spills = [(r["problem"], k) for r in rows if r["label"] == "defaults"
              for k, v in r["kernels"].items() if v["spill_bytes"] != 0]
    assert not spills, spills
