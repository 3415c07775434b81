"""The model with its regions' kernels put back: best_model.py computes the model, with the kernels it was given,
at every instance of their regions, and falls back to the model on other shapes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernelevolve.model.compose import Chosen, compose
from kernelevolve.model.plan import plan_model
from kernelevolve.problem import build_model, import_module_from_path, load_problem
from tests.model.test_regions import BAGS, BLOCKS


def assert_new_matches_model(path: Path, name: str, seed: int, *xs: torch.Tensor) -> object:
    """The file's ModelNew, given its Model's weights, computes what its Model does on ``xs``; returns the module."""
    mod = import_module_from_path(path, name)
    ref = build_model(mod, "Model", seed)
    new = build_model(mod, "ModelNew", seed)
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(new(*xs), ref(*xs))
    return mod


def _template_kernel(path: Path) -> str | None:
    """The region problem's default template candidate, or None where no family claims it."""
    from kernelevolve.propose.template import TemplateProposer

    proposer = TemplateProposer("cpu", seed=0)
    plan = proposer.plan(load_problem(path))
    if not plan.regions:
        return None
    return proposer.render(plan, {r.key: r.default() for r in plan.regions}, "default")


def _check(tmp_path: Path, source: str, kernel: str, host: str = "eager") -> tuple[str, list[str]]:
    model_path = tmp_path / "model.py"
    model_path.write_text(source)
    plan = plan_model(model_path, "cpu", tmp_path / "out")
    chosen = []
    for g in plan.groups:
        if kernel == "template":
            text = _template_kernel(g.path)
        else:  # the region's own reference as its kernel
            text = g.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
        if text:
            chosen.append(Chosen(g.name, g.regions, text, f"{kernel} kernel"))
    assert chosen
    text, skipped = compose(source, plan.graph, chosen, "the model with its regions' kernels", plan.dynamic, plan.alt,
                            host)
    out = tmp_path / "best_model.py"
    out.write_text(text)
    ref_mod = import_module_from_path(model_path, "_compose_ref")
    new_mod = import_module_from_path(out, "_compose_new")
    ref = build_model(ref_mod, "Model", 3)
    new = build_model(new_mod, "ModelNew", 3)
    new.load_state_dict(ref.state_dict())
    calls = {"n": 0}
    real = new_mod._kernelevolve_call

    def counted(*a):
        calls["n"] += 1
        return real(*a)

    new_mod._kernelevolve_call = counted
    for seed in (11, 12):
        torch.manual_seed(seed)
        xs = ref_mod.get_inputs()
        with torch.no_grad():
            torch.testing.assert_close(new(*xs), ref(*xs), rtol=1e-4, atol=1e-4)
    instances = sum(len(c.regions) for c in chosen)
    assert calls["n"] == 2 * instances  # every instance ran its region's kernel, on both calls
    return text, skipped


@pytest.mark.parametrize("source", [BLOCKS, BAGS], ids=["blocks", "bags"])
def test_the_model_with_its_regions_own_code_as_kernels_computes_the_model(tmp_path: Path, source: str) -> None:
    _, skipped = _check(tmp_path, source, "reference")
    assert not skipped


def test_template_kernels_run_at_every_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter")
    text, skipped = _check(tmp_path, BLOCKS, "template")
    assert "@triton.jit" in text and not skipped


# two bags of one width: one grouped launch
TWO_BAGS = BAGS.replace('self.bag = nn.EmbeddingBag(rows, dim, mode="sum")',
                        'self.bag = nn.EmbeddingBag(rows, dim, mode="sum")\n'
                        '        self.bag2 = nn.EmbeddingBag(rows + 7, dim, mode="sum")') \
               .replace("pooled = self.bag(ids, offsets)",
                        "pooled = torch.stack([self.bag(ids, offsets), self.bag2(ids, offsets)], 1).sum(1)")


