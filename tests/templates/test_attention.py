"""Attention: each spelling is found on the captured graph and its flash kernel reproduces the ATen values."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools
import textwrap
import warnings

import pytest
import torch

from kernelevolve.analyze.graph import capture, node_values
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS
from kernelevolve.problem import load_problem
from kernelevolve.templates.attention import AttentionTemplate
from kernelevolve.templates.attention.render import layout_of
from kernelevolve.templates.base import FILE_HEADER, load_source

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
_count = itertools.count()

MANUAL = """
att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
att = att.masked_fill(self.bias[:, :, :S, :S] == 0, float("-inf"))
return F.softmax(att, dim=-1) @ v
"""
SDPA = "return F.scaled_dot_product_attention(q, k, v, is_causal={causal})"
HSTU = """
s = torch.einsum("bhsd,bhtd->bhst", q, k)
mask = torch.tril(torch.ones(S, S, dtype=torch.bool, device=q.device))
return torch.einsum("bhst,bhtd->bhsd", F.silu(s) / S * mask, v)
"""
WINDOW = """
s = q @ k.transpose(-2, -1) / 4.0
s = 30.0 * torch.tanh(s / 30.0)
i = torch.arange(S, device=q.device)
keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 9)
return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v
"""
PROJECTED = """
x, lengths = q, k
B, T, _ = x.shape
q, k, v = self.qkv(x).split(32, dim=2)
q, k, v = (t.view(B, T, 2, 16).transpose(1, 2) for t in (q, k, v))
att = (q @ k.transpose(-2, -1)) / 4.0
att = att.masked_fill(~(torch.arange(T, device=x.device)[None, :] < lengths[:, None])[:, None, None, :], float("-inf"))
y = F.softmax(att, dim=-1) @ v
return y.transpose(1, 2).contiguous().view(B, T, 32)
"""


def capture_problem(tmp_path, forward: str, b: int = 2, s: int = 37, d: int = 16, dtype=torch.float32,
                    inputs: str = "[torch.randn(B, H, S, D) for _ in range(3)]"):
    name = str(dtype).split(".")[-1]
    source = "\n".join([
        "import math", "import torch", "import torch.nn as nn", "import torch.nn.functional as F", "",
        f"B, H, S, D = {b}, 2, {s}, {d}", "",
        "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
        "        self.register_buffer('bias', torch.tril(torch.ones(80, 80)).view(1, 1, 80, 80))",
        "        self.qkv = nn.Linear(32, 96)", "",
        "    def forward(self, q, k, v=None):", textwrap.indent(textwrap.dedent(forward).strip(), " " * 8), "",
        "def get_inputs():", f"    return [t.to(torch.{name}) if t.is_floating_point() else t for t in {inputs}]", "",
        "def get_init_inputs():", "    return []", ""])
    path = tmp_path / f"problem_{next(_count)}.py"
    path.write_text(source)
    return capture(load_problem(path))


def only_match(graph):
    matches = AttentionTemplate().find(graph, set())
    assert len(matches) == 1
    return matches[0]


def check(graph, match, configs=({},), tol: float = 1e-4, nan: bool = False) -> None:
    template = AttentionTemplate()
    space = template.space(match, "cpu")
    values = node_values(graph)
    for config in configs:
        cfg = {key: vals[0] for key, vals in space.items()} | dict(config)
        name = f"att{next(_count)}"
        source = "\n".join([FILE_HEADER, PRELUDE_IMPORTS, PRELUDE, template.render(match, cfg, name)])
        module = load_source(source, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # rows past the end divide 0 by 0 before the masked store
            outs = getattr(module, name)(*[values[n] for n in match.inputs])
        assert len(outs) == len(match.outputs)
        for out, node in zip(outs, match.outputs):
            torch.testing.assert_close(out, values[node], atol=tol, rtol=tol, equal_nan=nan)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_manual_causal_with_a_buffer_mask(tmp_path, dtype):
    graph = capture_problem(tmp_path, MANUAL, dtype=dtype)
    match = only_match(graph)
    spec = match.spec
    assert (spec["mode"], spec["band"], spec["zero_empty"]) == ("softmax", [None, 0], False)
    assert len(spec["aux"]) == 1 and spec["score"]["interior"] == ([], "s")  # the buffer is not read off the band
    check(graph, match, [{}, {"BLOCK_N": 32}], TOL[dtype])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa(tmp_path, dtype, causal):
    graph = capture_problem(tmp_path, SDPA.format(causal=causal), b=1, s=70, d=32, dtype=dtype)
    match = only_match(graph)
    assert match.spec["zero_empty"] and match.spec["band"] == [None, 0 if causal else None]
    assert not match.spec["aux"] and match.spec["scale"] == pytest.approx(32 ** -0.5)
    check(graph, match, [{}, {"BLOCK_M": 64, "BLOCK_N": 32}] if causal else [{}], TOL[dtype])


def test_hstu_pointwise_scores(tmp_path):
    graph = capture_problem(tmp_path, HSTU, s=45)
    match = only_match(graph)
    assert match.spec["mode"] == "pointwise" and match.spec["band"] == [None, 0]
    check(graph, match, [{}, {"BLOCK_N": 32}])


HSTU_REGION = """
bias, mask = k, v
q, k, v = q.unbind(0)
s = F.silu(q @ k.transpose(-2, -1) + bias) / S
return (s * mask) @ v
"""


def test_hstu_scores_over_activations_go_to_attention_not_towers(tmp_path):
    """A model's HSTU attention cut out as a region: q, k, v, the position bias and the padding mask all arrive as
    inputs and the sequence is short enough for the towers' fused chain. The families claim in the registry's order;
    attention takes it (towers multiply by the model's own weights, never by two activations)."""
    from kernelevolve.templates.registry import FAMILIES

    graph = capture_problem(tmp_path, HSTU_REGION, s=24,
                            inputs="[torch.randn(3, B, H, S, D), torch.randn(H, S, S), "
                                   "(torch.rand(B, 1, S, S) > 0.3).float()]")
    taken, claims = set(), []
    for family in FAMILIES:
        for match in family.template().find(graph, taken):
            taken |= set(match.nodes)
            claims.append(match)
    bmm = [m for m in claims if any(n.target == torch.ops.aten.bmm.default for n in m.nodes)]
    assert [m.family for m in bmm] == ["attention"]
    assert bmm[0].spec["mode"] == "pointwise" and len(bmm[0].spec["aux"]) == 2
    check(graph, bmm[0], [{}, {"BLOCK_N": 16}])


def test_softcap_and_sliding_window_built_from_arange(tmp_path):
    graph = capture_problem(tmp_path, WINDOW, b=1, s=70, d=32, dtype=torch.bfloat16)
    match = only_match(graph)
    assert match.spec["band"] == [-8, 0] and not match.spec["aux"]
    check(graph, match, [{"BLOCK_M": 64, "BLOCK_N": 32}, {"BLOCK_M": 64, "BLOCK_N": 16}], TOL[torch.bfloat16])


def test_projected_heads_lengths_mask_and_output_layout(tmp_path):
    graph = capture_problem(tmp_path, PROJECTED, inputs="[torch.randn(2, 33, 32), torch.tensor([33, 20])]")
    match = only_match(graph)
    assert [n.name for n in match.outputs] == [graph.outputs()[0].name]  # writes [B, T, H*D] itself
    assert [a["kind"] for a in match.spec["aux"]] == ["scalar"]
    check(graph, match)


def test_fp32_dots_are_exact_unless_the_problem_allows_tf32(tmp_path):
    match = only_match(capture_problem(tmp_path, SDPA.format(causal=False)))
    template = AttentionTemplate()
    config = {key: vals[0] for key, vals in template.space(match, "cpu").items()}
    assert "input_precision='ieee'" in template.render(match, config, "exact")
    match.spec["allow_tf32"] = True
    assert "input_precision='tf32'" in template.render(match, config, "fast")


def test_fully_masked_rows_give_nan_like_torch(tmp_path):
    forward = """
    att = (q @ k.transpose(-2, -1)).masked_fill(self.bias[:, :, :S, :S] == 1, float("-inf"))
    return F.softmax(att, dim=-1) @ v
    """
    graph = capture_problem(tmp_path, forward, s=33)  # keys strictly after the query: the last row has none
    match = only_match(graph)
    assert match.spec["band"] == [1, None]
    check(graph, match, [{"BLOCK_M": 16, "BLOCK_N": 16}], nan=True)


def test_random_parameters_are_read_not_baked_in(tmp_path):
    forward = """
    att = (q @ k.transpose(-2, -1)) * self.qkv.bias[0] * 0 + self.qkv.bias[1]
    return F.softmax(att.masked_fill(self.bias[:, :, :S, :S] == 0, float("-inf")), dim=-1) @ v
    """
    graph = capture_problem(tmp_path, forward)
    match = only_match(graph)
    assert match.spec["band"] == [None, None]  # the scores depend on values unknown at capture: nothing skipped
    interior = " ".join(match.spec["score"]["interior"][0])
    assert "* a0)" in interior and "+ a1)" in interior
    check(graph, match)


@pytest.mark.parametrize("forward", [
    "return q @ k.transpose(-2, -1)",
    "return (q @ k.transpose(-2, -1) * 0.5) @ v",
    "return F.softmax(q @ k.transpose(-2, -1), dim=-2) @ v",
    "a = F.softmax(q @ k.transpose(-2, -1), dim=-1)\nreturn a @ v, a",
])
def test_no_match(tmp_path, forward):
    assert AttentionTemplate().find(capture_problem(tmp_path, forward), set()) == []


def test_layout_reads_batch_dims_without_copying():
    x = torch.empty(2, 5, 3, 4).transpose(1, 2)  # [B, H, S, D] over a [B, S, H, D] buffer
    assert layout_of(x, 6, 5, 4) == (2, 3, 0, 60, 4, 12, 1)
    assert layout_of(x.transpose(2, 3), 6, 4, 5) == (2, 3, 0, 60, 4, 1, 12)
    assert layout_of(torch.empty(4, 6)[:, :4], 1, 4, 4) == (1, 1, 0, 0, 0, 6, 1)
    assert layout_of(torch.empty(4, 4).t(), 1, 2, 8) is None


def test_the_generated_operand_works_out_a_layout_once_per_shape_and_strides():
    from kernelevolve.templates.attention.render import helper_source

    env: dict = {}
    exec(helper_source("k0"), env)
    x = torch.empty(2, 5, 3, 4).transpose(1, 2)
    assert env["k0_operand"](x, 6, 5, 4)[1] == (2, 3, 0, 60, 4, 12, 1)
    assert env["k0_operand"](x.contiguous(), 6, 5, 4)[1] == (1, 6, 0, 0, 20, 4, 1)  # same shape, new strides
    assert env["k0_operand"](x, 6, 5, 4)[1] == (2, 3, 0, 60, 4, 12, 1)
    t = torch.arange(16.0).reshape(4, 4).t()
    for _ in range(2):  # a copy on every call, the cached answer or not
        y, lay = env["k0_operand"](t, 1, 2, 8)
        assert y.is_contiguous() and torch.equal(y.flatten(), t.reshape(-1)) and lay == (1, 1, 0, 0, 0, 8, 1)
    assert len(env["k0_LAYOUTS"]) == 4
    with pytest.raises(ValueError, match="expected 1x2x4"):
        env["k0_operand"](t, 1, 2, 4)
