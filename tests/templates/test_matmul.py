"""Matmul families: each pattern is found on the captured graph and its rendered kernel reproduces the ATen values."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap
import warnings

import pytest
import torch

from kernelevolve.analyze.graph import capture, node_values, op_name
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS
from kernelevolve.problem import load_problem
from kernelevolve.templates.base import FILE_HEADER, load_source
from kernelevolve.templates.matmul import (KNOBS, BatchedSmallTemplate, CrossTemplate, DualGemmTemplate, MatmulTemplate,
                                           fit, gemm_space)
from kernelevolve.templates.registry import FAMILIES

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def capture_problem(tmp_path, forward: str, inputs: str, init: str = "pass", dtype=torch.float32):
    name = str(dtype).split(".")[-1]
    body = lambda text: textwrap.indent(textwrap.dedent(text).strip(), " " * 8)  # noqa: E731
    source = "\n".join([
        "import torch", "import torch.nn as nn", "import torch.nn.functional as F", "",
        "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
        "        torch.manual_seed(0)", body(init), f"        self.to(torch.{name})", "",
        "    def forward(self, *args):", body(forward), "",
        "def get_inputs():", f"    return [t.to(torch.{name}) for t in {inputs}]", "",
        "def get_init_inputs():", "    return []", ""])
    path = tmp_path / f"problem_{name}.py"
    path.write_text(source)
    return capture(load_problem(path))


MATMUL = {BatchedSmallTemplate, CrossTemplate, DualGemmTemplate, MatmulTemplate}


def find_all(graph) -> list:
    """Every matmul family in the registry's order, each seeing what the earlier ones claimed."""
    taken, found = set(), []
    for family in [f.template for f in FAMILIES if f.template in MATMUL]:
        for match in family().find(graph, taken):
            taken |= set(match.nodes)
            found.append(match)
    return found


_counter = iter(range(10**6))


