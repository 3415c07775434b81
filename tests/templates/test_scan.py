"""ScanTemplate: cumulative sums and products along any dimension, reversed by flips, fed by pointwise ops."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.analyze.graph import op_name  # noqa: E402
from kernelevolve.templates.base import HopelessConfig  # noqa: E402
from kernelevolve.templates.scan import ScanTemplate  # noqa: E402
from tests.templates.rendering import captured, run_match  # noqa: E402

HEAD = "import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, {args}):\n        return {body}\n"
TAIL = "def get_inputs(): return [{inputs}]\ndef get_init_inputs(): return []\n"
# name: (forward arguments, forward expression, inputs, the ops the match holds, tolerance)
CASES = {
    "cumsum_rows": ("x", "torch.cumsum(x, dim=1)", "torch.randn(9, 1000)", {"cumsum"}, 1e-4),
    "cumsum_last_negative_dim": ("x", "x.cumsum(-1)", "torch.randn(3, 5, 77)", {"cumsum"}, 1e-4),
    "cumprod_rows": ("x", "torch.cumprod(x, dim=1)", "torch.rand(7, 300) + 0.5", {"cumprod"}, 1e-4),
    "reverse_cumsum": ("x", "torch.cumsum(x.flip(1), dim=1).flip(1)", "torch.randn(6, 333)",
                       {"flip", "cumsum"}, 1e-4),
    "cumsum_of_flipped": ("x", "torch.cumsum(torch.flip(x, [0]), 0)", "torch.randn(50, 3)", {"flip", "cumsum"}, 1e-4),
    "masked_cumsum": ("x, mask", "torch.cumsum(x * mask, dim=1)",
                      "torch.randn(5, 700), torch.randint(0, 2, (5, 700)).bool()", {"mul", "cumsum"}, 1e-4),
    "inner_dim": ("x", "torch.cumsum(torch.relu(x) * 2.0, dim=1)", "torch.randn(3, 40, 45)",
                  {"relu", "mul", "cumsum"}, 1e-4),
    "first_dim_cumprod": ("x", "torch.cumprod(x, dim=0)", "torch.rand(30, 70) + 0.5", {"cumprod"}, 1e-4),
    "broadcast_prologue": ("x, w", "torch.cumsum(x * w, dim=1)", "torch.randn(4, 200), torch.randn(200)",
                           {"mul", "cumsum"}, 1e-4),
    "scalar_scale_inner_dim": ("x, w", "torch.cumsum(x * w, dim=0)", "torch.randn(30, 20, 1), torch.randn(1)",
                               {"mul", "cumsum"}, 1e-4),
    "exclusive_narrow": ("x", "torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), "
                         "torch.cumsum(x.narrow(dim=1, start=0, length=x.size(1) - 1), dim=1)), dim=1)",
                         "torch.randn(6, 300)", {"select", "unsqueeze", "full_like", "slice", "cumsum", "cat"}, 1e-4),
    "exclusive_inner_dim": ("x", "torch.cat([torch.zeros(4, 1, 20), torch.cumsum(x[:, :-1], 1)], 1)",
                            "torch.randn(4, 30, 20)", {"full", "slice", "cumsum", "cat"}, 1e-4),
    "exclusive_cumprod": ("x", "torch.cat([torch.ones_like(x[:, :1]), torch.cumprod(x[:, :-1] * 0.5 + 0.75, 1)], 1)",
                          "torch.rand(5, 70)", {"slice", "full_like", "mul", "add", "cumprod", "cat"}, 1e-4),
    "bf16": ("x", "torch.cumsum(x, dim=1)", "torch.randn(4, 260).bfloat16()", {"cumsum"}, 3e-2),
    "int_counts": ("x", "torch.cumsum(x, dim=1)", "torch.randint(0, 5, (6, 90), dtype=torch.int32)",
                   {"cumsum"}, 0),
}


def make(tmp_path, name):
    args, body, inputs, _, _ = CASES[name]
    return captured(tmp_path, HEAD.format(args=args, body=body) + TAIL.format(inputs=inputs))


def configs(template, match):
    space = template.space(match, "cpu")
    picks = [{k: v[0] for k, v in space.items()}, {k: v[-1] for k, v in space.items()},
             {k: v[min(2, len(v) - 1)] for k, v in space.items()}]
    return [dict(c) for c in {tuple(sorted(c.items())) for c in picks}]


@pytest.mark.parametrize("name", CASES)
def test_a_scan_is_one_kernel_and_matches_aten(tmp_path, name):
    g = make(tmp_path, name)
    t = ScanTemplate()
    (m,) = t.find(g, set())
    assert {op_name(n) for n in m.nodes} == CASES[name][3]
    assert len(m.outputs) == 1
    tol = CASES[name][4]
    for cfg in configs(t, m):
        run_match(t, g, m, cfg, atol=tol, rtol=tol)


def test_long_rows_are_scanned_in_chunks_with_a_carry(tmp_path):
    """Rows of 1000 in chunks of 64: every chunk but the first starts from the carry of the ones before it."""
    g = make(tmp_path, "reverse_cumsum")
    t = ScanTemplate()
    (m,) = t.find(g, set())
    source = t.render(m, {"TILE": 64, "num_warps": 2}, "k")
    assert "BLOCK=64" in source and "carry = carry +" in source
    run_match(t, g, m, {"TILE": 64, "num_warps": 2})


def test_a_prologue_value_used_elsewhere_stays_outside(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="torch.cumsum(torch.relu(x), 1), torch.relu(x) + 1")
                 + TAIL.format(inputs="torch.randn(4, 50)"))
    (m,) = ScanTemplate().find(g, set())
    assert {op_name(n) for n in m.nodes} == {"cumsum"}


def test_a_flip_of_two_dims_is_not_a_reverse_scan(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="torch.cumsum(x.flip(0, 1), 1)")
                 + TAIL.format(inputs="torch.randn(4, 50)"))
    (m,) = ScanTemplate().find(g, set())
    assert {op_name(n) for n in m.nodes} == {"cumsum"}
    run_match(ScanTemplate(), g, m)


def test_a_tile_too_large_is_hopeless(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="x.cumsum(1)") + TAIL.format(inputs="torch.randn(2, 40000)"))
    t = ScanTemplate()
    (m,) = t.find(g, set())
    with pytest.raises(HopelessConfig):
        t.render(m, {"TILE": 1 << 16, "num_warps": 4}, "k")
    t.render(m, {k: v[0] for k, v in t.space(m, "cpu").items()}, "k")  # the defaults fit


def test_no_scan_no_match(tmp_path):
    g = captured(tmp_path, HEAD.format(args="x", body="x.sum(1)") + TAIL.format(inputs="torch.randn(4, 50)"))
    assert ScanTemplate().find(g, set()) == []
