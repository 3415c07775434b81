"""Approval and export: a standalone, shape-guarded custom-op module that passes its own test, falls back off-guard,
imports without kernelevolve, compiles with torch.compile, and is refused without a valid approval."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.candidate import Candidate  # noqa: E402
from kernelevolve.cli import main  # noqa: E402
from kernelevolve.evaluate.result import Result, Status  # noqa: E402
from kernelevolve.export import ExportError, approve, build_export, check_approval, resolve, shape_cases  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.store import Store  # noqa: E402
from tests.export_cases import KERNEL, PROBLEM  # noqa: E402

pytestmark = pytest.mark.slow

def stored_run(tmp_path, candidate: Candidate):
    """A store holding one finished run of the PROBLEM whose only node is ``candidate``, verified."""
    path = tmp_path / "relu_scale_add.py"
    path.write_text(PROBLEM)
    problem = load_problem(path, "cpu")
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    store.update_run(run, status="finished")
    node = store.add_node(run, problem.sha, "cpu:test", candidate).id
    store.save_result(node, Result(Status.OK, "verified"))
    return store, run, node


@pytest.fixture
def setup(tmp_path):
    store, run, node = stored_run(tmp_path, Candidate(KERNEL.format(problem=PROBLEM), proposer="template",
                                                      meta={"label": "fused"}))
    yield store, run, node, tmp_path
    store.close()


def export(store, run, tmp_path, dispatch=("wins", "ties", "loses", "untimed")):
    from kernelevolve.export import verify_shapes

    node = resolve(store, run, None)
    approval = check_approval(store, node)
    problem = load_problem(tmp_path / "relu_scale_add.py", "cpu")
    shapes = verify_shapes(problem, node.source, "cpu", tmp_path / "work")
    return build_export(store, run, None, tmp_path / "out" / "relu_fast.py", shapes, approval, dispatch)


def load(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_export_is_refused_without_approval_and_a_changed_source_voids_it(setup):
    store, run, node, tmp_path = setup
    with pytest.raises(ExportError, match="not approved"):
        check_approval(store, resolve(store, run, None))
    approve(store, run, None, "looked at the kernel", by="reviewer")
    assert check_approval(store, resolve(store, run, None)).approved_by == "reviewer"
    from kernelevolve.report import report_view
    from kernelevolve.report import render_report

    html = render_report(report_view(store, run))
    assert "Approvals" in html and "looked at the kernel" in html and "reviewer" in html
    store.db.execute("UPDATE candidates SET source = source || '# edited\n'")  # the source changes after approval
    store.db.commit()
    with pytest.raises(ExportError, match="void"):
        check_approval(store, resolve(store, run, None))
    assert main(["export", "latest", "--db", str(store.path), "--out", str(tmp_path / "x.py")]) == 2


def test_shapes_declared_and_derived(setup):
    store, run, node, tmp_path = setup
    cases = shape_cases(load_problem(tmp_path / "relu_scale_add.py", "cpu"), tmp_path / "shapes")
    assert [c.label for c in cases] == ["declared", "half batch (32)", "double batch (128)", "odd batch (63)"]


def test_exported_module_end_to_end(setup):
    store, run, node, tmp_path = setup
    approve(store, run, None, "reviewed", by="reviewer")
    module_path, test_path = export(store, run, tmp_path)
    text = module_path.read_text()
    assert "Approved by reviewer" in text and "torch.library.custom_op" in text and "odd batch (63)" in text

    # its own generated test passes
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", str(test_path), "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    mod = load(module_path, "relu_fast_export")
    assert all(s["verdict"] == "untimed" for s in mod.KERNELEVOLVE_EXPORT["shapes"])
    ref, new = mod.Model(48), mod.ModelNew(48)
    new.load_state_dict(ref.state_dict())
    assert list(new.state_dict()) == list(ref.state_dict())
    x, y = torch.randn(64, 48), torch.randn(64, 48)
    with torch.no_grad():
        assert mod.dispatches([x, y], mod._state(new))
        torch.testing.assert_close(new(x, y), ref(x, y))
        # off the guard: another dtype, another shape; the reference runs and the result is right
        for a, b in ((x.double(), y.double()), (torch.randn(7, 48), torch.randn(7, 48))):
            ref_d = mod.Model(48).to(a.dtype)
            new_d = mod.ModelNew(48).to(a.dtype)
            new_d.load_state_dict(ref_d.state_dict())
            assert not mod.dispatches([a, b], mod._state(new_d))
            torch.testing.assert_close(new_d(a, b), ref_d(a, b))
    # training falls back: the kernel has no backward
    assert not mod.dispatches([x.requires_grad_(), y], mod._state(new))

    # torch.compile traces through the op (its fake implementation gives the output's shape)
    compiled = torch.compile(new, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.detach(), y), ref(x.detach(), y))


def test_exported_module_needs_no_kernelevolve_and_an_edited_kernel_is_never_run(setup):
    store, run, node, tmp_path = setup
    approve(store, run, None, "reviewed", by="reviewer")
    module_path, _ = export(store, run, tmp_path)
    script = (
        "import sys, warnings, importlib.util, torch\n"
        "sys.modules['kernelevolve'] = None  # any import of it fails\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(module_path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "ref, new = m.Model(48), m.ModelNew(48); new.load_state_dict(ref.state_dict())\n"
        "x, y = torch.randn(64, 48), torch.randn(64, 48)\n"
        "with torch.no_grad():\n"
        "    assert m.dispatches([x, y], m._state(new)) == m.APPROVED\n"
        "    torch.testing.assert_close(new(x, y), ref(x, y))\n"
        "print('approved' if m.APPROVED else 'void')\n")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "approved", proc.stdout + proc.stderr
    module_path.write_text(module_path.read_text().replace("tl.maximum(x * s, 0.0) + y", "x * s + y"))
    proc = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "void", proc.stdout + proc.stderr
    assert "not the approved one" in proc.stderr


def test_optimize_approve_export_register_patch(setup, monkeypatch):
    """The path the README shows, from a stored run to a patched user model (the kernel body under another name)."""
    store, run, node, tmp_path = setup
    registry = tmp_path / "registry"
    db, out = str(store.path), str(tmp_path / "kernels" / "relu_fast.py")
    assert main(["approve", str(run), "--note", "reviewed", "--by", "reviewer", "--db", db]) == 0
    assert main(["export", str(run), "--db", db, "--out", out, "--dispatch", "verified", "--register",
                 str(registry)]) == 0

    import kernelevolve

    user_code = tmp_path / "user_layers.py"  # the user's own class name, in a real file (its source is read)
    user_code.write_text(PROBLEM.replace("class Model(", "class ScaleReluAdd("))
    namespace = vars(load(user_code, "user_layers"))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(48, 48)
            self.block = namespace["ScaleReluAdd"](48)

        def forward(self, x):
            h = self.proj(x)
            return self.block(h, x)

    net = Net()
    x = torch.randn(64, 48)
    with torch.no_grad():
        want = net(x)
    keys = list(net.state_dict())
    replaced = kernelevolve.patch(net, registry=registry, device="cpu")
    assert replaced == ["block"]  # the Linear has no kernel, only the matching block is swapped
    assert list(net.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(net(x), want)  # first call: checked against the original
        torch.testing.assert_close(net(x), want)  # then the kernel alone
    assert kernelevolve.load(namespace["ScaleReluAdd"], device="cpu", registry=registry) is not None


def test_inductor_candidate_exports_an_aotinductor_package(tmp_path):
    """--aoti: the package beside the module runs the reference's computation with the caller's weights."""
    from kernelevolve.propose.inductor import render

    store, run, _ = stored_run(tmp_path, Candidate(render(PROBLEM, {}, "default"), proposer="inductor",
                                                   meta={"label": "default", "options": {}}))
    out = tmp_path / "out" / "relu_aoti.py"
    assert main(["export", str(run), "--db", str(store.path), "--out", str(out), "--auto-approve", "--aoti"]) == 0
    assert out.with_suffix(".pt2").is_file()
    mod = load(out, "relu_aoti_export")
    assert mod.KERNELEVOLVE_EXPORT["aoti_package"] == "relu_aoti.pt2"
    assert mod.KERNELEVOLVE_EXPORT["approved"]["note"] == "exported with --auto-approve"
    model = mod.Model(48)
    with torch.no_grad():
        model.scale.mul_(-1.0)  # weights other than those it was compiled with
        compiled = mod.load_aoti(model)
        x, y = torch.randn(64, 48), torch.randn(64, 48)
        torch.testing.assert_close(compiled(x, y), model(x, y))
    store.close()


def test_a_run_that_answered_with_a_baseline_exports_its_winner_only_when_named(setup):
    from kernelevolve.evaluate.headtohead import CANDIDATE, decide

    store, run, node, _ = setup
    store.update_run(run, head_to_head=decide({CANDIDATE: [1.0] * 10, "eager": [1.0] * 10}))
    with pytest.raises(ExportError, match="answered with a baseline's kernel"):
        resolve(store, run, None)
    assert resolve(store, run, node).id == node
    store.update_run(run, head_to_head=decide({CANDIDATE: [0.5] * 10, "eager": [1.0] * 10}))
    assert resolve(store, run, None).id == node
