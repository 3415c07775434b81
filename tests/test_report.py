from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from kernelevolve.report import render_report, write_report
from tests.factories import make_node

XSS = "<script>alert(1)</script>"
BEST_SOURCE = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2  # best"


def _node(nid: int, status: str, **kw: object) -> dict:
    node = {"id": nid, "parent": None, "proposer": "template", "language": "triton", "sha": f"{nid:064x}",
            "status": status, "reason": "", "runtime_ms": None, "timed": False, "speedup_eager": None,
            "speedup_compile": None, "compile_s": None, "load_s": None, "wall_s": 1.5,
            "created": "2025-01-01T00:00:00", "cached": False, "meta": {}, "error": "", "source": f"# node {nid}"}
    node.update(kw)
    return node


def _view(nodes: list[dict]) -> dict:
    return {
        "run": {"id": 7, "device": "cuda:0", "status": "done", "created": "2025-01-01T00:00:00", "finished": None,
                "config": {"budget": 10}, "kernelevolve_version": "0.1.0", "torch_version": "2.13",
                "triton_version": None},
        "problem": {"name": "relu<x>", "path": "problems/relu.py", "sha": "ab" * 32, "source": "class Model: pass"},
        "profile": {"device_name": "H200", "flops": 1_000_000, "bytes": 8_000_000, "floor_ms": 0.002,
                    "bound": "memory", "peak_flops": 9.9e14, "peak_bw": 4.8e12, "ceilings_source": "spec sheet",
                    "intensity": 0.125, "ridge": 206.0, "eager_ms": 0.05,
                    "top_ops": [{"name": "aten::relu", "self_ms": 0.04, "pct": 80.0, "calls": 1}],
                    "notes": ["memory bound"]},
        "baseline": {"eager_ms": 0.05, "compile_ms": 0.03, "compile_s": 4.2, "error": ""},
        "best": {"node": 1, "source": BEST_SOURCE, "why": "fastest timed candidate"},
        "nodes": nodes,
    }


def _full_view() -> dict:
    return _view([
        _node(1, "ok", runtime_ms=0.02, timed=True, speedup_eager=2.5, speedup_compile=1.5, compile_s=0.8,
              source=BEST_SOURCE),
        _node(2, "ok", parent=1, language="torch", reason="interpreter"),
        _node(3, "incorrect", parent=1, reason="max abs diff 3.1", error=XSS),
        _node(4, "rejected", parent=2, reason="calls the reference"),
    ])


def test_render_is_offline_and_escaped() -> None:
    html = render_report(_full_view())
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<(link|script)\b", html)
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "relu&lt;x&gt;" in html


def test_render_contents() -> None:
    html = render_report(_full_view())
    for nid in (1, 2, 3, 4):
        assert f'id="node-{nid}"' in html
    assert 'href="#node-2"' in html  # node 4's parent link
    for status in ("ok", "incorrect", "rejected"):
        assert f">{status}</span>" in html
    assert "untimed" in html and "2.50x" in html and "1.50x" in html
    assert "x * 2  # best" in html and "fastest timed candidate" in html
    assert "<svg" in html and "aten::relu" in html and "spec sheet" in html


def test_write_report(tmp_path: Path) -> None:
    out = write_report(_full_view(), tmp_path / "a" / "b" / "report.html")
    assert out.is_file() and out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_empty_and_sparse_views_render() -> None:
    view = _view([])
    view.update(profile=None, baseline=None, best=None)
    html = render_report(view)
    assert "<svg" in html and "no timed candidates" in html and "—" in html
    assert "<html" in render_report({})


def test_single_timed_point_renders() -> None:
    html = render_report(_view([_node(1, "ok", runtime_ms=0.02, timed=True, speedup_eager=2.5)]))
    assert "<circle" in html and "<polyline" in html


def test_best_is_the_reference_when_nothing_beats_eager():
    from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
    from kernelevolve.report import _best_view

    slow = make_node(3, Result(Status.OK, "verified", timing=Timing.from_samples([2.0], "cuda-events"), timed=True),
                     source="class ModelNew: ...")
    eager = Baseline("cuda", Timing.from_samples([1.0], "cuda-events"), None)
    view = _best_view(slow, "fastest timed candidate", eager, "class Model: ...")
    assert view["reference"] and view["node"] is None
    assert "class Model: ..." in view["source"] and "class ModelNew(Model)" in view["source"]
    fast = replace(slow, result=Result(Status.OK, "verified", timing=Timing.from_samples([0.5], "cuda-events"),
                                       timed=True))
    assert _best_view(fast, "fastest timed candidate", eager, "class Model: ...")["node"] == 3