def check(template, match, graph, configs=({},), tol: float | None = None) -> None:
    values = node_values(graph)
    for config in configs:
        source = template.render(match, dict(config), "mm_test")
        module = load_source("\n".join([FILE_HEADER, PRELUDE_IMPORTS, PRELUDE, source]), f"mm_case_{next(_counter)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's exp overflows to inf, as the GPU's
            outs = module.mm_test(*[values[n] for n in match.inputs])
        assert len(outs) == len(match.outputs)
        for out, node in zip(outs, match.outputs):
            ref = values[node]
            assert out.shape == ref.shape and out.dtype == ref.dtype, config
            t = TOL.get(ref.dtype, 2e-2) if tol is None else tol
            torch.testing.assert_close(out, ref, atol=t, rtol=t, msg=lambda m: f"{config}: {m}")


class Launches:
    """Stands in for a kernel of a rendered module and records the grid of each launch."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def render_checked(template, match, graph, config: dict, name: str, kernels: list[str]) -> list[list]:
    """Render ``match`` with ``config`` as ``name``, check every output against ATen's, and return the grids each of
    ``kernels`` (names in the rendered module) was launched with."""
    source = template.render(match, dict(config), name)
    module = load_source("\n".join([FILE_HEADER, PRELUDE_IMPORTS, PRELUDE, source]), f"{name}_{next(_counter)}")
    stand_ins = [Launches(getattr(module, k)) for k in kernels]
    for k, stand_in in zip(kernels, stand_ins):
        setattr(module, k, stand_in)
    values = node_values(graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = getattr(module, name)(*[values[n] for n in match.inputs])
    for out, node in zip(outs, match.outputs):
        ref = values[node]
        assert out.shape == ref.shape and out.dtype == ref.dtype
        tol = TOL.get(ref.dtype, 2e-2)
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol, msg=lambda m: f"{config}: {m}")
    return [s.grids for s in stand_ins]


def some_configs(template, match) -> list[dict]:
    space = template.space(match, "cuda")
    return [{}] + [{key: values[1]} for key, values in space.items() if len(values) > 1][:3]


def ops(match) -> set[str]:
    return {op_name(n) for n in match.nodes}


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_3d_input(tmp_path, dtype):
    g = capture_problem(tmp_path, "return F.gelu(self.fc(args[0]))", "[torch.randn(3, 11, 70)]",
                        "self.fc = nn.Linear(70, 20)", dtype)
    (match,) = find_all(g)
    assert match.family == "matmul" and {"addmm", "gelu", "permute", "view"} <= ops(match)
    assert len(match.inputs) == 3 and op_name(match.outputs[0]) == "gelu"
    check(MatmulTemplate(), match, g, some_configs(MatmulTemplate(), match))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bias_relu_residual(tmp_path, dtype):
    g = capture_problem(tmp_path, "return torch.relu(self.fc(args[0])) * 0.5 + args[1]",
                        "[torch.randn(33, 70), torch.randn(33, 20)]", "self.fc = nn.Linear(70, 20)", dtype)
    (match,) = find_all(g)
    assert {"addmm", "relu", "mul", "add"} <= ops(match)
    check(MatmulTemplate(), match, g, some_configs(MatmulTemplate(), match))


@pytest.mark.parametrize("forward", [
    "return torch.tanh(F.linear(args[0], self.w, self.b))",
    "return torch.tanh(args[0] @ self.w.t() + self.b)",
    "return torch.tanh(torch.addmm(self.b, args[0], self.w.T))",
    "return torch.tanh(torch.mm(args[0], self.w.transpose(0, 1)).add(self.b))",
])
def test_bias_spellings_are_one_pattern(tmp_path, forward):
    init = "self.w = nn.Parameter(torch.randn(20, 70) / 8)\nself.b = nn.Parameter(torch.randn(20))"
    g = capture_problem(tmp_path, forward, "[torch.randn(33, 70)]", init)
    (match,) = find_all(g)
    assert match.family == "matmul" and op_name(match.outputs[0]) == "tanh"
    assert ops(match) & {"mm", "addmm"} and ops(match) & {"permute", "t", "transpose"}
    check(MatmulTemplate(), match, g)


def test_addmm_alpha_beta_and_cast(tmp_path):
    init = "self.w = nn.Parameter(torch.randn(70, 20))\nself.b = nn.Parameter(torch.randn(33, 1))"
    g = capture_problem(tmp_path, "return torch.addmm(self.b, args[0], self.w, beta=0.5, alpha=2.0).half()",
                        "[torch.randn(33, 70)]", init)
    (match,) = find_all(g)
    assert match.outputs[0].meta["val"].dtype == torch.float16
    check(MatmulTemplate(), match, g)


def test_split_k(tmp_path):
    g = capture_problem(tmp_path, "return F.silu(self.fc(args[0]))", "[torch.randn(7, 130)]",
                        "self.fc = nn.Linear(130, 20)")
    (match,) = find_all(g)
    space = MatmulTemplate().space(match, "cuda")
    assert space["SPLIT_K"] == [1, 2, 4, 8]
    configs = [{"SPLIT_K": 4, "BLOCK_K": 32}, {"SPLIT_K": 2, "BLOCK_K": 64, "INPUT_PRECISION": "tf32x3"}]
    check(MatmulTemplate(), match, g, configs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_two_weights(tmp_path, dtype):
    init = """
        self.w1 = nn.Linear(70, 24, bias=False)
        self.w3 = nn.Linear(70, 24, bias=False)
        self.w2 = nn.Linear(24, 70, bias=False)
    """
    g = capture_problem(tmp_path, "x = args[0]\nreturn self.w2(F.silu(self.w1(x)) * self.w3(x))",
                        "[torch.randn(33, 70)]", init, dtype)
    dual, down = find_all(g)
    assert dual.family == "dual_gemm" and sum(op_name(n) == "mm" for n in dual.nodes) == 2
    assert down.family == "matmul" and dual.outputs[0] in down.inputs
    check(DualGemmTemplate(), dual, g, [{}, {"SPLIT_K": 2, "BLOCK_K": 32}])
    check(MatmulTemplate(), down, g)


def test_swiglu_one_weight_chunked(tmp_path):
    g = capture_problem(tmp_path, "a, b = self.w13(args[0]).chunk(2, dim=-1)\nreturn F.silu(a) * b",
                        "[torch.randn(3, 11, 70)]", "self.w13 = nn.Linear(70, 48)")
    (match,) = find_all(g)
    assert match.family == "dual_gemm" and "split_with_sizes" in ops(match)
    check(DualGemmTemplate(), match, g, some_configs(DualGemmTemplate(), match))


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_layer_towers(tmp_path, dtype):
    init = """
        self.w1 = nn.Parameter(torch.randn(3, 70, 20) / 8)
        self.b1 = nn.Parameter(torch.randn(3, 1, 20))
        self.w2 = nn.Parameter(torch.randn(3, 20, 9) / 4)
        self.b2 = nn.Parameter(torch.randn(3, 1, 9))
    """
    forward = """
        h = torch.relu(torch.baddbmm(self.b1, args[0].expand(3, -1, -1), self.w1))
        return torch.sigmoid(torch.bmm(h, self.w2) + self.b2)
    """
    g = capture_problem(tmp_path, forward, "[torch.randn(33, 70)]", init, dtype)
    (match,) = find_all(g)
    assert match.family == "batched_matmul" and sum(op_name(n) == "bmm" for n in match.nodes) == 2
    template = BatchedSmallTemplate()
    assert sorted(template.space(match, "cuda")["FUSE"]) == [False, True]
    check(template, match, g, [{"FUSE": True}, {"FUSE": False}, {"FUSE": True, "BLOCK_N": 32, "BLOCK_M": 32}])
    if dtype == torch.float32:  # operands split in memory for the two unfused stages; fused, the kernel's tf32x3
        from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3

        assert template.space(match, "cuda")["INPUT_PRECISION"] == ["ieee", "tf32x3", SPLIT_TF32X3]
        assert "_split(" in template.render(match, {"FUSE": False, "INPUT_PRECISION": SPLIT_TF32X3}, "t")
        fused = template.render(match, {"FUSE": True, "INPUT_PRECISION": SPLIT_TF32X3}, "t")
        assert "_split(" not in fused and 'input_precision="tf32x3"' in fused
        check(template, match, g, [{"FUSE": False, "INPUT_PRECISION": SPLIT_TF32X3},
                                   {"FUSE": True, "INPUT_PRECISION": SPLIT_TF32X3}])


@pytest.mark.parametrize("dtype", DTYPES)
def test_task_towers_written_with_matmul_are_claimed_as_towers(tmp_path, dtype):
    """torch.matmul of a shared input with per-task weights traces to bmm on expands; the second layer's expand of
    the first layer's output changes nothing. Both layers are one towers region (not attention), down to one logit
    per task."""
    init = """
        self.w1 = nn.Parameter(torch.randn(3, 40, 24) / 6)
        self.b1 = nn.Parameter(torch.randn(3, 1, 24) * 0.1)
        self.w2 = nn.Parameter(torch.randn(3, 24, 1) / 5)
        self.b2 = nn.Parameter(torch.randn(3, 1, 1) * 0.1)
    """
    forward = """
        h = torch.relu(torch.matmul(args[0].unsqueeze(0), self.w1) + self.b1)
        return torch.sigmoid(torch.matmul(h, self.w2) + self.b2).squeeze(-1).transpose(0, 1)
    """
    g = capture_problem(tmp_path, forward, "[torch.randn(33, 40)]", init, dtype)
    (match,) = find_all(g)
    assert match.family == "batched_matmul" and sum(op_name(n) == "bmm" for n in match.nodes) == 2
    check(BatchedSmallTemplate(), match, g, [{"FUSE": True}, {"FUSE": False}])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_towers_claimed_whole(tmp_path, dtype):
    """Half baddbmm layers trace as up-casts, fp32 bmm, bias add and a down-cast: one match holds them all (the bias
    casts too), and its dots run on the half tiles."""
    init = """
        self.w1 = nn.Parameter(torch.randn(3, 20, 20) / 4)
        self.b1 = nn.Parameter(torch.randn(3, 1, 20) * 0.1)
        self.w2 = nn.Parameter(torch.randn(3, 20, 20) / 4)
        self.b2 = nn.Parameter(torch.randn(3, 1, 20) * 0.1)
    """
    forward = """
        h = torch.relu(torch.baddbmm(self.b1, args[0], self.w1))
        return torch.relu(torch.baddbmm(self.b2, h, self.w2))
    """
    g = capture_problem(tmp_path, forward, "[torch.randn(3, 33, 20)]", init, dtype)
    (match,) = find_all(g)
    assert match.family == "batched_matmul" and set(match.nodes) == set(g.calls())
    assert all(st.dot != "tl.float32" for st in match.spec["stages"])
    template = BatchedSmallTemplate()
    check(template, match, g, [{"FUSE": True}, {"FUSE": False}, {"FUSE": False, "BLOCK_M": 32, "BLOCK_K": 32}])


def test_bias_cast_read_in_kernel(tmp_path):
    init = "self.w = nn.Parameter(torch.randn(20, 70) / 8)\nself.b = nn.Parameter(torch.randn(20))"
    g = capture_problem(tmp_path, "return torch.relu(args[0] @ self.w.t() + self.b.half().float())",
                        "[torch.randn(33, 70)]", init)
    (match,) = find_all(g)
    assert set(match.nodes) == set(g.calls()) and "_to_copy" in ops(match)
    check(MatmulTemplate(), match, g)


def test_dcn_cross_layer(tmp_path):
    forward = "x0 = args[0]\nx1 = x0 * self.c0(x0) + x0\nreturn x0 * self.c1(x1) + x1"
    g = capture_problem(tmp_path, forward, "[torch.randn(33, 20)]",
                        "self.c0 = nn.Linear(20, 20)\nself.c1 = nn.Linear(20, 20)")
    found = find_all(g)
    assert [(m.family, m.kind) for m in found] == [("cross", "dcn_cross")] * 2
    for match in found:
        assert {"addmm", "mul", "add"} <= ops(match)
        check(CrossTemplate(), match, g, [{}, {"SCHEDULE": "streamk", "BLOCK_M": 16, "BLOCK_K": 16}])


def test_no_matmul(tmp_path):
    g = capture_problem(tmp_path, "return torch.relu(args[0]).sum(-1)", "[torch.randn(7, 20)]")
    assert find_all(g) == []


def test_taken_nodes_are_left_alone(tmp_path):
    g = capture_problem(tmp_path, "return torch.relu(self.fc(args[0]))", "[torch.randn(7, 20)]",
                        "self.fc = nn.Linear(20, 9)")
    gemm = next(n for n in g.calls() if op_name(n) == "addmm")
    assert MatmulTemplate().find(g, {gemm}) == []
    relu = next(n for n in g.calls() if op_name(n) == "relu")
    (match,) = MatmulTemplate().find(g, {relu})
    assert relu not in match.nodes and match.outputs[0] is gemm


def test_space_defaults_and_clamping():
    space = gemm_space({"Bt": 1, "M": 4096, "N": 4096, "K": 4096}, "tl.bfloat16", 1)
    assert set(space) - {"SCHEDULE"} == set(KNOBS) and all(sorted(space[k]) == sorted(KNOBS[k]) for k in KNOBS)
    assert space["SPLIT_K"][0] == 1 and space["BLOCK_M"][0] == 128
    assert gemm_space({"Bt": 1, "M": 16, "N": 64, "K": 65536}, "tl.bfloat16", 1)["SPLIT_K"][0] > 1
    fp32 = gemm_space({"Bt": 1, "M": 33, "N": 20, "K": 70}, "tl.float32", 1)
    assert fp32["INPUT_PRECISION"] == ["ieee", "tf32x3"]
    assert gemm_space({"Bt": 1, "M": 33, "N": 20, "K": 70}, "tl.float32", 1, True)["INPUT_PRECISION"][0] == "tf32"
    big = fit({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 4, "num_stages": 5, "SPLIT_K": 8},
              {"M": 4096, "N": 4096, "K": 4096}, 4, 2)
    assert 2 * big["BLOCK_M"] * big["BLOCK_N"] <= 128 * 32 * big["num_warps"]
    assert big["num_stages"] * (big["BLOCK_M"] + 2 * big["BLOCK_N"]) * big["BLOCK_K"] * 4 <= 200 * 1024
    small = fit({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "SPLIT_K": 8},
                {"M": 5, "N": 9, "K": 40}, 2, 1)
    assert (small["BLOCK_M"], small["BLOCK_N"], small["BLOCK_K"], small["SPLIT_K"]) == (16, 16, 64, 1)


def test_a_long_fp32_reduction_under_the_fma_dot_is_split():
    """K = 65536 in fp32 without TF32 (bench/problems/gemm/matmul_long_k_fp32.py): every configuration whose FMA
    running sums are longer than 8192 failed the judge on the H200, so none is offered, the default keeps each run
    within 2048 products, and the persistent schedule (which takes K whole) is left out; stream-K (runs capped at
    IEEE_RUN products) stays. TF32 allowed, or bf16, or a short K: the usual space."""
    from kernelevolve.templates.matmul.launch import IEEE_LONG, IEEE_RUN

    sizes = {"Bt": 1, "M": 256, "N": 256, "K": 65536}
    space = gemm_space(sizes, "tl.float32", 1)
    assert 65536 // space["SPLIT_K"][0] <= IEEE_RUN
    assert all(65536 // s <= IEEE_LONG for s in space["SPLIT_K"]) and space["SCHEDULE"] == ["tiles", "streamk"]
    assert space["INPUT_PRECISION"][0] == "ieee"
    # where the partials' room runs out (M = N = 8192: 256 MB per split), still no run past IEEE_LONG
    for big in ({**sizes, "M": 8192, "N": 8192}, {**sizes, "M": 4096, "N": 4096}, {**sizes, "Bt": 8, "M": 1024,
                                                                                    "N": 1024}, {**sizes, "K": 12000}):
        splits = gemm_space(big, "tl.float32", 1)["SPLIT_K"]
        assert all(-(-big["K"] // s) <= IEEE_LONG for s in splits), (big, splits)
    for other in (gemm_space(sizes, "tl.float32", 1, True), gemm_space(sizes, "tl.bfloat16", 1),
                  gemm_space({**sizes, "K": 4096}, "tl.float32", 1)):
        assert 1 in other["SPLIT_K"] and other["SPLIT_K"][0] <= 8


def _split_module():
    from kernelevolve.templates.matmul.kernels import split_text

    return load_source("\n".join([FILE_HEADER, PRELUDE_IMPORTS, PRELUDE, split_text("sp")]), f"sp_{next(_counter)}")


LAYOUTS = ["contiguous", "transposed", "chunk", "column_slice_transposed", "permuted_3d_slice", "expanded",
           "expanded_transposed", "offset"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_operands_are_a_tf32_part_and_an_exact_rest(layout):
    """SPLIT_TF32X3's operands: hi has TF32's 10 mantissa bits (the low 13 are zero), hi + lo is x exactly, |lo| is
    at most half of hi's last bit; both keep x's layout where x is dense (no copy of a transposed weight) and its
    broadcast dims (no copy per batch of a shared operand), whatever order x's dims are in."""
    torch.manual_seed(0)
    base = torch.randn(37, 1023) * torch.logspace(-3, 3, 1023)
    cube = torch.randn(6, 8, 10)
    x = {"contiguous": base, "transposed": base.t(), "chunk": base.chunk(3, -1)[1],
         "column_slice_transposed": base[:, :5].t(), "permuted_3d_slice": cube[:, :, 2:7].permute(2, 0, 1),
         "expanded": base[:1].expand(5, -1), "expanded_transposed": cube[:1].expand(3, -1, -1).transpose(1, 2),
         "offset": base[3:20]}[layout]
    hi, lo = _split_module().sp_split(x)
    assert hi.shape == x.shape and hi.stride() == lo.stride()
    if layout in ("contiguous", "transposed", "offset"):
        assert hi.stride() == x.stride()
    if layout.startswith("expanded"):
        assert hi.stride(0) == 0 and hi.untyped_storage().nbytes() == x[0].numel() * 4
    assert (hi.contiguous().view(torch.int32) & 0x1FFF).eq(0).all()
    assert torch.equal(hi + lo, x)  # the rest is exact: hi and x share an exponent, or hi is a power of two
    assert (lo.abs() <= hi.abs() * 2.0 ** -11).all()


def test_split_of_values_at_the_ends_of_the_float_range():
    """Infinities stay infinite with no rest (a NaN rest would turn an inf product into NaN); the largest finite
    floats truncate instead of rounding up to inf; NaN stays NaN; zeros and denormals split exactly."""
    big = torch.finfo(torch.float32).max
    x = torch.tensor([float("inf"), -float("inf"), big, -big, float("nan"), -0.0, 0.0, 1e-40, 3.0e38])
    hi, lo = _split_module().sp_split(x)
    assert torch.equal(hi[:2], x[:2]) and torch.equal(lo[:2], torch.zeros(2))
    assert torch.isfinite(hi[2:4]).all() and torch.equal(hi[2:4] + lo[2:4], x[2:4])
    assert hi[4].isnan() and torch.equal(hi[5:] + lo[5:], x[5:])


def test_split_tf32x3_is_offered_for_fp32_operands_and_verified_on_odd_shapes(tmp_path):
    """The mode is in the space only for fp32 operands without a cast and TF32 not allowed; rendered, it matches ATen
    for M = 1, 17 and 1023 rows, with split-K, and as the two-weight (SwiGLU) stage."""
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3

    for rows in (1, 17, 1023):
        g = capture_problem(tmp_path, "return F.gelu(self.fc(args[0])) + args[0][:, :20]",
                            f"[torch.randn({rows}, 70)]", "self.fc = nn.Linear(70, 20)")
        (match,) = find_all(g)
        space = MatmulTemplate().space(match, "cuda")
        assert space["INPUT_PRECISION"] == ["ieee", "tf32x3", SPLIT_TF32X3]
        configs = [{"INPUT_PRECISION": SPLIT_TF32X3}]
        if rows == 17:
            configs += [{"INPUT_PRECISION": SPLIT_TF32X3, "SPLIT_K": 2, "BLOCK_K": 32}]
        check(MatmulTemplate(), match, g, configs)
    g = capture_problem(tmp_path, "return F.silu(args[0] @ self.w1) * (args[0] @ self.w2)", "[torch.randn(17, 33)]",
                        "self.w1 = nn.Parameter(torch.randn(33, 24))\nself.w2 = nn.Parameter(torch.randn(33, 24))")
    (match,) = find_all(g)
    check(DualGemmTemplate(), match, g, [{"INPUT_PRECISION": SPLIT_TF32X3}])
    # bf16 operands: no fp32 modes at all; TF32 allowed: plain TF32 is faster, no split
    assert "INPUT_PRECISION" not in gemm_space({"Bt": 1, "M": 33, "N": 20, "K": 70}, "tl.bfloat16", 1,
                                               split_operands=True)
    assert SPLIT_TF32X3 not in gemm_space({"Bt": 1, "M": 33, "N": 20, "K": 70}, "tl.float32", 1, True, True)[
        "INPUT_PRECISION"]


def test_a_long_reduction_sums_each_k_tile_of_split_products_in_fp32(tmp_path):
    """Past IEEE_LONG SPLIT_TF32X3_FP32SUM is on offer too (the tensor cores' own sums drift over K = 65536): its
    K loop sums a tile's three products from zero and adds that sum to the accumulator (a dot started
    from zero and added would fold back into one dot), it holds that sum beside the accumulators in the register
    budget, and it matches ATen on odd shapes with split-K, in the persistent kernel and as the two-weight stage."""
    from kernelevolve.templates.matmul import has_tma
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3, SPLIT_TF32X3_FP32SUM, _split_dots

    long = gemm_space({"Bt": 1, "M": 256, "N": 256, "K": 65536}, "tl.float32", 1, split_operands=True)
    assert long["INPUT_PRECISION"] == ["ieee", "tf32x3", SPLIT_TF32X3, SPLIT_TF32X3_FP32SUM]
    short = gemm_space({"Bt": 1, "M": 256, "N": 256, "K": 8192}, "tl.float32", 1, split_operands=True)
    assert short["INPUT_PRECISION"] == ["ieee", "tf32x3", SPLIT_TF32X3]
    lines = _split_dots(["acc0", "acc1"], SPLIT_TF32X3_FP32SUM)
    assert lines[0] == 'part = tl.dot(a_lo, b0, input_precision="tf32")' and lines[3] == "acc0 += part"
    assert lines[4] == 'part = tl.dot(a_lo, b1, input_precision="tf32")' and lines[7] == "acc1 += part"
    assert all(", part, " in x for x in lines[1:3] + lines[5:7])
    wide = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3, "SPLIT_K": 1}
    sizes = {"M": 4096, "N": 4096, "K": 65536}
    plain, summed = fit(wide, sizes, 8, 1), fit(wide, sizes, 8, 1, 1)
    assert (plain["BLOCK_N"], summed["BLOCK_N"]) == (256, 128)
    assert 2 * summed["BLOCK_M"] * summed["BLOCK_N"] <= 128 * 32 * summed["num_warps"]
    for rows in (1, 17, 1023):
        g = capture_problem(tmp_path, "return torch.sigmoid(self.fc(args[0])) * 2 + args[0][:, :20]",
                            f"[torch.randn({rows}, 70)]", "self.fc = nn.Linear(70, 20)")
        (match,) = find_all(g)
        configs = [{"INPUT_PRECISION": SPLIT_TF32X3_FP32SUM}]
        if rows == 17:
            configs += [{"INPUT_PRECISION": SPLIT_TF32X3_FP32SUM, "SPLIT_K": 2, "BLOCK_K": 32}]
        source = MatmulTemplate().render(match, configs[0], "mm_fs")
        assert "_split(" in source and "+= part" in source
        check(MatmulTemplate(), match, g, configs)
    g = capture_problem(tmp_path, "return F.silu(args[0] @ self.w1) * (args[0] @ self.w2)", "[torch.randn(17, 33)]",
                        "self.w1 = nn.Parameter(torch.randn(33, 24))\nself.w2 = nn.Parameter(torch.randn(33, 24))")
    (match,) = find_all(g)
    assert "+= part" not in DualGemmTemplate().render(match, {"INPUT_PRECISION": SPLIT_TF32X3}, "d")
    check(DualGemmTemplate(), match, g, [{"INPUT_PRECISION": SPLIT_TF32X3_FP32SUM}])
    if has_tma():
        g = capture_problem(tmp_path, "return self.fc(args[0])", "[torch.randn(40, 64)]",
                            "self.fc = nn.Linear(64, 48)")
        (match,) = find_all(g)
        tma = {"INPUT_PRECISION": SPLIT_TF32X3_FP32SUM, "SCHEDULE": "tma", "BLOCK_M": 32, "BLOCK_N": 32,
               "BLOCK_K": 32}
        launches = render_checked(MatmulTemplate(), match, g, tma, "mm_fst", ["mm_fst_s0_tma", "mm_fst_s0_kernel"])
        assert [len(x) for x in launches] == [1, 0]
        assert "+= part" in MatmulTemplate().render(match, tma, "mm_fst")


