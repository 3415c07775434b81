"""A whole model through the pipeline on the CPU: the regions' answers composed, the composition judged against the
model, and a composition that does not win dropped down to the best baseline's kernel."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.model import run as run_mod
from kernelevolve.model.plan import RegionOutcome
from kernelevolve.optimize import OptimizeConfig
from kernelevolve.problem import build_model, import_module_from_path
from kernelevolve.store import Store
from tests.model.test_regions import BLOCKS


def _own_code_as_kernels(monkeypatch: pytest.MonkeyPatch, broken: str | None = None) -> None:
    """Each problem 'answers' with its own reference as a kernel (one of them broken, if asked: a per-column shift,
    which a layer norm after it would not hide), as a run would."""
    def fake(plan, cfg, store, on_stage=lambda s: None, resume=False, deadline=None, head_to_head=False):
        out = []
        for g in plan.groups:
            best = plan.out_dir / g.name / "best.py"
            best.parent.mkdir(parents=True, exist_ok=True)
            body = "\n\nclass ModelNew(Model):\n    pass\n"
            if g.name == broken:
                body = "\n\nclass ModelNew(Model):\n    def forward(self, *xs):\n        y = super().forward(*xs)\n        return y + torch.arange(y.shape[-1], dtype=y.dtype)\n"
            best.write_text(g.path.read_text() + body)
            out.append(RegionOutcome(g.name, 1, best, 1.5, "test", "candidate"))
        return out
    monkeypatch.setattr(run_mod, "optimize_regions", fake)


def _run(tmp_path: Path, **cfg) -> run_mod.ModelOutcome:
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    config = OptimizeConfig(device="cpu", timing_budget_ms=50.0, counters=False, **cfg)
    return run_mod.optimize_model(path, config, Store(tmp_path / "runs.db"), tmp_path / "out", budget_s=60.0,
                                  min_share=0.0)


def test_the_composition_is_judged_and_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, head_to_head=False)
    assert outcome.status == "ok" and len(outcome.kept) == 3, outcome.dropped
    text = outcome.best_model.read_text()
    assert text.startswith("# the model with 3 region kernels, verified")
    mod = import_module_from_path(outcome.best_model, "_om_best")
    assert build_model(mod, "ModelNew", 0) is not None
    assert (tmp_path / "out" / "model_report.json").exists()
    # standalone: judged from a folder with nothing else in it, by the command a user would run
    from kernelevolve.cli import main

    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "best_model.py").write_text(text)
    assert main(["check", str(tmp_path / "blocks.py"), str(alone / "best_model.py"), "--device", "cpu",
                 "--no-baseline", "--timing-budget-ms", "50"]) == 0


def test_a_region_kernel_that_breaks_the_model_leaves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _own_code_as_kernels(monkeypatch, broken="r00")
    outcome = _run(tmp_path, head_to_head=False)
    assert outcome.status == "ok"
    # the broken one goes, and only it (the kernels go back one at a time, each kept where the model stays right):
    # dropped by gain instead, kernels of blocks whose profiled times tie went first in one run and stayed in another
    # the kept come in the plan's order, where two blocks of equal profiled time come either way
    assert sorted(outcome.kept) == ["r01", "r06"], (outcome.kept, outcome.dropped)
    assert len(outcome.dropped) == 1 and outcome.dropped[0].startswith("r00: the composition was incorrect"), \
        outcome.dropped


@pytest.mark.slow
def test_a_composition_no_faster_than_the_model_is_not_the_answer(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, rivals=("eager",))
    assert not outcome.kept and len(outcome.dropped) == 3, outcome.dropped
    assert "best_model.py is" in outcome.why and outcome.best_model.exists()


def test_a_model_run_patches_a_live_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import kernelevolve
    from kernelevolve.runtime import PatchedModule

    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, head_to_head=False)
    assert outcome.kept
    mod = import_module_from_path(tmp_path / "blocks.py", "_om_live")
    live = build_model(mod, "Model", 5)
    x = torch.randn(64, 32)
    with torch.no_grad():
        want = live(x)
    # the model itself, patched in place, its state shared
    assert kernelevolve.patch(live, run=tmp_path / "out") == [""]
    with torch.no_grad():
        torch.testing.assert_close(live(x), want)
        torch.testing.assert_close(live(x), want)  # after the first-call check: the kernel alone
    assert set(live.state_dict()) == set(build_model(mod, "Model", 5).state_dict())

    # as a submodule of a larger model
    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = build_model(mod, "Model", 5)

        def forward(self, x):
            return self.inner(x) * 2

    outer = Outer()
    assert kernelevolve.patch(outer, run=tmp_path / "out" / "best_model.py") == ["inner"]
    assert isinstance(outer.inner, PatchedModule)
    with torch.no_grad():
        torch.testing.assert_close(outer(x), want * 2)
    # a run whose model is another class leaves the model alone
    assert kernelevolve.patch(torch.nn.Linear(3, 3), run=tmp_path / "out") == []


def test_a_model_run_is_a_run_to_show_approve_and_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The composition is a node of the model's own run: the same approval gate and export as an operator's kernel,
    and the exported module is the model, drop-in, with the composition behind its guard."""
    import torch

    from kernelevolve.cli import main

    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, head_to_head=False)
    store = Store(tmp_path / "runs.db")
    run = store.run(outcome.run_id)
    assert run.status == "finished" and run.config["model"]["regions"] and "region kernels" in run.stop_reason
    nodes = store.nodes(run.id)
    assert [n.proposer for n in nodes] == ["compose"] and nodes[0].ok
    assert nodes[0].source == outcome.best_model.read_text().split("\n", 2)[2]  # best_model.py less its header
    db = ["--db", str(tmp_path / "runs.db")]
    assert main(["show", str(run.id), *db]) == 0 and "compose" in capsys.readouterr().out
    assert main(["report", str(run.id), "--out", str(tmp_path / "report"), *db]) == 0
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "best.py").exists()
    out = tmp_path / "export" / "blocks_kernels.py"
    assert main(["export", str(run.id), "--out", str(out), *db]) == 2  # not approved: the gate holds
    assert "not approved" in capsys.readouterr().err
    assert main(["approve", str(run.id), "--note", "checked", *db]) == 0
    assert main(["export", str(run.id), "--out", str(out), "--device", "cpu", *db]) == 0
    from tests.model.test_compose import assert_new_matches_model

    mod = assert_new_matches_model(out, "_om_export", 0, torch.randn(64, 32))
    assert mod.KERNELEVOLVE_EXPORT["run"] == run.id and mod.KERNELEVOLVE_EXPORT["proposer"] == "compose"


