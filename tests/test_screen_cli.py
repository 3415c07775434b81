"""A screened run end to end on the CPU: the local pool's screen, the counts in `runs --json`, the tree in `show`."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "kernelevolve.cli"]
ENV = dict(os.environ, TRITON_INTERPRET="1")


def _optimize(db: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    """A template-only screened run of the scale problem on the CPU."""
    proc = subprocess.run(CLI + ["optimize", str(ROOT / "tests" / "cheats" / "problem_scale.py"), "--device", "cpu",
                                 "--proposer", "template", *options, "--stall", "0", "--timing-budget-ms", "20",
                                 "--db", str(db), "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _runs(db: Path) -> list[dict]:
    """The stored runs, as ``runs --json`` prints them."""
    return json.loads(subprocess.run(CLI + ["runs", "--db", str(db), "--json"], capture_output=True, text=True,
                                     timeout=120, env=ENV, check=True).stdout)


def test_a_screened_run_judges_only_its_finalists(tmp_path):
    db, out = tmp_path / "ke.db", tmp_path / "out"
    proc = _optimize(db, out, "--screen-batch", "4", "--finalists", "1", "--max-evals", "2")
    assert "screened 4 candidate(s); 1 sent on to the judge" in proc.stdout
    runs = _runs(db)
    # two batches: the first holds the template's 4 seeds; the second its new configurations, of which a random draw
    # can repeat one the run already holds (dropped), in about one run in ten
    assert len(runs) == 1 and runs[0]["evaluated"] == 2 and runs[0]["screened"] >= 6
    assert isinstance(runs[0]["screened"], int) and isinstance(runs[0]["evaluated"], int)
    shown = subprocess.run(CLI + ["show", "latest", "--db", str(db)], capture_output=True, text=True, timeout=120,
                           env=ENV, check=True).stdout
    assert "screened out" in shown and f"screened {runs[0]['screened']}," in shown
    report = (out / "report.html").read_text()
    assert "<h2>Screen</h2>" in report and (out / "best.py").is_file()


def test_a_screened_run_on_two_workers(tmp_path):
    """The local pool's two workers with the screen on (the processes started ahead, batches and finalists sharing
    the workers): the run ends on its limit with its counts stored."""
    db = tmp_path / "ke.db"
    _optimize(db, tmp_path / "out", "--screen-batch", "3", "--finalists", "1", "--max-evals", "3", "--workers", "2")
    runs = _runs(db)
    assert runs[0]["evaluated"] == 3 and runs[0]["screened"] >= 3, runs
    assert "max-evals" in runs[0]["stop_reason"], runs
