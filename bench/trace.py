"""Set each screen and judge timing of a suite run beside the GPU trace of the same call (bench/gpu_all.sh writes
both): the SM clock, the power and throttle reasons, and how many processes used the SMs while it was timed.

    python3 bench/trace.py OUT/suite.json OUT/suite-120s.json --trace OUT/gpu_trace.csv --pmon OUT/pmon.txt

For every candidate both the screen and the judge timed, one line: the two times and their ratio, the host's launch
time for each (a host time near the GPU time means the device waited on the host), and for each timing window the
lowest SM clock and the most processes seen on the SMs at once, and what the timing process itself recorded of the
CPU while it timed: the machine's cores busy on average (its own included) and its own CPU time over the loop's wall
time (below 1 when it waited for a core). Rows whose ratio is off by more than --off come first.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

# Seconds after its start that a timing is taken to last: the screen times for about 25 ms after a brief warm-up, the
# judge for its budget (300 ms in the suite) after a 100 ms warm-up and a calibration loop.
SCREEN_WINDOW_S = 0.5
JUDGE_WINDOW_S = 1.5


def _epoch(stamp: str, fmt: str) -> float:
    return dt.datetime.strptime(stamp.strip(), fmt).replace(tzinfo=dt.timezone.utc).timestamp()


def read_trace(path: Path) -> list[tuple[float, float, float, str]]:
    """(epoch s, SM MHz, power W, throttle reasons) per sample of ``nvidia-smi --query-gpu ... -lms``."""
    rows = []
    for line in path.read_text().splitlines()[1:]:
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((_epoch(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1]), float(parts[3]), parts[6]))
        except (ValueError, IndexError):
            continue
    return rows


def read_pmon(path: Path) -> dict[float, set[int]]:
    """Per second of ``nvidia-smi pmon -s u -o DT``: the PIDs with a nonzero share of the SMs."""
    busy: dict[float, set[int]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#") or len(parts) < 6:
            continue
        try:
            t = _epoch(f"{parts[0]} {parts[1]}", "%Y%m%d %H:%M:%S")
            pid, sm = int(parts[3]), parts[5]
        except ValueError:
            continue
        busy.setdefault(t, set())
        if sm not in ("-", "0"):
            busy[t].add(pid)
    return busy


def window(at: float | None, length: float, trace: list, busy: dict[float, set[int]]) -> dict[str, Any] | None:
    if at is None:
        return None
    samples = [r for r in trace if at - 0.25 <= r[0] <= at + length]
    seconds = [pids for t, pids in busy.items() if at - 1.0 <= t <= at + length]
    return {"min_mhz": min((r[1] for r in samples), default=None), "max_w": max((r[2] for r in samples), default=None),
            "reasons": sorted({r[3] for r in samples}), "most_on_sms": max((len(p) for p in seconds), default=None)}


def rows(suite_files: list[Path], trace: list, busy: dict[float, set[int]]) -> list[dict[str, Any]]:
    out = []
    for f in suite_files:
        data = json.loads(f.read_text())
        for row in data["rows"]:
            for c in row.get("candidates", []):
                if c.get("screen_ms") and c.get("ms"):
                    out.append({"file": f.name, "problem": row["problem"], "label": f"{c['proposer']}: {c['label']}",
                                "screen_ms": c["screen_ms"], "judge_ms": c["ms"], "ratio": c["ms"] / c["screen_ms"],
                                "screen_host_ms": c.get("screen_host_ms"), "judge_host_ms": c.get("host_ms"),
                                "screen_cpu": c.get("screen_cpu") or {}, "judge_cpu": c.get("cpu") or {},
                                "screen": window(c.get("screen_at"), SCREEN_WINDOW_S, trace, busy),
                                "judge": window(c.get("judged_at"), JUDGE_WINDOW_S, trace, busy)})
    return out


def _fmt(v: Any, spec: str = ".4g") -> str:
    return "—" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", nargs="+", type=Path, help="suite JSON files of the traced call")
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--pmon", type=Path)
    ap.add_argument("--off", type=float, default=0.2, help="a ratio further than this from 1 is listed first")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    found = rows(args.suite, read_trace(args.trace), read_pmon(args.pmon) if args.pmon else {})
    if not found:
        print("no candidate was timed by both the screen and the judge", file=sys.stderr)
        return 1
    found.sort(key=lambda r: (abs(r["ratio"] - 1) <= args.off, r["problem"]))
    print(f"{'problem':<24} {'candidate':<36} {'screen':>8} {'judge':>8} {'ratio':>6} {'host s/j':>13} "
          f"{'MHz s/j':>11} {'procs s/j':>9} {'cores s/j':>11} {'own s/j':>9}")
    for r in found:
        s, j = r["screen"] or {}, r["judge"] or {}
        print(f"{r['problem'][:24]:<24} {r['label'][:36]:<36} {r['screen_ms']:>8.4f} {r['judge_ms']:>8.4f} "
              f"{r['ratio']:>6.2f} {_fmt(r['screen_host_ms'], '.3f'):>6}/{_fmt(r['judge_host_ms'], '.3f'):<6} "
              f"{_fmt(s.get('min_mhz'), '.0f'):>5}/{_fmt(j.get('min_mhz'), '.0f'):<5} "
              f"{_fmt(s.get('most_on_sms'), 'd'):>4}/{_fmt(j.get('most_on_sms'), 'd'):<4} "
              f"{_fmt(r['screen_cpu'].get('busy_cores'), '.1f'):>5}/{_fmt(r['judge_cpu'].get('busy_cores'), '.1f'):<5} "
              f"{_fmt(r['screen_cpu'].get('self_cpu'), '.2f'):>4}/{_fmt(r['judge_cpu'].get('self_cpu'), '.2f'):<4}")
    ratios = [r["ratio"] for r in found]
    print(f"{len(found)} timed by both: median judge/screen {statistics.median(ratios):.3f}, "
          f"{sum(abs(x - 1) > args.off for x in ratios)} off by more than {args.off:.0%}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