def test_the_report_shows_the_time_by_region_before_and_after(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kernelevolve.model.report import REST, WHOLE_ROW, waterfall_lines

    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, head_to_head=False)
    steps = outcome.waterfall
    assert [s.name for s in steps] == [*outcome.kept, REST, WHOLE_ROW], outcome.notes
    # measured, not copied: every kept kernel took some time, and the parts add up to the whole
    assert all(s.after_ms is not None and s.after_ms > 0 for s in steps[:-2])
    whole = steps[-1]
    assert whole.after_ms == pytest.approx(sum(s.after_ms for s in steps[:-1]))
    assert whole.before_ms == pytest.approx(sum(s.before_ms for s in steps[:-1]))
    html = outcome.report.read_text()
    assert "<svg" in html and all(s.name in html for s in steps)
    assert len(waterfall_lines(steps)) == len(steps) + 1
    rows = json.loads((tmp_path / "out" / "model_report.json").read_text())["waterfall"]
    assert [r["name"] for r in rows] == [s.name for s in steps]


def test_both_hosts_are_judged_and_the_faster_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _own_code_as_kernels(monkeypatch)
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    config = OptimizeConfig(device="cpu", timing_budget_ms=50.0, counters=False, head_to_head=False)
    store = Store(tmp_path / "runs.db")
    outcome = run_mod.optimize_model(path, config, store, tmp_path / "out", budget_s=60.0, min_share=0.0,
                                     hosts=("eager", "compile"))
    nodes = store.nodes(outcome.run_id)
    assert [n.meta["label"].split(", ")[1].split(" (")[0] for n in nodes] == ["eager host", "compile host"]
    assert all(n.ok for n in nodes), [n.result.reason for n in nodes]
    kept = min(nodes, key=lambda n: n.result.runtime_ms)
    assert outcome.best_model.read_text().endswith(kept.source) and "host" in outcome.why
    with pytest.raises(ValueError, match="unknown host"):
        run_mod.optimize_model(path, config, store, tmp_path / "o2", budget_s=60.0, hosts=("jit",))


