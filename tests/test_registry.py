"""Registry and runtime: class signatures, add/best/remove, load() and patch() with its first-call check."""
import importlib.util
import json
import warnings

import pytest
import torch
import torch.nn as nn

from kernelevolve.registry import Registry, RegistryError, class_signature, load_export, problem_signature
from kernelevolve.runtime import Check, PatchedModule, PatchWarning, load, patch

HEADER = "import torch\nimport torch.nn as nn\n\n"
MODEL_SRC = '''
class Model(nn.Module):
    def __init__(self, hidden: int):
        super(Model, self).__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * torch.nn.functional.gelu(self.fc(x))
'''
PROBLEM_SRC = HEADER + MODEL_SRC + '''

def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
'''
# the same computation by other ops: addmm and the erf form of GELU
RIGHT = '''
class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.addmm(self.fc.bias, x.reshape(-1, x.shape[-1]), self.fc.weight.t()).reshape(x.shape)
        return torch.addcmul(x, self.scale, 0.5 * h * (1 + torch.erf(h * 0.7071067811865476)))
'''
WRONG = RIGHT.replace("torch.erf(h * 0.7071067811865476)", "torch.tanh(h)")
RAISES = RIGHT.replace("self.calls += 1", "raise RuntimeError('kernel launch failed')")
SIG = problem_signature(PROBLEM_SRC)


class GeluMLP(torch.nn.Module):
    """A user's copy of the problem's Model, under another name."""

    def __init__(self, hidden: int):
        super(GeluMLP, self).__init__()
        self.fc = nn.Linear(hidden, hidden)  # the same layer
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a comment the signature ignores
        return x + self.scale * torch.nn.functional.gelu(
            self.fc(x))