@pytest.mark.parametrize("host", ["eager", "compile"])
def test_grouped_bags_template_kernel_composes_in_either_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              host: str) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter")
    text, skipped = _check(tmp_path, TWO_BAGS, "template", host)
    assert "_layout(srcs, idxs, bnds, S)" in text and not skipped


def test_other_shapes_take_the_models_own_forward(tmp_path: Path) -> None:
    text, _ = _check(tmp_path, BLOCKS, "reference")
    out = tmp_path / "again.py"
    out.write_text(text)
    assert_new_matches_model(out, "_compose_again", 1, torch.randn(5, 32))


def test_the_compile_host_keeps_the_kernels_opaque_and_computes_the_model(tmp_path: Path) -> None:
    """Under torch.compile each instance is a custom op: the kernels run (counted), Inductor compiles the rest."""
    text, skipped = _check(tmp_path, BLOCKS, "reference", host="compile")
    assert "torch.library.Library(" in text and "torch.compile(" in text and not skipped
    # a second load of the file registers ops of its own
    again = import_module_from_path(tmp_path / "best_model.py", "_compose_new_again")
    assert again._KE_TAG != import_module_from_path(tmp_path / "best_model.py", "_compose_new_third")._KE_TAG


@pytest.mark.parametrize("host", ["eager", "compile"])
def test_the_profile_of_a_composition_finds_its_kernels_in_either_host(tmp_path: Path, host: str) -> None:
    """Each problem's kernel time in a composed file: torch.compile drops the profiler's ranges from what it traces,
    so under the compile host the range goes around the region's instance, which runs inside its custom op."""
    from kernelevolve.model.profile import WHOLE, composed_times

    _check(tmp_path, BLOCKS, "reference", host=host)
    plan = plan_model(tmp_path / "model.py", "cpu", tmp_path / "plan")
    region_of = {f"_ke_{r.name}": g.name for g in plan.groups for r in g.regions}
    times = composed_times(tmp_path / "best_model.py", region_of, "cpu", runs=2, warmup=1)
    assert times[WHOLE] > 0
    assert {g.name for g in plan.groups} <= set(times)
    assert all(0 < times[g.name] < times[WHOLE] for g in plan.groups)


def test_an_unknown_host_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="host"):
        compose("", None, [], "", host="jit")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("host", ["eager", "compile"])
