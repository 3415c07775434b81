"""The stream-K GEMM (``SCHEDULE="streamk"``): the K iterations of all tiles cut into equal runs, one per program,
each tile's pieces added in order by the fixup kernel with the epilogue. Right at odd sizes, with runs that cross
tile boundaries, for each dtype and epilogue, two weights, a batch, and the FMA dot's run cap."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernelevolve.templates.base import HopelessConfig  # noqa: E402
from kernelevolve.templates.matmul import DualGemmTemplate, MatmulTemplate  # noqa: E402
from kernelevolve.templates.matmul.launch import IEEE_RUN, SMS, gemm_space  # noqa: E402
from tests.templates.test_matmul import DTYPES, capture_problem, find_all, render_checked  # noqa: E402

SK = {"SCHEDULE": "streamk", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}


def run(template, match, graph, config, tag: str = "s0") -> tuple[list, list]:
    """Render with ``config``, check every output against ATen's; the grids of the stream-K and fixup launches."""
    sk, fix = render_checked(template, match, graph, config, "mm_sk", [f"mm_sk_{tag}_sk", f"mm_sk_{tag}_fix"])
    return sk, fix


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 17, 70])
def test_linear_gelu_in_runs_across_tiles(tmp_path, dtype, m):
    """K = 150 (5 K tiles of 32, the last short), N = 20: 1-3 row tiles shared by the 4 programs of a CPU device, so
    runs start and end inside tiles and a tile's sum comes from two or three programs' pieces."""
    g = capture_problem(tmp_path, "return F.gelu(self.fc(args[0]))", f"[torch.randn({m}, 150)]",
                        "self.fc = nn.Linear(150, 20)", dtype)
    (match,) = find_all(g)
    sk, fix = run(MatmulTemplate(), match, g, SK)
    tiles = -(-m // 32)
    assert fix == [(tiles,)] and len(sk) == 1 and sk[0][0] <= 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_bias_and_residual_epilogue_after_the_pieces(tmp_path, dtype):
    g = capture_problem(tmp_path, "return torch.relu(args[0] @ args[1] + args[2]) + args[3]",
                        "[torch.randn(40, 72), torch.randn(72, 24), torch.randn(24), torch.randn(40, 24)]",
                        dtype=dtype)
    (match,) = find_all(g)
    run(MatmulTemplate(), match, g, {**SK, "BLOCK_K": 16})


def test_two_weights_share_the_runs(tmp_path):
    init = """
        self.w1 = nn.Linear(70, 24, bias=False)
        self.w3 = nn.Linear(70, 24, bias=False)
    """
    g = capture_problem(tmp_path, "x = args[0]\nreturn F.silu(self.w1(x)) * self.w3(x)", "[torch.randn(33, 70)]",
                        init)
    (dual,) = find_all(g)
    assert dual.family == "dual_gemm"
    run(DualGemmTemplate(), dual, g, {**SK, "BLOCK_K": 16})


def test_a_batch_of_products(tmp_path):
    g = capture_problem(tmp_path, "return torch.tanh(torch.bmm(args[0], args[1]))",
                        "[torch.randn(3, 17, 90), torch.randn(3, 90, 33)]")
    (match,) = find_all(g)
    sk, fix = run(match.template if hasattr(match, "template") else MatmulTemplate(), match, g, SK)
    assert fix == [(3 * 1 * 2,)]


def test_the_fma_dot_keeps_each_run_within_ieee_run_products(tmp_path):
    """fp32 without TF32, one tile and K = 16384 in K tiles of 16: the 4 programs of a CPU device would each sum 4096
    products in one running sum; the cap of IEEE_RUN products per run gives each at most IEEE_RUN / 16 K tiles, so
    16384 / IEEE_RUN programs run instead. tf32x3 sums on tensor cores and is not capped."""
    g = capture_problem(tmp_path, "return args[0] @ args[1]", "[torch.randn(5, 16384), torch.randn(16384, 6)]")
    (match,) = find_all(g)
    sk, _ = run(MatmulTemplate(), match, g, {**SK, "BLOCK_K": 16})
    assert sk == [(16384 // IEEE_RUN,)]
    sk, _ = run(MatmulTemplate(), match, g, {**SK, "BLOCK_K": 16, "INPUT_PRECISION": "tf32x3"})
    assert sk == [(4,)]


def test_stream_k_is_offered_where_the_tiles_are_few():
    few = gemm_space({"Bt": 1, "M": 256, "N": 256, "K": 65536}, "tl.bfloat16", 1)
    assert "streamk" in few["SCHEDULE"] and few["SCHEDULE"][0] == "tiles"
    many = gemm_space({"Bt": 1, "M": 8192, "N": 8192, "K": 1024}, "tl.bfloat16", 1)
    assert "streamk" not in many.get("SCHEDULE", [])
    long_fp32 = gemm_space({"Bt": 1, "M": 256, "N": 256, "K": 65536}, "tl.float32", 1)
    assert long_fp32["SCHEDULE"] == ["tiles", "streamk"]
    assert SMS > 0


def test_a_stream_k_workspace_past_the_limit_is_hopeless(tmp_path):
    g = capture_problem(tmp_path, "return args[0] @ args[1]", "[torch.randn(8192, 8), torch.randn(8, 8192)]")
    (match,) = find_all(g)
    with pytest.raises(HopelessConfig):
        MatmulTemplate().render(match, {**SK, "BLOCK_M": 16, "BLOCK_N": 16}, "mm_sk")


@pytest.mark.parametrize("dtype", DTYPES)
def test_odd_sizes_1023(tmp_path, dtype):
    """K = 1023 (the last K tile one short), N = 1023 (the last column tile one short), 17 rows."""
    g = capture_problem(tmp_path, "return torch.sigmoid(args[0] @ args[1]) * 2.0",
                        "[torch.randn(17, 1023), torch.randn(1023, 1023) / 32]", dtype=dtype)
    (match,) = find_all(g)
    sk, fix = run(MatmulTemplate(), match, g, {**SK, "BLOCK_N": 128, "BLOCK_K": 64})
    assert fix == [(8,)]
