"""What a batch's second finalist bought, read from suite JSON files (bench/suite.py): for each screen batch with two
or more judged finalists, whether a later finalist was judged faster than the batch's fastest on the screen, and
whether the judge's time of that fastest agreed with its screen time.

    python3 bench/finalists.py bench/results/2026-12-02-h200-suite-screen-40s.json ... [--agree 0.05]

The rows do not name a candidate's batch. On one GPU the judge and the screen take turns on it, and a batch's finalists
are judged before the next batch starts, so a batch is taken to be one proposer's candidates screened with no judge
timing begun in between (two batches with nothing judged between them fall into one group, which adds no judged
finalist to it). Candidates without a screen time (rows written before screen times were recorded) are left out. The
last line counts the backup finalists a batch did not judge because its first finalist agreed with the screen (rows
written since those backups are marked).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def batches(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """One row's screened candidates, grouped into batches: split where the proposer changes or a judge timing began
    between two screen timings."""
    cands = row.get("candidates", [])
    timed = sorted((c for c in cands if c.get("screen_at")), key=lambda c: c["screen_at"])
    judged = sorted(c["judged_at"] for c in cands if c.get("judged_at"))
    out: list[list[dict[str, Any]]] = []
    for c in timed:
        last = out[-1][-1] if out else None
        if last is not None and c["proposer"] == last["proposer"] \
                and not any(last["screen_at"] < t < c["screen_at"] for t in judged):
            out[-1].append(c)
        else:
            out.append([c])
    return out


def judged_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each batch with two judged finalists or more: its problem, the fastest's screen and judge times, and the
    best judge time among the others."""
    out = []
    for row in rows:
        for batch in batches(row):
            judged = sorted((c for c in batch if c.get("ms") and c.get("screen_ms")), key=lambda c: c["screen_ms"])
            if len(judged) < 2:
                continue
            first, rest = judged[0], judged[1:]
            out.append({"problem": row["problem"], "first_screen_ms": first["screen_ms"], "first_ms": first["ms"],
                        "rest_ms": min(c["ms"] for c in rest)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="suite JSON files")
    ap.add_argument("--agree", type=float, default=0.05, help="judge/screen agreement that drops the backups")
    args = ap.parse_args()
    rows = [r for f in args.files for r in json.loads(f.read_text())["rows"]]
    pairs = judged_pairs(rows)
    won = [p for p in pairs if p["rest_ms"] < 0.99 * p["first_ms"]]
    agreed = [p for p in pairs if abs(p["first_ms"] / p["first_screen_ms"] - 1) <= args.agree]
    lost = [p for p in won if p in agreed]
    print(f"{len(pairs)} batches with two judged finalists or more; a later finalist judged >1% faster than the first "
          f"in {len(won)}")
    for p in won:
        print(f"  {p['problem']}: first {p['first_ms']:.4g} ms (screen {p['first_screen_ms']:.4g}), "
              f"later {p['rest_ms']:.4g} ms")
    print(f"the first agreed with its screen time within {args.agree:.0%} in {len(agreed)}: its backups would not be "
          f"judged; of those, a backup was >1% faster in {len(lost)}")
    dropped = [b for r in rows for b in batches(r) if any(c.get("backup") == "not judged" for c in b)]
    print(f"backup finalists not judged (rows since the backups were marked): "
          f"{sum(c.get('backup') == 'not judged' for b in dropped for c in b)}, in {len(dropped)} batches")


if __name__ == "__main__":
    main()
