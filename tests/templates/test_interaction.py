"""InteractionTemplate: DLRM pairwise dot and FM second-order term, in several spellings, against ATen."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.analyze.graph import capture, node_values, op_name  # noqa: E402
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.templates.base import FILE_HEADER, load_source  # noqa: E402
from kernelevolve.templates.interaction import InteractionTemplate  # noqa: E402

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}

DLRM_CAT = """\
T = torch.cat([dense.unsqueeze(1), ly], dim=1)
Z = torch.bmm(T, torch.transpose(T, 1, 2))
_, ni, nj = Z.shape
li = torch.tensor([i for i in range(ni) for j in range(i)])
lj = torch.tensor([j for i in range(nj) for j in range(i)])
return torch.cat([dense, Z[:, li, lj]], dim=1)"""
# The bf16 FM difference cancels: its inputs are halves, so every rounding step is exact (the interpreter truncates
# where the GPU rounds to nearest even).
# name: (buffers made in __init__, forward arguments, forward body, inputs, ops the match must hold)
CASES = {
    "dlrm_list_cat": ("", "dense, ly", DLRM_CAT, "torch.randn(7, 33), torch.randn(7, 4, 33)", {"bmm", "index", "cat"}),
    "dlrm_tril_self_bf16": (
        "", "dense, ly", "T = torch.cat([dense.unsqueeze(1), ly], dim=1)\n"
        "Z = torch.bmm(T, T.transpose(1, 2))\nli, lj = torch.tril_indices(7, 7, offset=0)\n"
        "return torch.cat([dense, Z[:, li, lj]], dim=1)",
        "torch.randn(7, 33).bfloat16(), torch.randn(7, 6, 33).bfloat16()", {"bmm", "tril_indices", "cat"}),
    "einsum_buffer_pairs": (
        "li, lj = torch.tril_indices(5, 5, offset=-1)\nself.register_buffer('li', li)\n"
        "self.register_buffer('lj', lj)", "dense, T",
        "Z = torch.einsum('bnd,bmd->bnm', T, T)\nreturn torch.cat([dense, Z[:, self.li, self.lj]], dim=1)",
        "torch.randn(3, 8), torch.randn(3, 5, 8)", {"bmm", "index", "cat"}),
    "matmul_triu_no_cat": ("", "T", "Z = T @ T.permute(0, 2, 1)\ni, j = torch.triu_indices(5, 5)\nreturn Z[:, i, j]",
                           "torch.randn(1, 5, 130)", {"bmm", "triu_indices", "index"}),
    "flat_buffer_transposed": (
        "i, j = torch.triu_indices(6, 6, 1)\nself.register_buffer('flat', i * 6 + j)", "x",
        "T = x.transpose(1, 2)\nZ = torch.bmm(T.transpose(1, 2), T)\nreturn Z.reshape(x.shape[0], -1)[:, self.flat]",
        "torch.randn(5, 6, 20)", {"bmm", "view", "index"}),
    "gram_of_columns_negative_pairs": (
        "", "x", "Z = torch.bmm(x.transpose(1, 2), x)\nli = torch.tensor([0, 2, 1, -1])\n"
        "lj = torch.tensor([1, 0, 3, 2])\nreturn Z[:, li, lj]", "torch.randn(3, 17, 4)", {"bmm", "index"}),
    "dlrm_flat_embeddings_bf16": (
        "", "dense, e1, e2", "B, D = dense.shape\nT = torch.cat([dense, e1, e2], dim=1).view(B, -1, D)\n"
        "Z = torch.bmm(T, T.transpose(1, 2))\nli, lj = torch.tril_indices(3, 3, -1)\n"
        "return torch.cat([dense, Z[:, li, lj]], dim=1)",
        "torch.randn(9, 16).bfloat16(), torch.randn(9, 16).bfloat16(), torch.randn(9, 16).bfloat16()",
        {"bmm", "view", "cat"}),
    "einsum_flat_index_select_bf16": (
        "self.register_buffer('pairs', torch.tensor([i * 6 + j for i in range(6) for j in range(i)]), "
        "persistent=False)", "dense, sparse",
        "features = torch.cat([dense.unsqueeze(1), sparse], dim=1)\n"
        "dots = torch.einsum('bid,bjd->bij', features, features)\n"
        "return torch.cat([dense, dots.flatten(1).index_select(1, self.pairs)], dim=1)",
        "torch.randn(7, 33).bfloat16(), torch.randn(7, 5, 33).bfloat16()", {"bmm", "index_select", "cat", "unsqueeze"}),
    "take_along_dim_negative_buffer": (
        "self.register_buffer('pairs', torch.tensor([1, -3, 7, 24, -25, 12, 0]))", "x",
        "z = torch.einsum('bid,bjd->bij', x, x)\nreturn torch.take_along_dim(z.flatten(1), self.pairs[None, :], dim=1)",
        "torch.randn(3, 5, 19)", {"bmm", "gather", "remainder", "expand"}),
    "gather_constant_pairs": (
        "", "x", "z = torch.bmm(x, x.transpose(1, 2))\nli, lj = torch.tril_indices(5, 5, -1)\n"
        "return torch.gather(z.flatten(1), 1, (li * 5 + lj).expand(x.shape[0], -1))",
        "torch.randn(1, 5, 17)", {"bmm", "gather", "tril_indices"}),
    "fm_sum_over_d": ("", "x", "s = x.sum(dim=1)\nreturn 0.5 * (s * s - (x * x).sum(dim=1)).sum(dim=1, keepdim=True)",
                      "torch.randn(7, 13, 33)", {"sum", "sub", "mul"}),
    "fm_keepdim_bf16": (
        "", "x", "square_of_sum = torch.pow(torch.sum(x, dim=1, keepdim=True), 2)\n"
        "sum_of_square = torch.sum(x ** 2, dim=1, keepdim=True)\nreturn 0.5 * (square_of_sum - sum_of_square)",
        "(torch.randint(-2, 3, (5, 7, 16)) * 0.5).bfloat16()", {"pow", "sub", "mul"}),
    "fm_upcast_bf16": ("", "x", "x = x.float()\ns = x.sum(dim=1)\n"
                       "return (0.5 * (s.pow(2) - x.pow(2).sum(dim=1))).sum(dim=-1)",
                       "torch.randn(7, 13, 33).bfloat16()", {"_to_copy", "sub", "sum"}),
}
WHOLE = {"einsum_flat_index_select_bf16", "take_along_dim_negative_buffer", "gather_constant_pairs"}  # no ATen left
NEGATIVE = {
    "two_tensors": ("x, y", "Z = torch.bmm(x, y.transpose(1, 2))\nli, lj = torch.tril_indices(5, 5, -1)\n"
                    "return Z[:, li, lj]", "torch.randn(3, 5, 8), torch.randn(3, 5, 8)"),
    "not_transposed": ("x", "Z = torch.bmm(x, x)\nli, lj = torch.tril_indices(8, 8, -1)\nreturn Z[:, li, lj]",
                       "torch.randn(3, 8, 8)"),
    "fm_two_tensors": ("x, y", "return x.sum(1) ** 2 - (y * y).sum(1)", "torch.randn(3, 5, 8), torch.randn(3, 5, 8)"),
    "plain_bmm": ("x", "return torch.bmm(x, x.transpose(1, 2))", "torch.randn(3, 5, 8)"),
    "gather_per_row_pairs": ("x, p", "z = torch.bmm(x, x.transpose(1, 2))\nreturn torch.gather(z.flatten(1), 1, p)",
                             "torch.randn(3, 5, 8), torch.randint(0, 25, (3, 4))"),
    "index_select_rows": ("x, p", "z = torch.bmm(x, x.transpose(1, 2))\nreturn z.index_select(1, p)",
                          "torch.randn(3, 5, 8), torch.tensor([0, 2])"),
}


def make(tmp_path, name: str, init: str, args: str, forward: str, inputs: str):
    source = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
              f"        super().__init__()\n{textwrap.indent(init, ' ' * 8)}\n\n    def forward(self, {args}):\n"
              f"{textwrap.indent(forward, ' ' * 8)}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
              "def get_init_inputs():\n    return []\n")
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return capture(load_problem(path))


def configs(template, match):
    space = template.space(match, "cpu")
    return [{k: v[0] for k, v in space.items()}, {k: v[-1] for k, v in space.items()},
            {k: v[min(2, len(v) - 1)] for k, v in space.items()}]


def run(match, config, args):
    source = FILE_HEADER + PRELUDE_IMPORTS + "\n" + PRELUDE + InteractionTemplate().render(match, config, "dot0")
    return load_source(source).dot0(*args)


def check(outs, refs):
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        atol, rtol = TOL[ref.dtype]
        torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", list(CASES))
def test_finds_and_matches_reference(tmp_path, name):
    *problem, ops = CASES[name]
    g = make(tmp_path, name, *problem)
    template = InteractionTemplate()
    (m,) = template.find(g, set())
    assert m.kind == "pairwise_interaction"
    assert ops <= {op_name(n) for n in m.nodes}
    assert m.outputs == g.outputs()
    assert name not in WHOLE or set(m.nodes) == set(g.calls())
    values = node_values(g)
    for config in configs(template, m):
        check(run(m, config, [values[n] for n in m.inputs]), [values[n] for n in m.outputs])


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_ignores_other_graphs(tmp_path, name):
    g = make(tmp_path, name, "pass", *NEGATIVE[name])
    assert InteractionTemplate().find(g, set()) == []


def test_index_inputs_are_read_at_run_time(tmp_path):
    """Pair indices that are module buffers are inputs: other pairs (negative ones too) give their own dots."""
    g = make(tmp_path, "pairs", *CASES["einsum_buffer_pairs"][:4])
    (m,) = InteractionTemplate().find(g, set())
    li = torch.tensor([4, 0, -1, 2, 3, 3, 0, -5, 1, 2])
    lj = torch.tensor([0, 0, 3, -2, 3, 1, 4, 2, 1, 2])
    dense, T = g.example[1], g.example[2]
    by_placeholder = dict(zip(g.placeholders(), [li, lj, dense, T]))
    Z = torch.bmm(T, T.transpose(1, 2))
    out = run(m, {}, [by_placeholder[n] for n in m.inputs])
    check(out[:1], [torch.cat([dense, Z[:, li, lj]], dim=1)])


def test_flat_pairs_buffer_read_at_run_time(tmp_path):
    """The problem's flat triangle buffer is an input: other positions give their own dots."""
    g = make(tmp_path, "flat", *CASES["einsum_flat_index_select_bf16"][:4])
    (m,) = InteractionTemplate().find(g, set())
    pairs = torch.tensor([35, 0, 7, 14, 29, 1, 6, 30, 12, 13, 21, 8, 2, 33, 18])
    dense, sparse = g.example[1], g.example[2]
    by_placeholder = dict(zip(g.placeholders(), [pairs, dense, sparse]))
    t = torch.cat([dense.unsqueeze(1), sparse], dim=1)
    ref = torch.cat([dense, torch.einsum('bid,bjd->bij', t, t).flatten(1).index_select(1, pairs)], dim=1)
    check(run(m, {}, [by_placeholder[n] for n in m.inputs]), [ref])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_matches_reference(tmp_path, name):
    *problem, _ = CASES[name]
    g = make(tmp_path, name, *problem)
    template = InteractionTemplate()
    values = node_values(g)
    (m,) = template.find(g, set())
    args = [values[n].cuda() for n in m.inputs]
    for config in configs(template, m):
        check([o.cpu() for o in run(m, config, args)], [values[n] for n in m.outputs])


@pytest.mark.parametrize("name, modes", [("dlrm_list_cat", ["ieee", "tf32x3"]), ("dlrm_tril_self_bf16", None)])
def test_fp32_products_may_use_tf32x3(tmp_path, name, modes):
    """Exact FMA first; tf32x3 (about fp32 accuracy on tensor cores) for the search. Half inputs use tensor cores."""
    *problem, _ = CASES[name]
    (m,) = InteractionTemplate().find(make(tmp_path, name, *problem), set())
    assert InteractionTemplate().space(m, "cuda").get("INPUT_PRECISION") == modes
    source = InteractionTemplate().render(m, {"INPUT_PRECISION": "tf32x3"} if modes else {}, "dot0")
    assert ('input_precision="tf32x3"' in source) == bool(modes)