def test_split_tf32x3_schedules_and_twice_the_shared_memory(tmp_path):
    """Asked for with stream-K (a mutation may combine them), the split mode renders the tile kernel and keeps the
    configuration's split-K; with the persistent schedule it reads both parts through tensor descriptors (K = 64
    keeps the operands aligned for TMA). Each pipeline stage holds both parts of each operand tile, so the fitted
    stages and BLOCK_K stay within the shared memory at 8 bytes a value."""
    import re

    from kernelevolve.templates.matmul import has_tma
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3
    from kernelevolve.templates.matmul.launch import SMEM_BYTES

    g = capture_problem(tmp_path, "return self.fc(args[0])", "[torch.randn(40, 64)]", "self.fc = nn.Linear(64, 48)")
    (match,) = find_all(g)
    for schedule in ("streamk", "tiles"):
        source = MatmulTemplate().render(match, {"INPUT_PRECISION": SPLIT_TF32X3, "SCHEDULE": schedule,
                                                 "SPLIT_K": 2, "BLOCK_K": 16}, "mm_test")
        assert "_sk[" not in source and "SPLIT_K=2" in source, schedule
    check(MatmulTemplate(), match, g, [{"INPUT_PRECISION": SPLIT_TF32X3, "SCHEDULE": "streamk"}])
    if has_tma():
        tma = {"INPUT_PRECISION": SPLIT_TF32X3, "SCHEDULE": "tma", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}
        launches = render_checked(MatmulTemplate(), match, g, tma, "mm_st", ["mm_st_s0_tma", "mm_st_s0_kernel"])
        assert [len(x) for x in launches] == [1, 0]
        assert "a_lo_desc.load" in MatmulTemplate().render(match, tma, "mm_st")
        # a weight in [K, N] order, read as it lies (not transposed in registers)
        g2 = capture_problem(tmp_path, "return torch.relu(args[0] @ self.w)", "[torch.randn(40, 64)]",
                             "self.w = nn.Parameter(torch.randn(64, 48))")
        (m2,) = find_all(g2)
        launches = render_checked(MatmulTemplate(), m2, g2, tma, "mm_s2", ["mm_s2_s0_tma", "mm_s2_s0_kernel"])
        assert [len(x) for x in launches] == [1, 0]
    sizes = {"Bt": 1, "M": 4096, "N": 4096, "K": 4096}
    match.spec["stages"][0].sizes = sizes  # the same stage at a size where shared memory binds
    source = MatmulTemplate().render(match, {"INPUT_PRECISION": SPLIT_TF32X3, "BLOCK_M": 128, "BLOCK_N": 256,
                                             "BLOCK_K": 128, "num_stages": 5, "num_warps": 8}, "mm_test")
    got = {k: int(v) for k, v in re.findall(r"\b(BLOCK_M|BLOCK_N|BLOCK_K|num_stages)=(\d+)", source)}
    assert got["num_stages"] * (got["BLOCK_M"] + got["BLOCK_N"]) * got["BLOCK_K"] * 8 <= SMEM_BYTES, got


