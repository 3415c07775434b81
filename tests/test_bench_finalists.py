"""bench/finalists.py: what a batch's later finalists bought, read from suite rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.benchsuite import load_bench

ROOT = Path(__file__).resolve().parents[1]


finalists = load_bench("finalists")


def cand(at: float, screen_ms: float | None, ms: float | None, proposer: str = "template",
         judged_at: float | None = None) -> dict:
    return {"proposer": proposer, "label": f"c{at}", "screen_at": at, "screen_ms": screen_ms, "ms": ms,
            "judged_at": judged_at}


ROWS = [
    {"problem": "p", "candidates": [
        # a seed: judged before the search, never screened
        {"proposer": "inductor", "label": "seed", "screen_at": None, "screen_ms": None, "ms": 0.9, "judged_at": 90.0},
        # batch 1, its timings 4 s apart: the first finalist agreed with the screen, the second was slower
        cand(100.0, 1.0, 1.01, judged_at=105.0), cand(104.0, 1.1, 1.12, judged_at=106.0), cand(104.2, 2.0, None),
        # batch 2: the first was judged 2x its screen time, the second won
        cand(110.0, 0.5, 1.0, judged_at=111.0), cand(110.1, 0.6, 0.61, judged_at=112.0),
        # another proposer's candidate right after: a batch of its own, one judged finalist and a backup not judged
        cand(112.5, 0.7, 0.7, "inductor", judged_at=113.0), dict(cand(112.6, 0.75, None, "inductor"),
                                                                   backup="not judged")]},
]


def test_batches_split_on_judge_timings_and_proposer():
    groups = finalists.batches(ROWS[0])
    assert [len(g) for g in groups] == [3, 2, 2]


def test_pairs_and_the_printed_counts(tmp_path):
    pairs = finalists.judged_pairs(ROWS)
    assert [(p["first_ms"], p["rest_ms"]) for p in pairs] == [(1.01, 1.12), (1.0, 0.61)]
    f = tmp_path / "suite.json"
    f.write_text(json.dumps({"rows": ROWS}))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "finalists.py"), str(f)], capture_output=True,
                         text=True, check=True).stdout
    assert "2 batches with two judged finalists or more; a later finalist judged >1% faster than the first in 1" in out
    assert "within 5% in 1: its backups would not be judged; of those, a backup was >1% faster in 0" in out
    assert "backup finalists not judged (rows since the backups were marked): 1, in 1 batches" in out
