"""`kernelevolve optimize-model` from the command line: bad input is one line and exit code 2; a model runs through
on the CPU and leaves its problem files, best_model.py and the report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelevolve.cli import EXIT_USAGE, main
from tests.model.test_regions import BLOCKS


def test_a_missing_model_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["optimize-model", str(tmp_path / "nope.py"), "--device", "cpu", "--out", str(tmp_path / "o"),
                 "--db", str(tmp_path / "k.db")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and "nope.py" in err[0]


FLAT = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 32))

    def forward(self, x):
        return torch.sigmoid(x @ self.w) * float(x.sum().item() > 0)


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return []
'''


def test_a_model_that_cannot_be_captured_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No graph, and no submodule to optimize instead: one line, naming the line of the file that stopped it."""
    path = tmp_path / "m.py"
    path.write_text(FLAT)
    code = main(["optimize-model", str(path), "--device", "cpu", "--out", str(tmp_path / "o"),
                 "--db", str(tmp_path / "k.db")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and "could not be captured" in err[0], err
    assert "stopped at m.py line" in err[0] and ".item()" in err[0]  # the line of the user's file that stopped it
    assert "no submodule" in err[0]


@pytest.mark.slow
def test_a_model_runs_through_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "m.py"
    path.write_text(BLOCKS)
    out = tmp_path / "o"
    code = main(["optimize-model", str(path), "--device", "cpu", "--out", str(out), "--db", str(tmp_path / "k.db"),
                 "--time-budget", "20", "--min-share", "0.3", "--max-evals", "3"])
    text = capsys.readouterr().out
    assert code in (0, 1) and "best_model.py" in text
    assert (out / "best_model.py").exists() and (out / "m.py").exists()
    report = json.loads((out / "model_report.json").read_text())
    assert report["plan"]["problems"] and report["best_model"]
