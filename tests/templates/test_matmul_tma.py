"""The persistent TMA GEMM (``SCHEDULE="tma"``): right at odd sizes, each dtype and epilogue, and the tile kernel where
an operand's layout is one TMA cannot describe."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.templates.matmul import DualGemmTemplate, MatmulTemplate, has_tma  # noqa: E402
from tests.templates.test_matmul import DTYPES, capture_problem, find_all, render_checked  # noqa: E402

pytestmark = pytest.mark.skipif(not has_tma(), reason="this Triton has no tensor descriptors")
TMA = {"SCHEDULE": "tma", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}


def run(template, match, graph, config) -> tuple[int, int]:
    """Render with ``config``, check every output against ATen's, and count (TMA, tile) kernel launches."""
    tma, tiles = render_checked(template, match, graph, config, "mm_tma", ["mm_tma_s0_tma", "mm_tma_s0_kernel"])
    return len(tma), len(tiles)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 17, 70])
def test_linear_gelu_through_tma(tmp_path, dtype, m):
    """A transposed weight (nn.Linear) is described as [N, K] and transposed in registers; the tiles past M and N
    are zero-padded by the descriptors and never stored."""
    g = capture_problem(tmp_path, "return F.gelu(self.fc(args[0]))", f"[torch.randn({m}, 64)]",
                        "self.fc = nn.Linear(64, 48)", dtype)
    (match,) = find_all(g)
    assert run(MatmulTemplate(), match, g, TMA) == (1, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_k_tail_is_zero_padded(tmp_path, dtype):
    """K = 72 is not a multiple of BLOCK_K: the last K tile reads zeros past the edge of both operands."""
    g = capture_problem(tmp_path, "return torch.relu(args[0] @ args[1]) + args[2]",
                        "[torch.randn(40, 72), torch.randn(72, 24), torch.randn(40, 24)]", dtype=dtype)
    (match,) = find_all(g)
    assert run(MatmulTemplate(), match, g, TMA) == (1, 0)


def test_misaligned_rows_fall_back_to_the_tile_kernel(tmp_path):
    """K = 17 fp32 rows are 68 bytes apart: TMA needs 16-byte aligned strides, so the tile kernel runs."""
    g = capture_problem(tmp_path, "return torch.tanh(self.fc(args[0]))", "[torch.randn(23, 17)]",
                        "self.fc = nn.Linear(17, 20)")
    (match,) = find_all(g)
    assert run(MatmulTemplate(), match, g, TMA) == (0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_gemm_walks_every_batch(tmp_path, dtype):
    """Tiles of all batches in one persistent launch: the tile index spans batches as well as (M, N)."""
    g = capture_problem(tmp_path, "return torch.sigmoid(torch.bmm(args[0], args[1]))",
                        "[torch.randn(5, 33, 64), torch.randn(5, 64, 40)]", dtype=dtype)
    (match,) = find_all(g)
    assert run(MatmulTemplate(), match, g, dict(TMA, GROUP_M=4)) == (1, 0)


def test_swiglu_shares_the_a_tile_through_tma(tmp_path):
    init = "self.w1 = nn.Linear(64, 32, bias=False)\nself.w3 = nn.Linear(64, 32, bias=False)"
    g = capture_problem(tmp_path, "x = args[0]\nreturn F.silu(self.w1(x)) * self.w3(x)", "[torch.randn(45, 64)]",
                        init, torch.bfloat16)
    (match,) = find_all(g)
    assert match.family == "dual_gemm"
    assert run(DualGemmTemplate(), match, g, dict(TMA, FUSE=False)) == (1, 0)


def test_the_tma_knob_is_searched_and_split_k_stays_with_tiles():
    from kernelevolve.templates.matmul import fit, gemm_space

    space = gemm_space({"Bt": 1, "M": 4096, "N": 4096, "K": 4096}, "tl.bfloat16", 1)
    assert space["SCHEDULE"] == ["tiles", "tma"]
    cfg = fit({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3, "SPLIT_K": 4,
               "SCHEDULE": "tma"}, {"M": 64, "N": 64, "K": 65536}, 2, 1)
    assert cfg["SPLIT_K"] == 1 and cfg["SCHEDULE"] == "tma"
