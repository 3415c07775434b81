"""The module mode: a problem is captured, judged and exported in the mode its constructor leaves the Model (training,
as KernelBench's harness runs it). A batch norm in training mode normalizes by the batch's statistics and updates its
running ones; the kernel does the same, and the exported module runs the reference in the other mode."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.analyze.graph import capture  # noqa: E402
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig  # noqa: E402
from kernelevolve.evaluate.result import Result, Status  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.template import TemplateProposer  # noqa: E402

BN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.gemm = nn.Linear(32, 48)
        self.bn = nn.{norm}(features)

    def forward(self, x):
        y = self.gemm(x.flatten(1)).view({view})
        return torch.relu(self.bn(y) * 2.0)


def get_inputs():
    return [torch.randn(24, 32)]


def get_init_inputs():
    return [{features}]
'''
CASES = {"bn1d": dict(norm="BatchNorm1d", view="24, 48", features=48),
         "bn2d": dict(norm="BatchNorm2d", view="24, 4, 3, 4", features=4)}
CONFIG = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3))


def _problem(tmp_path: Path, case: str):
    path = tmp_path / f"gemm_{case}.py"
    path.write_text(BN.format(**CASES[case]))
    return load_problem(path, "cpu")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_batch_norm_in_training_mode_gets_a_verified_template_kernel(case, tmp_path):
    problem = _problem(tmp_path, case)
    graph = capture(problem)
    assert set(graph.mutated_state()) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    (cand,) = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 1)
    result = Evaluator(problem, CONFIG, tmp_path / "work").evaluate(cand)
    assert result.ok, f"{result.status.value}: {result.reason}\n{result.error[-1500:]}"

    # the kernel keeps the module's semantics: the running statistics move as the reference's do
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"cand_{case}", tmp_path / "cand.py")
    (tmp_path / "cand.py").write_text(cand.source)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    ref = mod.Model(CASES[case]["features"])
    new = mod.ModelNew(CASES[case]["features"])
    new.load_state_dict(ref.state_dict())
    x = torch.randn(24, 32)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(new.state_dict()[name], want, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_the_exported_module_dispatches_only_in_the_verified_mode(tmp_path):
    from kernelevolve.candidate import Candidate
    from kernelevolve.export import approve, build_export, check_approval, resolve, verify_shapes
    from kernelevolve.store import Store
    from tests.test_export import load

    problem = _problem(tmp_path, "bn1d")
    (cand,) = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 1)
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    store.update_run(run, status="finished")
    store.save_result(store.add_node(run, problem.sha, "cpu:test", Candidate(cand.source, proposer="template")).id,
                      Result(Status.OK, "verified"))
    approve(store, run, None, "reviewed", by="reviewer")
    node = resolve(store, run, None)
    shapes = verify_shapes(problem, node.source, "cpu", tmp_path / "verify")
    path, _ = build_export(store, run, None, tmp_path / "out" / "bn_fast.py", shapes, check_approval(store, node),
                           ("wins", "ties", "loses", "untimed"))
    store.close()
    mod = load(path, "bn_fast_export")
    assert mod.KERNELEVOLVE_EXPORT["training"] is True
    assert "bn.running_mean" in mod.KERNELEVOLVE_EXPORT["mutated_state"]
    torch.manual_seed(0)
    ref, new = mod.Model(48), mod.ModelNew(48)
    new.load_state_dict(ref.state_dict())
    x = torch.randn(24, 32)
    with torch.no_grad():
        assert mod.dispatches([x], mod._state(new), new.training)
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean, atol=1e-5, rtol=1e-5)
        assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 1
        # torch.compile traces through the op, and the running statistics still move as the reference's
        compiled = torch.compile(new, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), ref(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new.bn.running_var, ref.bn.running_var, atol=1e-5, rtol=1e-5)
        assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 2
        ref.eval()
        new.eval()  # the running statistics now: not what the kernel computes, so the reference runs
        assert not mod.dispatches([x], mod._state(new), new.training)
        torch.testing.assert_close(new(x), ref(x))