def test_a_model_that_cannot_be_captured_is_optimized_by_its_parts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """.item() in the model's forward stops the whole trace; its blocks (three alike: one part) and its head trace on
    their own, each runs as a model of its own, and best_model.py runs their kernels inside the model's own code."""
    import torch

    from tests.model.test_compose import assert_new_matches_model

    _own_code_as_kernels(monkeypatch)
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS.replace("return torch.sigmoid(self.head(x))",
                                   "return torch.sigmoid(self.head(x)) * float(x.sum().item() > -1e9)"))
    config = OptimizeConfig(device="cpu", timing_budget_ms=50.0, counters=False, head_to_head=False)
    store = Store(tmp_path / "runs.db")
    outcome = run_mod.optimize_model(path, config, store, tmp_path / "out", budget_s=60.0, min_share=0.0)
    assert outcome.plan is None and outcome.status == "ok", (outcome.why, outcome.dropped, outcome.notes)
    assert [(r["name"], len(r["paths"])) for r in outcome.parts] == [("p_blocks_0", 3), ("p_head", 1)] or \
        sorted((r["name"], len(r["paths"])) for r in outcome.parts) == [("p_blocks_0", 3), ("p_head", 1)]
    assert "p_blocks_0" in outcome.kept and "parts' kernels" in outcome.why
    assert any("stopped at blocks.py line" in n for n in outcome.notes)
    # each part is a model run of its own, with its own report
    assert all(r["run_id"] is not None and Path(r["report"]).exists() for r in outcome.parts)
    # standalone, computes the model, and runs the parts' region kernels
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "best_model.py").write_text(outcome.best_model.read_text())
    mod = assert_new_matches_model(alone / "best_model.py", "_parts_best", 0, torch.randn(64, 32))
    assert "_kernelevolve_bind_parts" in outcome.best_model.read_text()
    names = [s.name for s in outcome.waterfall]
    assert names[:-2] == outcome.kept and outcome.waterfall[-1].after_ms is not None, outcome.notes
    assert store.nodes(outcome.run_id)[0].proposer == "compose"
    new = build_model(mod, "ModelNew", 0)
    x = torch.randn(64, 32)
    with torch.no_grad():
        new(x)  # the first call binds the parts to their instances
        calls = []
        for block in new.blocks:  # each instance's forward is its part's composition: count its region kernels
            scope = block.__dict__["forward"].__func__.__globals__
            real = scope["_kernelevolve_call"]
            scope["_kernelevolve_call"] = lambda *a, real=real: calls.append(1) or real(*a)
        new(x)
    assert len(calls) >= 3


