"""A GEMM whose rows are reduced in the same kernel, under the interpreter: each reduction kind, each dtype, odd sizes
(1, 17, 1023 in N and K; M past the 1024 rows the family needs), and the regions it must leave to the two kernels."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.templates.matmul import GemmReduceTemplate  # noqa: E402
from kernelevolve.templates.matmul.reduce import MAX_N  # noqa: E402
from kernelevolve.templates.registry import FAMILIES  # noqa: E402
from tests.templates.test_matmul import TOL, capture_problem, check  # noqa: E402

# the product p = x W^T + b (or x @ w), then a reduction of its rows
REDUCTIONS = {
    "softmax": "return torch.softmax(self.fc(args[0]), dim=-1)",
    "log_softmax": "return F.log_softmax(self.fc(args[0]), dim=-1)",
    "logsumexp": "return torch.logsumexp(self.fc(args[0]), dim=-1)",
    "sum_relu": "return torch.relu(args[0] @ self.w).sum(dim=-1)",
    "max_min": "p = self.fc(args[0])\nreturn p.amax(dim=-1, keepdim=True) - p.amin(dim=-1, keepdim=True)",
    "mean_scale": "return (self.fc(args[0]) * 0.5).mean(dim=-1)",
}
SHAPES = [(1025, 1023, 17), (1039, 17, 1), (1024, 1, 1023)]  # (M, K, N)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CASES = [(r, d, SHAPES[i % len(SHAPES)]) for i, (r, d) in enumerate(itertools.product(REDUCTIONS, DTYPES))]


def _graph(tmp_path, forward: str, shape, dtype, rows_3d: bool = False):
    m, k, n = shape
    init = f"self.fc = nn.Linear({k}, {n})" if "self.fc" in forward else \
        f"self.w = nn.Parameter(torch.randn({k}, {n}) / {k ** 0.5})"
    x = f"torch.randn(2, {m // 2}, {k})" if rows_3d else f"torch.randn({m}, {k})"
    return capture_problem(tmp_path, forward, f"[{x}]", init, dtype)


def _only(graph):
    taken, found = set(), []
    for family in FAMILIES:
        for match in family.template().find(graph, taken):
            taken |= set(match.nodes)
            found.append(match)
    return found


@pytest.mark.parametrize("reduction, dtype, shape", CASES,
                         ids=[f"{r}-{str(d)[6:]}-{'x'.join(map(str, s))}" for r, d, s in CASES])
def test_each_reduction_each_dtype_at_odd_sizes(tmp_path, reduction, dtype, shape):
    g = _graph(tmp_path, REDUCTIONS[reduction], shape, dtype)
    (match,) = _only(g)
    assert match.family == "matmul_reduction", [m.family for m in _only(g)]
    # the defaults, and a second configuration: 4 warps with the smallest row block where the row fits them
    narrow = 16 * max(16, 1 << (shape[2] - 1).bit_length()) <= 64 * 32 * 4
    second = {"BLOCK_M": 16, "BLOCK_K": 32, "num_warps": 4} if narrow else {"BLOCK_K": 64, "num_stages": 2}
    configs = [{}, second]
    if dtype == torch.float32:  # and the fp32 operands split once into a TF32 part and the rest
        from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3, SPLIT_TF32X3_FP32SUM

        assert SPLIT_TF32X3 in GemmReduceTemplate().space(match, "cuda")["INPUT_PRECISION"]
        configs.append({"INPUT_PRECISION": SPLIT_TF32X3})
        if reduction == "logsumexp":  # and each K tile's products summed apart, then added in fp32 (past IEEE_LONG)
            configs.append({"INPUT_PRECISION": SPLIT_TF32X3_FP32SUM})
    # half outputs are rounded once from the fp32 product here, where ATen rounds the product first
    check(GemmReduceTemplate(), match, g, configs, tol=TOL.get(dtype, 2e-2))


def test_rows_of_a_3d_input_and_the_default_config(tmp_path):
    g = _graph(tmp_path, REDUCTIONS["logsumexp"], (1040, 24, 70), torch.float32, rows_3d=True)
    (match,) = _only(g)
    assert match.family == "matmul_reduction" and match.outputs[0].meta["val"].shape == (2, 520)
    check(GemmReduceTemplate(), match, g)


@pytest.mark.parametrize("why, forward, shape", [
    ("too wide a row", REDUCTIONS["softmax"], (1024, 16, MAX_N + 1)),
    ("too few rows", REDUCTIONS["softmax"], (1000, 16, 32)),
    ("the product is returned too", "p = self.fc(args[0])\nreturn p, torch.softmax(p, dim=-1)", (1024, 16, 32)),
    ("a reduction over the rows", "return self.fc(args[0]).sum(dim=0)", (1024, 16, 32)),
])
def test_regions_left_to_two_kernels(tmp_path, why, forward, shape):
    families = [m.family for m in _only(_graph(tmp_path, forward, shape, torch.float32))]
    assert "matmul_reduction" not in families and "matmul" in families, (why, families)


def test_a_tile_past_the_register_budget_is_hopeless(tmp_path):
    from kernelevolve.templates.base import HopelessConfig

    g = _graph(tmp_path, REDUCTIONS["softmax"], (1024, 16, 1000), torch.float32)
    (match,) = _only(g)
    assert 128 not in GemmReduceTemplate().space(match, "cuda")["BLOCK_M"]  # 128 x 1024 values: never offered
    with pytest.raises(HopelessConfig):
        GemmReduceTemplate().render(match, {"BLOCK_M": 64, "num_warps": 4}, "k")


def test_a_64_row_tile_for_rows_of_up_to_512_values(tmp_path):
    """64 rows a tile is what Hopper's warpgroup MMA takes (a thinner one falls back to mma.sync): a 512-wide product
    of 16-bit operands gets it on 8 warps, at twice the per-thread budget, first where the rows give every SM a
    program; it is right under the interpreter, and on 4 warps it stays hopeless. fp32 operands keep the plain
    budget (32 rows at 512 wide): their 64-row tiles spilled on the H200."""
    from kernelevolve.templates.base import HopelessConfig
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3

    (big,) = _only(_graph(tmp_path, REDUCTIONS["logsumexp"], (16384, 16, 512), torch.bfloat16))
    space = GemmReduceTemplate().space(big, "cuda")
    assert space["BLOCK_M"][0] == 64 and 128 not in space["BLOCK_M"], space["BLOCK_M"]
    (big32,) = _only(_graph(tmp_path, REDUCTIONS["logsumexp"], (16384, 16, 512), torch.float32))
    space = GemmReduceTemplate().space(big32, "cuda")
    assert space["BLOCK_M"][0] == 32 and 64 not in space["BLOCK_M"], space["BLOCK_M"]
    with pytest.raises(HopelessConfig):
        GemmReduceTemplate().render(big32, {"BLOCK_M": 64, "INPUT_PRECISION": SPLIT_TF32X3}, "k")
    g = _graph(tmp_path, REDUCTIONS["softmax"], (1040, 17, 500), torch.bfloat16)
    (match,) = _only(g)
    assert 64 in GemmReduceTemplate().space(match, "cuda")["BLOCK_M"]
    assert "BLOCK_M=64," in GemmReduceTemplate().render(match, {"BLOCK_M": 64}, "k")
    check(GemmReduceTemplate(), match, g, [{"BLOCK_M": 64}])
    with pytest.raises(HopelessConfig):
        GemmReduceTemplate().render(match, {"BLOCK_M": 64, "num_warps": 4}, "k")
