"""Capture writes the same values in the normal form the templates read: a reduction over a permuted tensor reduces the
tensor itself, a product with ones is a sum, a reduction over dims apart is one reduction per run of adjacent dims.
Each rewrite must give the model's own values."""
from __future__ import annotations

import pytest
import torch

from kernelevolve.analyze.graph import _merged, _trace, _drop_dead, op_name


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


X3 = torch.randn(3, 5, 7)
CASES = {
    "einsum_column": (lambda x: torch.einsum("ij->j", x), [torch.randn(6, 9)], {"permute"}),
    "transpose_sum_keepdim": (lambda x: x.t().sum(1, keepdim=True), [torch.randn(6, 9)], {"permute"}),
    "permute3_amax": (lambda x: x.permute(2, 0, 1).amax(0), [X3], {"permute"}),
    "permute3_sum_keepdim": (lambda x: x.permute(0, 2, 1).sum(2, keepdim=True), [X3], {"permute"}),
    "matmul_ones_right": (lambda x: x @ torch.ones(9, 4), [torch.randn(6, 9)], {"mm"}),
    "matmul_ones_left": (lambda x: torch.ones(2, 6) @ x, [torch.randn(6, 9)], {"mm"}),
    "mv_ones": (lambda x: torch.mv(x, torch.ones(9)), [torch.randn(6, 9)], {"mv", "mm"}),
    "reordering_permute_kept": (lambda x: x.permute(2, 1, 0).sum(1), [X3], set()),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["fake", "real"])
