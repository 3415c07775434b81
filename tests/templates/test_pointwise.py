import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernelevolve.templates.pointwise import PointwiseTemplate, merge_dims, offset_expr  # noqa: E402
from tests.templates.rendering import captured, run_match  # noqa: E402

SCALE_BIAS = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(70))
        self.bias = nn.Parameter(torch.randn(70))
    def forward(self, x):
        return torch.relu(x * self.scale + self.bias)
def get_inputs(): return [torch.randn(37, 70)]
def get_init_inputs(): return []
"""
GATED = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x, y, z):
        g = torch.where(y > 0, x * torch.sigmoid(y), z)
        return F.gelu(g).masked_fill(x < -1.5, 0.0).to(torch.bfloat16), torch.tanh(g)
def get_inputs(): return [torch.randn(3, 5, 33), torch.randn(3, 5, 33), torch.randn(1, 5, 1)]
def get_init_inputs(): return []
"""
MATMUL_ONLY = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs(): return [torch.randn(8, 9), torch.randn(9, 7)]
def get_init_inputs(): return []
"""


def test_broadcast_chain_is_one_kernel(tmp_path):
    g = captured(tmp_path, SCALE_BIAS)
    (m,) = PointwiseTemplate().find(g, set())
    assert len(m.nodes) == 3 and len(m.inputs) == 3
    for cfg in ({}, {"BLOCK": 256, "num_warps": 2}):
        run_match(PointwiseTemplate(), g, m, cfg)


def test_where_masks_casts_and_two_outputs(tmp_path):
    g = captured(tmp_path, GATED)
    (m,) = PointwiseTemplate().find(g, set())
    assert len(m.outputs) == 2
    run_match(PointwiseTemplate(), g, m, {"BLOCK": 64}, atol=1e-2, rtol=1e-2)


def test_no_pointwise_no_match(tmp_path):
    assert PointwiseTemplate().find(captured(tmp_path, MATMUL_ONLY), set()) == []


@pytest.mark.parametrize("full,strides,merged", [
    ((4, 5, 6), [(30, 6, 1)], (120,)),
    ((4, 5, 6), [(30, 6, 1), (0, 0, 1)], (20, 6)),
    ((4, 5, 6), [(30, 6, 1), (6, 0, 1)], (4, 5, 6)),
])
def test_dims_merge_only_where_every_operand_is_contiguous(full, strides, merged):
    assert merge_dims(full, strides)[0] == merged


def test_offsets_of_a_broadcast_operand():
    assert offset_expr((20, 6), (0, 1), "i") == "(i % 6)"
    assert offset_expr((20, 6), (6, 1), "i") == "i"
    assert offset_expr((4, 5, 6), (6, 0, 1), "i") == "(i // 30) * 6 + (i % 6)"


SIBLINGS = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x), torch.tanh(x) * 3
def get_inputs(): return [torch.randn(17, 40)]
def get_init_inputs(): return []
"""


def test_independent_readers_of_one_input_share_a_kernel(tmp_path):
    g = captured(tmp_path, SIBLINGS)
    (m,) = PointwiseTemplate().find(g, set())
    assert len(m.outputs) == 2 and len(m.inputs) == 1
    run_match(PointwiseTemplate(), g, m)
