"""PoolTemplate: average and max pooling over 1, 2 and 3 spatial dims, against the ATen reference."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernelevolve.analyze.graph import op_name  # noqa: E402
from kernelevolve.templates.pool import PoolTemplate  # noqa: E402
from tests.templates.rendering import captured, run_match  # noqa: E402

HEAD = ("import torch, torch.nn as nn, torch.nn.functional as F\nclass Model(nn.Module):\n"
        "    def forward(self, {args}):\n        return {body}\n")
TAIL = "def get_inputs(): return [{inputs}]\ndef get_init_inputs(): return []\n"
# name: (forward arguments, forward expression, inputs, the ops the match holds)
CASES = {
    "avg2d": ("x", "F.avg_pool2d(x, 3)", "torch.randn(2, 3, 17, 20)", {"avg_pool2d"}),
    "avg2d_pad_stride": ("x", "F.avg_pool2d(x, (3, 5), stride=(2, 1), padding=(1, 2))", "torch.randn(2, 3, 17, 20)",
                         {"avg_pool2d"}),
    "avg2d_exclude_pad_ceil": ("x", "F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)",
                               "torch.randn(1, 4, 16, 15)", {"avg_pool2d"}),
    "avg2d_divisor": ("x", "F.avg_pool2d(x, 2, divisor_override=3)", "torch.randn(2, 2, 9, 8)", {"avg_pool2d"}),
    "avg1d": ("x", "F.avg_pool1d(x, 8, stride=1, padding=4)", "torch.randn(2, 3, 70)",
             {"unsqueeze", "avg_pool2d", "squeeze"}),
    "avg3d": ("x", "F.avg_pool3d(torch.relu(x), 3, 2, 1)", "torch.randn(2, 2, 9, 10, 11)", {"relu", "avg_pool3d"}),
    "big_window": ("x", "F.avg_pool2d(x, 11)", "torch.randn(1, 2, 45, 47)", {"avg_pool2d"}),
    "max2d": ("x", "F.max_pool2d(x * 2.0, 2)", "torch.randn(2, 3, 16, 18)", {"mul", "max_pool2d_with_indices",
                                                                            "getitem"}),
    "max2d_dilation_ceil": ("x", "F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True)", "torch.randn(1, 3, 19, 16)",
                            {"max_pool2d_with_indices", "getitem"}),
    "max3d": ("x", "F.max_pool3d(x, (2, 3, 3), stride=2, padding=1, dilation=(1, 2, 1))",
              "torch.randn(1, 2, 8, 13, 12)", {"max_pool3d_with_indices", "getitem"}),
    "max1d": ("x", "F.max_pool1d(torch.sigmoid(x), 4, 2)", "torch.randn(2, 5, 41)",
              {"sigmoid", "unsqueeze", "max_pool2d_with_indices", "getitem", "squeeze"}),
    "max_bf16": ("x", "F.max_pool2d(x, 3, 1, 1)", "torch.randn(1, 3, 12, 12).bfloat16()",
                 {"max_pool2d_with_indices", "getitem"}),
}


def make(tmp_path, name):
    args, body, inputs, _ = CASES[name]
    return captured(tmp_path, HEAD.format(args=args, body=body) + TAIL.format(inputs=inputs))


@pytest.mark.parametrize("name", CASES)
def test_a_pool_is_one_kernel_and_matches_aten(tmp_path, name):
    g = make(tmp_path, name)
    t = PoolTemplate()
    (m,) = t.find(g, set())
    assert {op_name(n) for n in m.nodes} == CASES[name][3]
    tol = 2e-2 if "bf16" in name else 1e-5
    for cfg in ({}, {"BLOCK": 128, "num_warps": 2}):
        run_match(t, g, m, cfg, atol=tol, rtol=tol)


def test_max_pool_propagates_nan(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="F.max_pool2d(torch.log(x), 2)")
                 + TAIL.format(inputs="torch.randn(1, 2, 8, 8)"))  # log of a negative is NaN
    t = PoolTemplate()
    (m,) = t.find(g, set())
    run_match(t, g, m, {}, atol=1e-5, rtol=1e-5)  # NaN where the reference has NaN, the rest as close as ever


def test_the_indices_of_a_max_pool_keep_it_with_aten(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="F.max_pool2d(x, 2, return_indices=True)")
                 + TAIL.format(inputs="torch.randn(1, 2, 8, 8)"))
    assert PoolTemplate().find(g, set()) == []