def test_template_kernels_compose_on_the_gpu(tmp_path: Path, host: str) -> None:
    """The regions' default template kernels in the model on the GPU, in both hosts: the model's outputs."""
    from kernelevolve.propose.template import TemplateProposer

    model_path = tmp_path / "model.py"
    model_path.write_text(BLOCKS)
    plan = plan_model(model_path, "cuda", tmp_path / "out")
    proposer = TemplateProposer("cuda", seed=0)
    chosen = []
    for g in plan.groups:
        tp = proposer.plan(load_problem(g.path, "cuda"))
        if tp.regions:
            chosen.append(Chosen(g.name, g.regions, proposer.render(tp, {r.key: r.default() for r in tp.regions},
                                                                    "default"), "template kernel"))
    assert chosen
    text, _ = compose(BLOCKS, plan.graph, chosen, "gpu", host=host)
    out = tmp_path / "best_model.py"
    out.write_text(text)
    ref_mod = import_module_from_path(model_path, f"_gpu_ref_{host}")
    new_mod = import_module_from_path(out, f"_gpu_new_{host}")
    ref = build_model(ref_mod, "Model", 3).cuda()
    new = build_model(new_mod, "ModelNew", 3).cuda()
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(11)
    xs = [x.cuda() for x in ref_mod.get_inputs()]
    with torch.no_grad():
        torch.testing.assert_close(new(*xs), ref(*xs), rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(new(*xs), ref(*xs), rtol=2e-3, atol=2e-3)


def test_the_compile_host_runs_the_kernels_on_jagged_inputs_of_any_total(tmp_path: Path) -> None:
    """Bags whose index count differs by draw: where both draws write the same forward and the same outputs, the
    compile host leaves that size free, as the eager host does (a strict guard sent every fresh draw to the model's
    own forward, and the judge rejected the composition as launching none of its kernels)."""
    text, skipped = _check(tmp_path, BAGS, "reference", host="compile")
    assert "torch.library.Library(" in text and not skipped


def test_a_module_no_kernel_replaced_runs_as_the_module_itself(tmp_path: Path) -> None:
    """Only the GEMMs get kernels: each LayerNorm, captured as its primitives, is called as the model's own module
    in the eager host (one op, not eleven), and the model's values come out; under torch.compile it stays as ops."""
    model_path = tmp_path / "model.py"
    model_path.write_text(BLOCKS)
    plan = plan_model(model_path, "cpu", tmp_path / "out")
    gemms = [g for g in plan.groups if g.regions[0].kind == "matmul"]
    assert gemms
    chosen = [Chosen(g.name, g.regions, g.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n", "own")
              for g in gemms]
    text, skipped = compose(BLOCKS, plan.graph, chosen, "the GEMMs' kernels", plan.dynamic, plan.alt)
    assert not skipped
    for i in range(3):
        assert f"self._modules['blocks']._modules['{i}']._modules['norm'](" in text
    assert "aten.rsqrt" not in text[text.rindex("class ModelNew"):]  # the region files above it keep theirs
    out = tmp_path / "best_model.py"
    out.write_text(text)
    for seed in (1, 2):
        assert_new_matches_model(out, f"_compose_modules_{seed}", seed, torch.randn(64, 32))
    compiled, _ = compose(BLOCKS, plan.graph, chosen, "the GEMMs' kernels", plan.dynamic, plan.alt, "compile")
    assert "._modules['norm'](" not in compiled


def test_a_module_call_that_is_not_whole_or_writes_in_place_stays_as_ops(tmp_path: Path) -> None:
    """A module called twice on different values, or one marked in place, keeps the graph's ops."""
    act = "self.norm = nn.LayerNorm(d)\n        self.act = nn.ReLU(inplace=True)"
    source = BLOCKS.replace("self.norm = nn.LayerNorm(d)", act) \
                   .replace("h = torch.relu(self.fc(x))", "h = self.act(self.fc(x)) + self.act(x.clone())")
    model_path = tmp_path / "model.py"
    model_path.write_text(source)
    plan = plan_model(model_path, "cpu", tmp_path / "out")
    from kernelevolve.model.compose import module_calls

    called = {m.spec["module"] for m, _ in module_calls(plan.graph, set())}
    assert not any(p.endswith(".act") for p in called), called
    assert {"blocks.0.norm", "blocks.0.fc"} <= called
    text, _ = compose(source, plan.graph, [], "no kernel", plan.dynamic, plan.alt)
    out = tmp_path / "best_model.py"
    out.write_text(text)
    assert_new_matches_model(out, "_compose_inplace", 0, torch.randn(64, 32))


def test_a_module_that_is_the_whole_graph_is_not_called_as_itself(tmp_path: Path) -> None:
    """A part of a model is written as a file whose Model holds the submodule; by parts, that file's forward becomes
    the submodule's own, so calling the submodule from it would call itself."""
    from kernelevolve.analyze.graph import capture
    from kernelevolve.model.compose import module_calls

    source = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.part = nn.LayerNorm(32)\n\n    def forward(self, x):\n"
              "        return self.part(x){tail}\n\n\ndef get_inputs():\n    return [torch.randn(8, 32)]\n\n\n"
              "def get_init_inputs():\n    return []\n")
    for tail, want in (("", set()), (" * 2", {"part"})):
        path = tmp_path / f"m{len(tail)}.py"
        path.write_text(source.format(tail=tail))
        graph = capture(load_problem(path), origins=True)
        assert {m.spec["module"] for m, _ in module_calls(graph, set())} == want