class Other(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([GeluMLP(16), Other(16)])
        self.head = GeluMLP(8)
        self.proj = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(self.proj(x))


def write_export(folder, body=RIGHT, sha="a", device="cpu", capability=None, speedup=1.5, approved=True,
                 test=False):
    meta = {"name": "gelu_mlp", "problem_sha": "0" * 64, "problem_name": "gelu_mlp", "signature": SIG,
            "device": device, "device_name": "test device", "capability": capability, "candidate_sha": sha * 64,
            "approved": {"by": "tester", "at": "2025-01-01", "note": ""} if approved else None,
            "init_inputs": [16], "shapes": [{"inputs": [[[4, 16], "float32"]], "verdict": "wins", "speedup": speedup}],
            "speedup": speedup, "versions": {"torch": torch.__version__}, "created": "2025-01-01"}
    if not approved:
        del meta["approved"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gelu_{sha}.py"
    path.write_text(HEADER + f"KERNELEVOLVE_EXPORT = {meta!r}\n" + MODEL_SRC + body)
    if test:
        (folder / f"test_gelu_{sha}.py").write_text(f"PATH = 'gelu_{sha}.py'\n")
    return path


@pytest.fixture
def reg(tmp_path):
    return Registry(tmp_path / "registry")


@pytest.fixture
def x():
    return torch.randn(4, 16)


def test_signature_ignores_name_docstrings_comments_and_layout(tmp_path):
    assert class_signature(GeluMLP) == SIG
    assert class_signature(Other) != SIG
    assert problem_signature(PROBLEM_SRC.replace("torch.full", "torch.ones").replace(", 0.5)", ")")) != SIG
    assert class_signature(load_export(write_export(tmp_path)).Model) == SIG


def test_signature_of_a_class_whose_module_is_not_in_sys_modules(tmp_path):
    path = tmp_path / "loose.py"
    path.write_text(PROBLEM_SRC)
    spec = importlib.util.spec_from_file_location("loose_problem_not_registered", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not entered in sys.modules, so inspect.getsource(Model) fails
    assert class_signature(module.Model) == SIG


def test_signature_errors():
    with pytest.raises(RegistryError, match="no source"):
        class_signature(type("Dynamic", (nn.Module,), {}))
    with pytest.raises(RegistryError, match="no class Model"):
        problem_signature(HEADER + "x = 1\n")
    with pytest.raises(RegistryError, match="does not parse"):
        problem_signature("class Model(:\n")


def test_load_export_checks_the_contract(tmp_path):
    path = tmp_path / "half.py"
    path.write_text(HEADER + MODEL_SRC)
    with pytest.raises(RegistryError, match="KERNELEVOLVE_EXPORT"):
        load_export(path)
    path.write_text("raise ImportError('no triton')\n")
    with pytest.raises(RegistryError, match="import failed"):
        load_export(path)
    a, b = load_export(write_export(tmp_path)), load_export(write_export(tmp_path))
    assert a.__name__ != b.__name__ and a.KERNELEVOLVE_EXPORT["speedup"] == 1.5


def test_add_lays_out_files_and_index(reg, tmp_path):
    dest = reg.add(write_export(tmp_path / "out", sha="a", test=True))
    assert dest == reg.root / SIG[:16] / "cpu-any" / f"{'a' * 12}.py"
    assert (dest.parent / f"test_{'a' * 12}.py").read_text() == f"PATH = '{'a' * 12}.py'\n"
    gpu = reg.add(write_export(tmp_path / "out", sha="c", device="cuda", capability=[9, 0]))
    assert gpu.parent.name == "cuda-9.0"
    index = json.loads((reg.root / "index.json").read_text())
    assert [e["candidate_sha"][0] for e in index] == ["a", "c"]
    assert {"path", "signature", "problem_name", "device", "device_name", "capability", "speedup", "candidate_sha",
            "approved", "created"} <= set(index[0])
    assert index[0]["path"] == f"{SIG[:16]}/cpu-any/{'a' * 12}.py" and index[1]["capability"] == [9, 0]
    reg.add(write_export(tmp_path / "out", sha="a", speedup=2.0))  # the same candidate again: updated, not doubled
    assert sorted(e["speedup"] for e in reg.entries(SIG)) == [1.5, 2.0]
    assert reg.entries("f" * 64) == [] and all(e["path"].startswith(str(reg.root)) for e in reg.entries())


def test_add_imports_an_export_whose_metadata_is_not_a_literal(reg, tmp_path):
    path = write_export(tmp_path)
    source = path.read_text()
    start = source.index("KERNELEVOLVE_EXPORT = ") + len("KERNELEVOLVE_EXPORT = ")
    end = source.index("\n", start)
    path.write_text(source[:start] + f"dict(**{source[start:end]})" + source[end:])
    assert reg.add(path).is_file() and reg.best(SIG, "cpu")["speedup"] == 1.5


def test_add_refuses_unapproved(reg, tmp_path):
    with pytest.raises(RegistryError, match="not approved"):
        reg.add(write_export(tmp_path, approved=False))
    assert reg.entries() == []


def test_best_filters_by_device_and_capability(reg, tmp_path, monkeypatch):
    for sha, device, cap, speedup in [("a", "cpu", None, 1.5), ("b", "cpu", None, 3.0), ("e", "cpu", None, None),
                                      ("c", "cuda", [9, 0], 5.0), ("d", "cuda", [8, 0], 6.0)]:
        reg.add(write_export(tmp_path, sha=sha, device=device, capability=cap, speedup=speedup))
    assert reg.best(SIG, "cpu")["candidate_sha"][0] == "b"
    assert [e["candidate_sha"][0] for e in reg.usable(SIG, "cpu")] == ["b", "a", "e"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert reg.best(SIG, "cuda")["candidate_sha"][0] == "c"
    assert reg.best(SIG, torch.device("cuda", 0))["candidate_sha"][0] == "c"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert reg.best(SIG, "cuda") is None
    assert reg.best("f" * 64, "cpu") is None


def test_remove(reg, tmp_path):
    a = reg.add(write_export(tmp_path, sha="a", test=True))
    reg.add(write_export(tmp_path, sha="b"))
    assert reg.remove("aaaa") == 1 and reg.remove("aaaa") == 0
    assert not a.exists() and not a.with_name(f"test_{a.name}").exists()
    assert [e["candidate_sha"][0] for e in reg.entries()] == ["b"]
    with pytest.raises(RegistryError):
        reg.remove("")


def test_default_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELEVOLVE_REGISTRY", str(tmp_path / "env"))
    assert Registry().root == tmp_path / "env"


def test_load_by_class_path_and_source(reg, tmp_path, x):
    assert load(GeluMLP, device="cpu", registry=reg) is None  # empty registry
    reg.add(write_export(tmp_path, sha="a"))
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM_SRC)
    for key in (GeluMLP, problem, str(problem), PROBLEM_SRC):
        cls = load(key, device="cpu", registry=reg)
        assert cls is not None and cls.__name__ == "ModelNew"
    ref = GeluMLP(16)
    new = cls(16)
    new.load_state_dict(ref.state_dict())
    torch.testing.assert_close(new(x), ref(x), rtol=1e-4, atol=1e-5)
    assert load(Other, device="cpu", registry=reg) is None
    with pytest.raises(RegistryError):
        load(str(tmp_path / "missing.py"), registry=reg)


def test_load_falls_back_to_the_next_entry_when_one_is_broken(reg, tmp_path):
    reg.add(write_export(tmp_path, sha="a", speedup=1.2))
    broken = reg.add(write_export(tmp_path, sha="b", speedup=9.0))
    broken.write_text("raise RuntimeError('corrupted')\n")
    assert load(GeluMLP, device="cpu", registry=reg).__module__.startswith("_ke_export_")
    reg.remove("a")
    assert load(GeluMLP, device="cpu", registry=reg) is None


def test_patch_replaces_only_matching_submodules(reg, tmp_path, x):
    reg.add(write_export(tmp_path))
    model = Net()
    keys, want = list(model.state_dict()), model(x)
    with pytest.warns(PatchWarning, match="head .*in_features=8"):  # verified for hidden=16 only
        assert patch(model, registry=reg) == ["blocks.0"]
    assert isinstance(model.blocks[0], PatchedModule) and isinstance(model.head, GeluMLP)
    assert isinstance(model.blocks[1], Other)
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), want)
    wrapper = model.blocks[0]
    assert wrapper.guard.check is Check.PASSED and wrapper.new.calls == 1
    originals = []
    wrapper.original.register_forward_hook(lambda *a: originals.append(1))
    torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-5)
    assert wrapper.new.calls == 2 and originals == []  # after a good first call only the kernel runs
    assert wrapper.fc is wrapper.original.fc and list(model.state_dict()) == keys
    with pytest.warns(PatchWarning, match="head"):
        assert patch(model, registry=reg) == []  # already patched: nothing is wrapped twice