def test_a_live_model_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernelevolve.optimize_model(model, inputs): the live model saved beside a problem file whose inputs are
    fresh draws, the run as for a file, and its answer applied to the live model, sharing its tensors."""
    import torch

    import kernelevolve
    from tests.model.live_blocks import Blocks

    _own_code_as_kernels(monkeypatch)
    torch.manual_seed(3)
    live = Blocks()
    outcome = kernelevolve.optimize_model(live, [torch.randn(64, 32)], out=tmp_path / "out",
                                          db=tmp_path / "runs.db", device="cpu", time_budget_s=60.0, min_share=0.0,
                                          timing_budget_ms=50.0, counters=False, head_to_head=False)
    assert outcome.status == "ok" and outcome.kept, (outcome.why, outcome.dropped)
    problem = import_module_from_path(next((tmp_path / "out" / "input").glob("*.py")), "_live_problem")
    a, b = problem.get_inputs(), problem.get_inputs()
    assert a[0].shape == (64, 32) and not torch.equal(a[0], b[0])  # fresh draws
    fast = outcome.apply(live)
    assert fast.model is live and {p.data_ptr() for p in fast.parameters()} == {p.data_ptr() for p in live.parameters()}
    x = torch.randn(64, 32)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), live(x))
        live.head.bias.add_(1.0)  # the live model's weights, not a copy
        torch.testing.assert_close(fast(x), live(x))
    with pytest.raises(ValueError, match="torch.save"):
        kernelevolve.optimize_model(live, lambda: [torch.randn(64, 32)], out=tmp_path / "o2", device="cpu")


def test_the_whole_pipeline_on_the_cpu(tmp_path: Path) -> None:
    """No stand-ins: a small model's regions found and written, each optimized by the template and inductor
    proposers under the interpreter, the winners composed and judged against the model, the model run approved
    and exported, and its answer patched into a live model."""
    import torch

    import kernelevolve
    from kernelevolve.cli import main

    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    db = tmp_path / "runs.db"
    config = OptimizeConfig(device="cpu", timing_budget_ms=50.0, counters=False, max_evals=2, head_to_head=False)
    outcome = run_mod.optimize_model(path, config, Store(db), tmp_path / "out", budget_s=600.0, min_share=0.3)
    ran = [r for r in outcome.regions if r.run_id is not None]
    assert ran and all((tmp_path / "out" / f"region_{r.name}.py").exists() for r in ran)
    assert outcome.status == "ok" and outcome.best_model.exists(), (outcome.why, outcome.dropped)
    args = ["--db", str(db)]
    assert main(["approve", str(outcome.run_id), "--note", "pipeline test", *args]) == 0
    exported = tmp_path / "export" / "blocks_fast.py"
    assert main(["export", str(outcome.run_id), "--out", str(exported), "--device", "cpu", *args]) == 0
    assert exported.exists()
    mod = import_module_from_path(path, "_pipeline_model")
    live = build_model(mod, "Model", 2)
    x = torch.randn(64, 32)
    with torch.no_grad():
        want = live(x)
        assert kernelevolve.patch(live, run=tmp_path / "out") == [""]
        torch.testing.assert_close(live(x), want)


@pytest.mark.slow
def test_a_model_run_resumes(tmp_path: Path) -> None:
    """The same command again with --resume: problems whose runs finished keep their answers (no new run), one whose
    run stopped goes on in that run."""
    path = tmp_path / "blocks.py"
    path.write_text(BLOCKS)
    store = Store(tmp_path / "runs.db")
    config = OptimizeConfig(device="cpu", timing_budget_ms=50.0, counters=False, max_evals=1, head_to_head=False)
    first = run_mod.optimize_model(path, config, store, tmp_path / "out", budget_s=600.0, min_share=0.3)
    ran = {r.name: r.run_id for r in first.regions if r.run_id is not None}
    assert ran
    stopped = next(iter(ran.values()))
    store.update_run(stopped, status="interrupted")
    stages: list[str] = []
    again = run_mod.optimize_model(path, config, store, tmp_path / "out", budget_s=600.0, min_share=0.3,
                                   on_stage=stages.append, resume=True)
    assert {r.name: r.run_id for r in again.regions if r.run_id is not None} == ran  # the same runs, no new ones
    assert sum("finished earlier" in s for s in stages) == len(ran) - 1
    assert any(f"run {stopped} resumed" in s for s in stages)
    assert store.run(stopped).status == "finished"


def _no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(plan, cfg, store, on_stage=lambda s: None, resume=False, deadline=None, head_to_head=False):
        return [RegionOutcome(g.name, 1, None, None, "the reference itself", "eager") for g in plan.groups]
    monkeypatch.setattr(run_mod, "optimize_regions", fake)


@pytest.mark.parametrize("fastest", ["compiled", "eager", "error"])
def test_with_no_region_kernel_the_answer_is_the_fastest_build_of_the_model(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           fastest: str) -> None:
    """No composition to judge: the model itself still meets its torch.compile build head to head, and the answer is
    the faster (a head-to-head that cannot be held leaves the model itself, and says so)."""
    from kernelevolve.evaluate.evaluator import Evaluator, HeadToHeadError
    from kernelevolve.evaluate.headtohead import CANDIDATE, decide

    held: list[str] = []

    def fake_h2h(self, candidate, sides, gpu=None, rounds=10):
        held.append(candidate.meta.get("label", ""))
        if fastest == "error":
            raise HeadToHeadError("a process died")
        return decide({CANDIDATE: [1.0] * 10, "eager": [1.0] * 10,
                       "compiled": [0.5 if fastest == "compiled" else 2.0] * 10}, notes={})

    monkeypatch.setattr(Evaluator, "head_to_head", fake_h2h)
    _no_kernels(monkeypatch)
    outcome = _run(tmp_path, rivals=("eager", "compiled"))
    assert held == ["the model itself"] and not outcome.kept
    text = outcome.best_model.read_text()
    if fastest == "compiled":
        assert "best_model.py is torch.compile of it" in outcome.why and "torch.compile" in text
        assert outcome.head_to_head.answer == "compiled"
    else:
        assert "best_model.py is the model itself" in outcome.why
    if fastest == "error":
        assert outcome.head_to_head is None and any("not timed head to head" in n for n in outcome.notes)


def test_with_no_region_kernel_the_waterfall_times_the_model_itself_before(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel kept: before is the model's own class (in best_model.py), not the generated op-by-op forward."""
    from kernelevolve.model import profile
    from kernelevolve.model.report import WHOLE_ROW

    timed: list[tuple[str, str]] = []

    def fake_times(path, region_of, device="cpu", runs=5, warmup=2, cls="ModelNew"):
        timed.append((Path(path).name, cls))
        return {profile.WHOLE: 3.0 if cls == "Model" else 2.0}

    monkeypatch.setattr(profile, "composed_times", fake_times)
    _no_kernels(monkeypatch)
    outcome = _run(tmp_path, head_to_head=False)
    assert not outcome.kept
    assert sorted(timed) == [("best_model.py", "Model"), ("best_model.py", "ModelNew")], timed
    whole = next(s for s in outcome.waterfall if s.name == WHOLE_ROW)
    assert (whole.before_ms, whole.after_ms) == (3.0, 2.0)


