"""bench/trace.py: each timing of a suite run set beside the GPU trace of its call."""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

from tests.benchsuite import load_bench

ROOT = Path(__file__).resolve().parents[1]


trace = load_bench("trace")
T0 = dt.datetime(2026, 12, 2, 4, 41, 8, tzinfo=dt.timezone.utc).timestamp()


def _stamp(t: float, fmt: str) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(fmt)


def _write(tmp_path: Path) -> tuple[Path, Path, Path]:
    # the judge's window (t=10 s) saw a low clock and two processes on the SMs; the screen's (t=2 s) saw neither
    lines = ["timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, "
             "utilization.gpu [%], clocks_event_reasons.active"]
    for k in range(0, 60):
        t = T0 + k * 0.25
        mhz = 1200 if 10 <= t - T0 <= 11 else 1980
        lines.append(f"{_stamp(t, '%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, 3201, 500.5, 40, 90, 0x0000000000000000")
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")
    pmon = ["# Date       Time        gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command",
            "# YYYYMMDD   HH:MM:SS    Idx          #    C/G      %      %      %      %      %      %    name"]
    for s in range(0, 15):
        t = T0 + s
        pmon.append(f" {_stamp(t, '%Y%m%d   %H:%M:%S')}      0       100     C     60     10      -      -      -      -"
                    "    python3")
        if 10 <= s <= 11:
            pmon.append(f" {_stamp(t, '%Y%m%d   %H:%M:%S')}      0       200     C     30      5      -      -      -      "
                        "-    python3")
    (tmp_path / "pmon.txt").write_text("\n".join(pmon) + "\n")
    cands = [{"proposer": "template", "label": "a", "screen_ms": 0.1, "ms": 0.2, "screen_host_ms": 0.02,
              "host_ms": 0.03, "screen_at": T0 + 2, "judged_at": T0 + 10,
              "screen_cpu": {"busy_cores": 1.0, "self_cpu": 1.0}, "cpu": {"busy_cores": 15.5, "self_cpu": 0.5}},
             {"proposer": "template", "label": "b", "screen_ms": 0.1, "ms": 0.101, "screen_at": T0 + 3,
              "judged_at": T0 + 5},
             {"proposer": "inductor", "label": "screened out", "screen_ms": 0.3, "ms": None}]
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"rows": [{"problem": "p", "candidates": cands}]}))
    return suite, tmp_path / "trace.csv", tmp_path / "pmon.txt"


def test_each_timing_gets_the_clock_and_the_processes_of_its_window(tmp_path):
    suite, csv, pmon = _write(tmp_path)
    got = trace.rows([suite], trace.read_trace(csv), trace.read_pmon(pmon))
    assert [r["label"] for r in got] == ["template: a", "template: b"]  # judged and screened only
    a, b = got
    assert a["ratio"] == 2.0 and a["judge_host_ms"] == 0.03
    assert a["judge_cpu"]["busy_cores"] == 15.5 and a["screen_cpu"]["self_cpu"] == 1.0 and b["judge_cpu"] == {}
    assert a["judge"]["min_mhz"] == 1200 and a["judge"]["most_on_sms"] == 2
    assert a["screen"]["min_mhz"] == 1980 and a["screen"]["most_on_sms"] == 1
    assert b["judge"]["min_mhz"] == 1980 and b["judge"]["most_on_sms"] == 1


def test_the_command_lists_the_rows_off_first(tmp_path, capsys, monkeypatch):
    suite, csv, pmon = _write(tmp_path)
    monkeypatch.setattr(sys, "argv", ["trace.py", str(suite), "--trace", str(csv), "--pmon", str(pmon)])
    assert trace.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("p ") and "template: a" in out[1]
    assert "2 timed by both" in out[-1] and "1 off by more than 20%" in out[-1]
