"""Hardware counters through ncu (a stand-in on the CPU, tests/fakes/ncu.py): the options passed, the isolated target,
the raw CSV read, the bound named per kernel, and one line for each way the counters cannot be read."""
import os
import sys
from pathlib import Path

import pytest

from kernelevolve.counters import CountersError, diagnose, parse_raw_csv, render

ROOT = Path(__file__).resolve().parents[1]
FAKE = str(ROOT / "tests" / "fakes" / "ncu.py")
PROBLEM = str(ROOT / "tests" / "cheats" / "problem_scale.py")
CANDIDATE = str(ROOT / "tests" / "cheats" / "genuine_torch.py")


@pytest.fixture
def mode(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return lambda m: monkeypatch.setenv("FAKE_NCU_MODE", m)


def test_each_kernel_gets_its_counters_and_its_bound(mode, monkeypatch):
    mode("ok")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-seen")  # scrubbed on the way to ncu and its target
    kernels = diagnose(PROBLEM, "cpu", CANDIDATE, ncu=FAKE, major=9)
    slow, tiny = kernels
    assert slow.name == "at::native::vectorized_elementwise_kernel" and slow.duration_us == pytest.approx(812.345)
    assert slow.bound == "memory" and slow.why.startswith("memory-bound: DRAM 86% of peak")
    assert slow.stalls[0] == ("long_scoreboard", 14.2) and slow.spill_bytes == 0.0
    assert tiny.bound == "launch" and tiny.spill_bytes == 8192.0 and tiny.registers == 255
    table = render(kernels)
    assert table.splitlines()[1].startswith("at::native::vectorized_elementwise_kernel") and "launch-bound" in table


def test_a_metric_ncu_does_not_know_is_dropped_and_the_rest_read(mode):
    mode("unknown-metric")
    (slow, _) = diagnose(PROBLEM, "cpu", ncu=FAKE, major=9)  # both tensor-pipe metrics refused, in one retry
    assert slow.tensor_pct is None and slow.bound == "memory"


@pytest.mark.parametrize("how, fragment", [("perm", "not readable by this user (ERR_NVGPUCTRPERM)"),
                                            ("hang", "did not finish within 2 s")])
def test_counters_that_cannot_be_read_are_one_line(mode, how, fragment):
    mode(how)
    with pytest.raises(CountersError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        diagnose(PROBLEM, "cpu", ncu=FAKE, timeout_s=2)


def test_no_ncu_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CountersError, match="ncu is not on the PATH"):
        diagnose(PROBLEM, "cpu")


def test_a_target_that_fails_is_ncu_failing(mode, tmp_path):
    mode("ok")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no')\n")
    with pytest.raises(CountersError, match="ncu failed"):
        diagnose(PROBLEM, "cpu", str(broken), ncu=FAKE)


def test_the_raw_page_is_read_past_banners_with_units_and_separators():
    text = ('==PROF== Connected\nsome output of the target\n"ID","Kernel Name","gpu__time_duration.sum"\n'
            '"","","usecond"\n"0","k","1,234.5"\n')
    assert parse_raw_csv(text) == [{"name": "k", "gpu__time_duration.sum": 1234500.0}]
    assert parse_raw_csv("no csv at all") == []


def test_a_cuda_run_adds_the_counters_of_each_target_to_its_profile(mode, tmp_path, monkeypatch):
    """optimize's step: the reference's and a candidate's counters go into the profile, the report shows them with
    the roofline, and without ncu the profile says so once."""
    from kernelevolve.optimize import OptimizeConfig, _diagnose
    from kernelevolve.problem import load_problem
    from kernelevolve.report import render_report
    from tests.factories import make_profile

    mode("ok")
    monkeypatch.setenv("FAKE_NCU_RUN_TARGET", "0")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").symlink_to(FAKE)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    problem = load_problem(PROBLEM, "cpu")
    profile = make_profile(device_name="NVIDIA H200", flops=2e9, bytes=5e7, peak_flops=9.9e14, peak_bw=4.8e12,
                           ridge=206.0, ceilings_source="table")
    cfg = OptimizeConfig(device="cuda")
    got = _diagnose(problem, cfg, profile, [("reference", None), ("best (node 4)", "x = 1\n")], lambda s: None)
    assert set(got.counters) == {"reference", "best (node 4)"}
    assert got.counters["reference"]["kernels"][0]["bound"] == "memory"
    html = render_report({"run": {"id": 1}, "problem": {"name": "p"}, "profile": got.to_dict(),
                          "roofline_points": [("eager", 1.0), ("best (node 4)", 0.5)]})
    assert "<h2>Hardware counters (ncu)</h2>" in html and "<h3>best (node 4)</h3>" in html
    assert "<h2>Roofline</h2>" in html and "best (node 4):" in html
    assert _diagnose(problem, OptimizeConfig(device="cuda", counters=False), profile, [("reference", None)],
                     lambda s: None) is profile
    monkeypatch.setenv("PATH", "/nonexistent")
    bare = _diagnose(problem, cfg, profile, [("reference", None)], lambda s: None)
    assert bare.counters == {} and any("ncu is not on the PATH" in n for n in bare.notes)