def test_split_tf32x3_falls_back_to_tf32x3_where_an_operand_is_cast(tmp_path):
    """A configuration carried over (experience) onto a stage whose operand the kernel casts renders tf32x3, never
    plain TF32, and no split."""
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3
    from kernelevolve.templates.matmul.launch import splittable

    g = capture_problem(tmp_path, "return self.fc(args[0].float())", "[torch.randn(17, 40)]",
                        "self.fc = nn.Linear(40, 24)")
    g2 = capture_problem(tmp_path, "return self.fc(args[0].half().float())", "[torch.randn(17, 40)]",
                         "self.fc = nn.Linear(40, 24)")
    assert [splittable(find_all(graph)[0].spec["stages"][0]) for graph in (g, g2)] == [True, False]
    for graph in (g, g2):
        (match,) = find_all(graph)
        st = match.spec["stages"][0]
        source = MatmulTemplate().render(match, {"INPUT_PRECISION": SPLIT_TF32X3}, "mm_test")
        if splittable(st):
            assert "_split(" in source
        else:  # the cast operand: tf32x3 in registers, and no plain TF32 product anywhere
            assert "_split(" not in source and 'input_precision="tf32x3"' in source
            assert 'input_precision="tf32")' not in source
        check(MatmulTemplate(), match, graph, [{"INPUT_PRECISION": SPLIT_TF32X3}])