def test_best_is_the_best_baselines_kernel_when_the_winner_loses_the_head_to_head():
    from kernelevolve.evaluate.headtohead import CANDIDATE, decide
    from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
    from kernelevolve.report import _best_view

    node = make_node(3, Result(Status.OK, "verified", timing=Timing.from_samples([0.9], "cuda-events"), timed=True),
                     source="class ModelNew: ...")
    base = Baseline("cuda", Timing.from_samples([2.0], "cuda-events"), Timing.from_samples([1.0], "cuda-events"))
    src = "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n"
    # the judge had the winner 10% ahead of torch.compile; the rounds find them level
    level = decide({CANDIDATE: [1.0] * 10, "eager": [2.0] * 10, "compiled": [1.0] * 10})
    view = _best_view(node, "fastest timed candidate", base, src, h2h=level)
    assert view["node"] is None and view["baseline"] == "compiled" and not view["reference"]
    assert "torch.compile(" in view["source"] and "class Model: ..." in view["source"]
    assert view["speedups"] == {"eager": 2.0, "compiled": 1.0} and "not faster than torch.compile" in view["why"]
    # level with eager: the reference itself
    level = decide({CANDIDATE: [1.0] * 10, "eager": [1.0] * 10})
    view = _best_view(node, "fastest timed candidate", base, src, h2h=level)
    assert view["reference"] and "class ModelNew(Model)" in view["source"]
    # a win: the node, its speedups from the rounds
    win = decide({CANDIDATE: [0.5] * 10, "eager": [2.0] * 10, "compiled": [1.0] * 10})
    view = _best_view(node, "fastest timed candidate", base, src, h2h=win)
    assert view["node"] == 3 and view["speedups"] == {"eager": 4.0, "compiled": 2.0} and "beyond the noise" in view["why"]


def test_without_a_head_to_head_a_winner_slower_than_torch_compile_is_not_the_answer():
    from kernelevolve.evaluate.headtohead import HeadToHead
    from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
    from kernelevolve.report import _best_view

    node = make_node(3, Result(Status.OK, "verified", timing=Timing.from_samples([1.5], "cuda-events"), timed=True))
    base = Baseline("cuda", Timing.from_samples([2.0], "cuda-events"), Timing.from_samples([1.0], "cuda-events"))
    for h2h in (None, HeadToHead.failed("call", "a process died")):
        view = _best_view(node, "fastest timed candidate", base, "class Model: ...", h2h=h2h)
        assert view["baseline"] == "compiled" and "no candidate beat torch.compile" in view["why"]
        assert view["speedups"]["eager"] == 2.0


def test_a_run_nothing_beat_says_best_py_is_the_reference_and_calls_no_node_best(tmp_path):
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
    from kernelevolve.problem import load_problem
    from kernelevolve.report import report_view
    from kernelevolve.store import Store
    from tests.factories import make_profile

    problem = load_problem(Path(__file__).resolve().parents[1] / "examples" / "gelu_mlp.py", "cpu")
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    store.update_run(run, baseline=Baseline("cpu", Timing.from_samples([1.0], "perf_counter"), None),
                     profile=make_profile(flops=2e9, bytes=5e7, peak_flops=1e12, peak_bw=1e11, ridge=10.0))
    node = store.add_node(run, problem.sha, "cpu:test", Candidate("x = 1\n", proposer="inductor"))
    store.save_result(node.id, Result(Status.OK, "verified", timing=Timing.from_samples([1.1], "perf_counter"),
                                      timed=True))
    view = report_view(store, run)
    assert view["best"]["node"] is None and view["best"]["reference"]
    assert not any(label.startswith("best") for label, _ in view["roofline_points"])
    assert (f"fastest candidate (node {node.id})", 1.1) in view["roofline_points"]
    text = " ".join(re.sub(r"<[^>]+>", " ", render_report(view)).split())
    assert "the reference is best.py: no candidate beat it" in text
    assert "0.91x fastest candidate vs eager" in text and "best speedup" not in text and "best runtime" not in text


def test_a_winning_node_keeps_its_best_cards():
    text = " ".join(re.sub(r"<[^>]+>", " ", render_report(_full_view())).split())
    assert "2.50x best speedup vs eager" in text and "is best.py" not in text


def test_roofline_has_axis_values_and_labels_apart():
    from kernelevolve.roofline import LABEL_GAP, MAX_LABELS, roofline_svg

    prof = {"flops": 2e9, "bytes": 5e7, "peak_flops": 9.9e14, "peak_bw": 4.8e12, "ridge": 206.0}
    points = [("eager", 1.0), ("torch.compile", 0.9), ("best (node 4)", 0.5)]
    points += [(f"start kernel_with_a_long_name_{i}.py", 1.0 + i / 100) for i in range(10)]
    svg = roofline_svg(prof, points)
    ticks = re.findall(r'<text [^>]*>([0-9.]+[kMGTP]?)</text>', svg)
    assert {"1T", "100T", "1"} <= set(ticks), ticks  # FLOP/s decades on y, intensity decades on x
    labels = re.findall(r'<text x="[0-9.]+" y="([0-9.]+)">([^<]+): \d+%', svg)
    assert len(labels) == MAX_LABELS and svg.count("<circle") == len(points)
    assert labels[0][1] == "best (node 4)"  # the fastest first
    rows = [float(y) for y, _ in labels]
    assert all(b - a >= LABEL_GAP - 0.01 for a, b in zip(rows, rows[1:])), rows
    assert all(len(name) <= 22 for _, name in labels)
