"""Export on CUDA: shapes verified and timed on the GPU, the capability recorded, the op dispatched on the device,
and the module compiled by Inductor."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Result, Status
from kernelevolve.export import approve, build_export, check_approval, resolve, verify_shapes
from kernelevolve.problem import load_problem
from kernelevolve.store import Store
from tests.export_cases import KERNEL, PROBLEM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_export_on_cuda(tmp_path):
    path = tmp_path / "relu_scale_add.py"
    path.write_text(PROBLEM)
    problem = load_problem(path, "cuda")
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cuda", f"cuda:{torch.cuda.get_device_name(0)}", {}, {})
    node = store.add_node(run, problem.sha, "x", Candidate(KERNEL.format(problem=PROBLEM), proposer="template",
                                                           meta={"label": "fused"})).id
    store.save_result(node, Result(Status.OK, "verified"))
    approve(store, run, None, "reviewed on the GPU", by="reviewer")
    n = resolve(store, run, None)
    shapes = verify_shapes(problem, n.source, "cuda", tmp_path / "work")
    assert all(s["verdict"] in ("wins", "ties", "loses") for s in shapes), shapes
    assert all(s["speedup"] is not None for s in shapes)
    module_path, _ = build_export(store, run, None, tmp_path / "out" / "relu_cuda.py", shapes,
                                  check_approval(store, n), ("wins", "ties", "loses"))
    spec = importlib.util.spec_from_file_location("relu_cuda_export", module_path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["relu_cuda_export"] = mod
    spec.loader.exec_module(mod)
    assert mod.KERNELEVOLVE_EXPORT["capability"] == list(torch.cuda.get_device_capability(0))
    ref, new = mod.Model(48).cuda(), mod.ModelNew(48).cuda()
    new.load_state_dict(ref.state_dict())
    x, y = torch.randn(64, 48, device="cuda"), torch.randn(64, 48, device="cuda")
    with torch.no_grad():
        assert mod.dispatches([x, y], mod._state(new))
        torch.testing.assert_close(new(x, y), ref(x, y))
        assert not mod.dispatches([x.cpu(), y.cpu()], mod._state(new.cpu()))
        new.cuda()
        compiled = torch.compile(new)
        torch.testing.assert_close(compiled(x, y), ref(x, y))
    store.close()