def test_rewrites_keep_the_values(case, mode):
    fn, inputs, gone = CASES[case]
    model = Fn(fn)
    gm, _ = _trace(model, inputs, mode)
    _drop_dead(gm)
    ops = {op_name(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert not ops & gone, (case, ops)
    torch.testing.assert_close(gm([], *inputs), fn(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [[0, 2, 3], [0, 2], [1, 3], [0, 1, 3], [0, 3]])
@pytest.mark.parametrize("keepdim", [True, False])
def test_reductions_over_dims_apart(dims, keepdim):
    x = torch.randn(3, 4, 5, 6)
    for op in (torch.sum, torch.amax, torch.amin):
        got, want = _merged(op)(x, dims, keepdim), op(x, dims, keepdim)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)



GROUP_NORM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.n = nn.GroupNorm(4, 12, affine={affine}).to(torch.{dtype})
        if {affine}:  # weights away from their defaults, so that the affine shows in the values
            with torch.no_grad():
                self.n.weight.normal_()
                self.n.bias.normal_()

    def forward(self, x):
        return torch.tanh(self.n(torch.relu(x)))


def get_inputs():
    return [torch.randn{shape}.to(torch.{dtype})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("shape", [(2, 12, 5, 7), (3, 12, 2, 3, 4), (5, 12)])
@pytest.mark.parametrize("affine, dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")])
def test_group_norm_over_spatial_dims_is_one_statistics_region_and_one_affine(shape, affine, dtype, tmp_path):
    """The statistics over [N, G, C/G * HW] are one row reduction; the affine (a per-channel scale and shift of the
    input) and the ops after it are one pointwise region: every op but the views is claimed, in the model's values."""
    from kernelevolve.analyze.graph import capture, node_values
    from kernelevolve.problem import build_model, import_module_from_path, load_problem, make_inputs
    from kernelevolve.propose.template import claim_regions

    path = tmp_path / "group_norm.py"
    path.write_text(GROUP_NORM.format(affine=affine, dtype=dtype, shape=shape))
    problem = load_problem(path)
    graph = capture(problem)
    module = import_module_from_path(path, "_group_norm_values")
    expected = build_model(module, "Model", 0)(*make_inputs(module, 1))
    out = node_values(graph)[graph.outputs()[0]]
    torch.testing.assert_close(out.float(), expected.float(), **({"atol": 2e-2, "rtol": 2e-2}
                                                                 if dtype == "bfloat16" else {}))
    plan = claim_regions(graph, problem, "cuda")
    claimed = {n for r in plan.regions for n in r.match.nodes}
    left = {op_name(n) for n in graph.calls() if n not in claimed}
    assert left <= {"view", "_unsafe_view", "reshape", "unsqueeze", "expand", "as_strided", "_to_copy"}, left
    if len(shape) > 2:  # the statistics in one region, the affine beside tanh in another
        kinds = [r.match.kind for r in plan.regions if "sum" in {op_name(n) for n in r.match.nodes}]
        assert kinds == ["row_reduction"]
        assert any({"tanh", "mul", "add"} <= {op_name(n) for n in r.match.nodes} for r in plan.regions)


def _twice(x):
    return torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def _two_pools(x, i):
    a = torch.zeros(4, 3).index_add_(0, i, x)  # two equal factories, each written in place: not one tensor
    b = torch.zeros(4, 3).index_add_(0, i, x * 2)
    return a, b, x[i] + 1, x[i] * 2  # a gather read twice stays two gathers (each region may own one)


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_value_computed_twice_is_computed_once(mode):
    x = torch.randn(5, 7)
    gm, _ = _trace(Fn(_twice), [x], mode)
    _drop_dead(gm)
    counts = [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert counts.count("exp") == 1 and counts.count("amax") == 1 and counts.count("sub") == 1, counts
    torch.testing.assert_close(gm([], x), _twice(x))


def test_written_tensors_and_gathers_are_not_merged():
    x, i = torch.randn(6, 3), torch.tensor([0, 1, 1, 3, 2, 0])
    gm, _ = _trace(Fn(_two_pools), [x, i], "real")
    _drop_dead(gm)
    counts = [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert counts.count("full") + counts.count("zeros") == 2 and counts.count("index") == 2, counts
    for got, want in zip(gm([], x, i), _two_pools(x, i)):
        torch.testing.assert_close(got, want)


def _identities(a, b, c):
    return torch.addcmul(a, b, c) + 0, (a * 1) / 1 - 0


def test_multiplying_by_one_and_adding_zero_are_dropped():
    a, b, c = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    gm, _ = _trace(Fn(_identities), [a, b, c], "real")
    _drop_dead(gm)
    ops = [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count("mul") == 1 and ops.count("add") == 1 and "div" not in ops and "sub" not in ops, ops
    for got, want in zip(gm([], a, b, c), _identities(a, b, c)):
        torch.testing.assert_close(got, want)


def _read_around_a_write(x):
    y = x.exp()
    x.add_(1)
    return y + x.exp()  # the second exp reads the written x: not the first one's value


def test_a_value_read_before_and_after_an_in_place_write_is_not_merged():
    x = torch.randn(3, 4)
    gm, _ = _trace(Fn(_read_around_a_write), [x.clone()], "real")
    _drop_dead(gm)
    out = gm([], x.clone())
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, _read_around_a_write(x.clone()))


def _relu_in_place(x):
    h = x * 2.0
    before = h.sum()  # reads h before the write
    h.relu_()
    h.add_(1.0).mul_(3.0)
    return h + before, h


def _writes_that_stay(x):
    x.relu_()  # an input: the caller sees the write
    h = x * 2.0
    v = h.view(-1)
    h.sigmoid_()  # through the view too
    return v + 1.0


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_in_place_ops_on_values_the_forward_made_become_out_of_place(mode):
    x = torch.randn(4, 5)
    gm, _ = _trace(Fn(_relu_in_place), [x.clone()], mode)
    _drop_dead(gm)
    ops = [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert not [o for o in ops if o.endswith("_")], ops
    for got, want in zip(gm([], x.clone()), _relu_in_place(x.clone())):
        torch.testing.assert_close(got, want)


def test_writes_to_inputs_and_through_views_stay_in_place():
    x = torch.randn(4, 5)
    gm, _ = _trace(Fn(_writes_that_stay), [x.clone()], "real")
    _drop_dead(gm)
    ops = [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert "relu_" in ops and "sigmoid_" in ops, ops
    a, b = x.clone(), x.clone()
    got = gm([], a)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, _writes_that_stay(b))
    torch.testing.assert_close(a, b)  # the input written as the model writes it
