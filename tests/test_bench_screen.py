"""bench/screen.py's reading of its samples: the fastest screen time at each value of each knob."""
from __future__ import annotations

from tests.benchsuite import load_bench

screen = load_bench("screen")


def test_knob_bests_keeps_the_fastest_ok_time_per_value_of_knobs_that_varied():
    def sample(prec, bm, ms, status="ok"):
        return {"genome": {"matmul": {"INPUT_PRECISION": prec, "BLOCK_M": bm, "GROUP_M": 8}}, "status": status, "ms": ms}

    samples = [sample("ieee", 128, 3.0), sample("tf32x3", 128, 2.0), sample("tf32x3", 64, 2.5),
               sample("ieee", 64, 0.1, status="incorrect"), sample("ieee", 64, None, status="timeout")]
    best = screen.knob_bests(samples)
    assert best == {"matmul": {"INPUT_PRECISION": {"tf32x3": 2.0, "ieee": 3.0}, "BLOCK_M": {"128": 2.0, "64": 2.5}}}
    assert list(best["matmul"]["INPUT_PRECISION"]) == ["tf32x3", "ieee"]  # fastest first; GROUP_M never varied