def test_patch_without_verify_installs_the_kernel_itself(reg, tmp_path, x):
    reg.add(write_export(tmp_path))
    model = nn.Sequential(GeluMLP(16), Other(16))
    model[0].fc.weight.requires_grad_(False)
    keys, want = list(model.state_dict()), model(x)
    assert patch(model, registry=reg, verify=False) == ["0"]
    assert type(model[0]).__name__ == "ModelNew" and list(model.state_dict()) == keys
    assert not model[0].fc.weight.requires_grad and model[0].scale.requires_grad
    torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-5)


def test_patched_state_dict_round_trips(reg, tmp_path, x):
    reg.add(write_export(tmp_path))
    model = nn.Sequential(GeluMLP(16), Other(16))
    patch(model, registry=reg)
    fresh = nn.Sequential(GeluMLP(16), Other(16))
    model.load_state_dict(fresh.state_dict())  # strict: an unpatched checkpoint loads into a patched model
    torch.testing.assert_close(model(x), fresh(x))
    torch.testing.assert_close(model(x), fresh(x), rtol=1e-4, atol=1e-5)  # the kernel sees the loaded weights
    other = nn.Sequential(GeluMLP(16), Other(16))
    other.load_state_dict(model.state_dict())  # and a patched model's checkpoint into an unpatched one
    torch.testing.assert_close(other(x), fresh(x))


def test_patch_shares_one_replacement_for_a_shared_module(reg, tmp_path, x):
    reg.add(write_export(tmp_path))
    block = GeluMLP(16)
    model = nn.Sequential(block, Other(16), block)
    want = model(x)
    assert patch(model, registry=reg) == ["0", "2"]
    assert model[0] is model[2]
    torch.testing.assert_close(model(x), want)


def test_patch_root_in_place(reg, tmp_path, x):
    reg.add(write_export(tmp_path))
    model = GeluMLP(16).double()
    keys, want = list(model.state_dict()), model(x.double())
    assert patch(model, registry=reg) == [""]
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x.double()), want)
    torch.testing.assert_close(model(x.double()), want)
    assert model._kernelevolve_kernel.calls == 2 and model._kernelevolve_kernel.fc.weight.dtype == torch.float64
    assert patch(model, registry=reg) == []
    model.load_state_dict(GeluMLP(16).double().state_dict())


@pytest.mark.parametrize("body, why", [(WRONG, "disagrees"), (RAISES, "raised RuntimeError")])
def test_verify_falls_back_to_the_original(reg, tmp_path, x, body, why):
    reg.add(write_export(tmp_path, body=body))
    model = nn.Sequential(GeluMLP(16), Other(16))
    want = model(x)
    assert patch(model, registry=reg) == ["0"]
    with pytest.warns(PatchWarning, match=why):
        out = model(x)
    torch.testing.assert_close(out, want)
    assert model[0].guard.check is Check.FAILED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(model(x), want)
    assert list(model.state_dict()) == list(nn.Sequential(GeluMLP(16), Other(16)).state_dict())


def test_patch_never_raises_on_a_broken_registry(reg, tmp_path, x):
    stored = reg.add(write_export(tmp_path))
    stored.write_text("def broken(:\n")
    model = nn.Sequential(GeluMLP(16), Other(16))
    want = model(x)
    with pytest.warns(PatchWarning, match="left unchanged"):
        assert patch(model, registry=reg) == []
    assert isinstance(model[0], GeluMLP)
    reg.index_path.write_text("{not json")
    with pytest.warns(PatchWarning, match="registry unusable"):
        assert patch(model, registry=reg) == []
    torch.testing.assert_close(model(x), want)
    assert patch(model, registry=tmp_path / "nothing-here") == []


def test_patch_and_best_on_an_unusable_device(reg, tmp_path, monkeypatch):
    reg.add(write_export(tmp_path))

    def no_cuda(device=None):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda)
    assert reg.best(SIG, "cuda") is None and load(GeluMLP, device="cuda", registry=reg) is None
    model = nn.Sequential(GeluMLP(16))
    assert patch(model, registry=reg, device="cuda") == [] and patch(model, registry=reg, device="nonsense") == []


def test_add_trusts_the_declared_signature_of_an_export_it_cannot_import(reg, tmp_path):
    path = write_export(tmp_path)
    source = path.read_text().replace(MODEL_SRC, "\nfrom a_missing_package import Model\n")
    path.write_text(source)
    assert reg.add(path).is_file() and reg.entries()[0]["signature"] == SIG
    path.write_text(source.replace(f"'signature': '{SIG}'", "'signature': ''"))
    with pytest.raises(RegistryError, match="import failed"):
        reg.add(path)
