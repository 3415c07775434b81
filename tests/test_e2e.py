"""End to end on the CPU: optimize writes a best.py that an independent check confirms; a run killed with -9 resumes."""
from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gelu_mlp.py"
CLI = [sys.executable, "-m", "kernelevolve.cli"]
FAST = ["--device", "cpu", "--timing-budget-ms", "100", "--timeout", "300"]

pytestmark = pytest.mark.slow


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_optimize_writes_verified_best(tmp_path: Path) -> None:
    out, db = tmp_path / "out", tmp_path / "ke.db"
    proc = subprocess.run(CLI + ["optimize", str(EXAMPLE), "--max-evals", "2", "--db", str(db), "--out", str(out)] + FAST,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vs eager" in proc.stdout and "torch.compile" in proc.stdout
    best, report = out / "best.py", out / "report.html"
    assert best.is_file() and report.is_file()
    assert "kernelevolve" not in "".join(l for l in best.read_text().splitlines() if l.startswith(("import", "from")))

    # Independent reference check, outside the harness: same weights, fresh inputs, allclose.
    ref_mod, best_mod = _import(EXAMPLE, "ref_problem"), _import(best, "best_candidate")
    ref = ref_mod.Model(*ref_mod.get_init_inputs())
    new = best_mod.ModelNew(*ref_mod.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = ref_mod.get_inputs()
        with torch.no_grad():
            torch.testing.assert_close(new(*x), ref(*x), atol=1e-4, rtol=1e-4)

    check = subprocess.run(CLI + ["check", str(EXAMPLE), str(best), "--no-baseline", "--json"] + FAST,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert '"status": "ok"' in check.stdout
    html = report.read_text()
    assert "https://" not in html and "http://" not in html


def test_template_proposer_writes_a_verified_triton_kernel(tmp_path: Path) -> None:
    """Interpreter timings cannot rank Triton candidates on the CPU, so best.py is the first verified one."""
    out, db = tmp_path / "out", tmp_path / "ke.db"
    proc = subprocess.run(CLI + ["optimize", str(EXAMPLE), "--proposer", "template", "--max-evals", "2", "--db",
                                 str(db), "--out", str(out)] + FAST,
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    best = out / "best.py"
    assert best.is_file() and "@triton.jit" in best.read_text()
    assert "kernelevolve import" not in best.read_text()
    check = subprocess.run(CLI + ["check", str(EXAMPLE), str(best), "--no-baseline", "--json"] + FAST,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert '"status": "ok"' in check.stdout


def _evaluated(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_kill_9_then_resume_loses_nothing(tmp_path: Path) -> None:
    out, db = tmp_path / "out", tmp_path / "ke.db"
    args = CLI + ["optimize", str(EXAMPLE), "--max-evals", "3", "--stall", "0", "--db", str(db), "--out", str(out)] + FAST
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while _evaluated(db) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(db) as con:
        before = con.execute("SELECT n.id, c.sha, r.status FROM nodes n JOIN candidates c ON c.id = n.candidate_id "
                             "JOIN results r ON r.candidate_id = c.id ORDER BY n.id").fetchall()
    assert len(before) >= 1

    resumed = subprocess.run(CLI + ["optimize", str(EXAMPLE), "--resume", "latest", "--db", str(db), "--out", str(out)],
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with sqlite3.connect(db) as con:
        after = con.execute("SELECT n.id, c.sha, r.status FROM nodes n JOIN candidates c ON c.id = n.candidate_id "
                            "JOIN results r ON r.candidate_id = c.id ORDER BY n.id").fetchall()
        runs = con.execute("SELECT COUNT(*), MAX(status) FROM runs").fetchone()
        shas = con.execute("SELECT sha FROM candidates").fetchall()
    assert set(before) <= set(after), "results committed before the kill were lost"
    assert len(after) == 3, after
    assert runs == (1, "finished")
    assert len(shas) == len(set(shas)), "a source was stored twice"
    assert (out / "best.py").is_file()


def test_quick_start_answers_with_a_verified_kernel_faster_than_eager(tmp_path: Path) -> None:
    """The README's quick-start run, as written there, on the CPU: a verified answer that beats eager head to head."""
    import re
    import shlex

    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if "kernelevolve optimize examples/" in l)
    argv = shlex.split(line[line.index("kernelevolve optimize"):])[1:]
    argv[1] = str(ROOT / argv[1])
    proc = subprocess.run(CLI + argv + ["--device", "cpu", "--db", str(tmp_path / "ke.db"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=1200, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())  # the console wraps long lines
    assert "CPU run:" in text
    answer = re.search(r"(?:answer|best) \(.*?\): [^;]*; speedup ([0-9.]+)x vs eager", text)
    assert answer, text
    assert float(answer.group(1)) > 1.0, text
    check = subprocess.run(CLI + ["check", argv[1], str(tmp_path / "out" / "best.py"), "--no-baseline", "--json"] + FAST,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0 and '"status": "ok"' in check.stdout, check.stdout + check.stderr
