"""Result round trips and the suspect mark."""
import json

from kernelevolve.evaluate.result import Baseline, Result, Status, Timing


def _ok(ms: float) -> Result:
    return Result(Status.OK, "verified", timing=Timing.from_samples([ms, ms, ms], "cuda-events"), timed=True)


def test_round_trip_through_json():
    r = _ok(2.0).with_baseline(Baseline("cuda", Timing.from_samples([4.0], "x"), Timing.from_samples([3.0], "x")))
    back = Result.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r and back.speedup_eager == 2.0 and back.speedup_compile == 1.5


def test_faster_than_the_floor_is_suspect():
    assert "roofline floor" in _ok(0.5).flag_suspect(floor_ms=1.0).details["suspect"]
    assert "suspect" not in _ok(2.0).flag_suspect(floor_ms=1.0).details


def test_large_speedup_is_suspect():
    base = Baseline("cuda", Timing.from_samples([30.0], "x"), None)
    assert "over eager" in _ok(1.0).with_baseline(base).flag_suspect(None).details["suspect"]
    assert "suspect" not in _ok(10.0).with_baseline(base).flag_suspect(None).details


def test_untimed_is_never_suspect():
    r = Result(Status.OK, "verified; untimed")
    assert r.flag_suspect(floor_ms=1.0) is r