def test_a_composition_that_loses_is_profiled_beside_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost head-to-head leaves a note with the composition's and the model's own time by the profiler, so a loss
    on the host reads apart from a loss in the kernels."""
    from kernelevolve.evaluate.evaluator import Evaluator
    from kernelevolve.evaluate.headtohead import CANDIDATE, decide
    from kernelevolve.model import profile

    timed: list[tuple[str, str, tuple[str, ...]]] = []

    def fake_times(path, region_of, device="cpu", runs=5, warmup=2, cls="ModelNew"):
        timed.append((Path(path).name, cls, tuple(sorted(set(region_of.values())))))
        return {profile.WHOLE: 0.5 if cls == "ModelNew" else 0.7, **{n: 0.1 for n in region_of.values()}}

    def losing(self, candidate, sides, gpu=None, rounds=10):
        return decide({CANDIDATE: [2.0] * 10, "eager": [1.0] * 10}, notes={})

    monkeypatch.setattr(profile, "composed_times", fake_times)
    monkeypatch.setattr(Evaluator, "head_to_head", losing)
    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path, rivals=("eager",))
    lost = [n for n in outcome.notes if n.startswith("the composition that lost")]
    assert len(lost) == len(outcome.dropped) == 3 and not outcome.kept, (outcome.notes, outcome.dropped)
    assert "0.5000 ms of CPU time a call against 0.7000 ms for the model's own forward" in lost[0], lost[0]
    assert ("lost.py", "ModelNew", ("r00", "r01", "r06")) in timed and ("lost.py", "Model", ()) in timed, timed


def test_after_a_loss_a_composition_meets_the_fastest_build_alone(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The first head-to-head builds every baseline of the whole model; once it is lost, each later one meets only
    the fastest of them (a max-autotune build of a whole model takes minutes), and the answer still reports all
    three, the others carried over from the first."""
    from kernelevolve.evaluate.evaluator import Evaluator
    from kernelevolve.evaluate.headtohead import CANDIDATE, decide
    from kernelevolve.model import profile

    sides_seen: list[tuple[str, ...]] = []
    times = {"eager": 1.0, "compiled": 1.5, "max_autotune": 2.5}

    def fake_times(path, region_of, device="cpu", runs=5, warmup=2, cls="ModelNew"):
        return {profile.WHOLE: 1.0, **{n: 0.1 for n in region_of.values()}}

    def rounds(self, candidate, sides, gpu=None, rounds=10):
        sides_seen.append(tuple(sides))
        ms = 2.0 if len(sides_seen) == 1 else 1.2  # the first loses; later ones lose too, to drop every kernel
        return decide({CANDIDATE: [ms] * 10, **{s: [times[s]] * 10 for s in sides}}, notes={})

    monkeypatch.setattr(profile, "composed_times", fake_times)
    monkeypatch.setattr(Evaluator, "head_to_head", rounds)
    _own_code_as_kernels(monkeypatch)
    outcome = _run(tmp_path)
    assert sides_seen[0] == ("eager", "compiled", "max_autotune") and len(sides_seen) == 3, sides_seen
    assert all(s == ("eager",) for s in sides_seen[1:]), sides_seen
    h = outcome.head_to_head
    assert h.speedup == pytest.approx({"eager": 1.0, "compiled": 1.5, "max_autotune": 2.5})
    assert "not timed again" in h.notes["max_autotune"]
    from kernelevolve.model.report import ends_line

    assert ends_line(outcome) == ("1.00x vs eager, 1.50x vs compiled (carried over), "
                                  "2.50x vs max_autotune (carried over)")


@pytest.mark.parametrize("calls, on_host", [({"candidate": 1.1, "eager": 0.74}, True),
                                            ({"candidate": 0.75, "eager": 0.74}, True),
                                            ({"candidate": 0.70, "eager": 0.74}, False)])
def test_a_loss_with_less_device_time_is_named_a_loss_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                calls: dict[str, float], on_host: bool) -> None:
    from kernelevolve.model import profile
    from kernelevolve.model.run import _where_it_lost
    from kernelevolve.candidate import Candidate

    def fake_times(path, region_of, device="cpu", runs=5, warmup=2, cls="ModelNew"):
        return {profile.WHOLE: 0.48 if cls == "ModelNew" else 0.70, **{n: 0.1 for n in region_of.values()}}

    monkeypatch.setattr(profile, "composed_times", fake_times)
    line = _where_it_lost(Candidate("x = 1\n"), [], tmp_path, "cuda", {}, calls)
    assert line.startswith("the composition that lost, by the profiler: 0.4800 ms of device time")
    assert ("lost on the host" in line) == on_host, line
