"""``optimize --start FILE`` end to end on the CPU: a Triton start file with an autotune list is judged first, becomes
the root of the tree under proposer ``start``, and its configurations are tuned as its children; a missing start file
and a start the judge fails each end the run with one line and exit code 2."""
import os
import subprocess
import sys
from pathlib import Path

from kernelevolve.store import Store

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "kernelevolve.cli"]
ENV = dict(os.environ, TRITON_INTERPRET="1")
PROBLEM = ROOT / "tests" / "cheats" / "problem_scale.py"
START = ROOT / "tests" / "starts" / "scale_autotuned.py"


def _optimize(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + ["optimize", str(PROBLEM), "--device", "cpu", "--proposer", "template", *options,
                                 "--stall", "0", "--timing-budget-ms", "20", "--db", str(tmp_path / "ke.db"),
                                 "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          env=ENV, cwd=tmp_path)


def test_a_start_file_is_judged_then_tuned(tmp_path):
    proc = _optimize(tmp_path, "--start", str(START), "--max-evals", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert "start kernel scale_autotuned.py: verified" in said
    store = Store(tmp_path / "ke.db")
    nodes = store.nodes(store.run("latest").id)
    (root,) = [n for n in nodes if n.meta.get("start")]
    assert root.id == 1 and root.proposer == "start" and root.ok  # judged before anything else
    children = [n for n in nodes if n.proposer == "start" and n.meta.get("root") == root.id]
    assert children and all(n.ok for n in children), [(n.meta["label"], n.result) for n in children]
    assert any("autotune config 1" in n.meta["label"] for n in children)  # the list's other configuration alone
    # untimed on the CPU: the best is the first verified, the start itself; a faster child would win on a GPU
    shown = subprocess.run(CLI + ["show", "latest", "--db", str(tmp_path / "ke.db"), "--diff", str(children[0].id)],
                           capture_output=True, text=True, timeout=120, env=ENV, check=True).stdout
    assert shown.startswith("--- scale_autotuned.py (start)") and "triton.Config(" in shown
    report = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Start kernels</h2>" in report and "scale_autotuned.py" in report


def test_a_missing_start_file_is_one_line_and_exit_2(tmp_path):
    proc = _optimize(tmp_path, "--start", str(tmp_path / "nope.py"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"kernelevolve: error: {tmp_path / 'nope.py'}: no such start file"]
    assert not (tmp_path / "ke.db").exists() or not Store(tmp_path / "ke.db").runs()


def test_a_start_the_judge_fails_ends_the_run_with_its_reason(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(START.read_text().replace("tl.maximum(y, 0.0)", "tl.maximum(y, 1.0)"))
    proc = _optimize(tmp_path, "--start", str(wrong))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("kernelevolve: error: wrong.py: the start kernel failed the judge: incorrect: ")
    assert "elements outside atol" in line
    run = Store(tmp_path / "ke.db").run("latest")
    assert run.status == "failed" and run.baseline is None  # ended before the baselines were timed
