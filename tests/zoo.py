"""A formulation zoo: the same computation written the many ways users write it, for every template family, each drawn
at small random sizes (odd ones included) and dtypes from a seed. tests/propose/test_zoo.py asks that every zoo
problem be claimed by its own family and that the family's kernel pass the judge. A formulation a family once failed
to match belongs here, as a regression test.

Each formulation: (the region kind its family must claim, the module body with {placeholders}, the inputs, the
dtypes it is drawn in). Placeholders: {R} rows, {C} columns (the reduced or feature dim), {N} a second size, {B} bags
or a batch, {DT} the dtype, {EPS}.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
FLOATS = ("float32", "bfloat16", "float16")
F32 = ("float32",)

SOFTMAX = "row_reduction"
FORMULATIONS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    # --- softmax, log-softmax, logsumexp ------------------------------------------------------------------------------
    "softmax_functional": (SOFTMAX, "def forward(self, x):\n    return F.softmax(x, dim=-1)", "[x({R}, {C})]", FLOATS),
    "softmax_method": (SOFTMAX, "def forward(self, x):\n    return x.softmax(-1)", "[x({R}, {C})]", FLOATS),
    "softmax_module": (SOFTMAX, "def __init__(self):\n    super().__init__()\n    self.s = nn.Softmax(dim=1)\n"
                       "def forward(self, x):\n    return self.s(x)", "[x({R}, {C})]", F32),
    "softmax_amax": (SOFTMAX, "def forward(self, x):\n    e = torch.exp(x - x.amax(dim=-1, keepdim=True))\n"
                     "    return e / e.sum(dim=-1, keepdim=True)", "[x({R}, {C})]", F32),
    "softmax_max_values": (SOFTMAX, "def forward(self, x):\n    m = torch.max(x, dim=1, keepdim=True).values\n"
                           "    e = (x - m).exp()\n    return e / torch.sum(e, 1, keepdim=True)", "[x({R}, {C})]", F32),
    "softmax_no_keepdim": (SOFTMAX, "def forward(self, x):\n    e = torch.exp(x - x.max(-1)[0].unsqueeze(-1))\n"
                           "    return e / e.sum(-1).unsqueeze(-1)", "[x({R}, {C})]", F32),
    "softmax_from_log": (SOFTMAX, "def forward(self, x):\n    return torch.exp(F.log_softmax(x, dim=-1))",
                         "[x({R}, {C})]", F32),
    "softmax_3d": (SOFTMAX, "def forward(self, x):\n    return torch.softmax(x, dim=2)", "[x(3, {R}, {C})]", FLOATS),
    "log_softmax_functional": (SOFTMAX, "def forward(self, x):\n    return F.log_softmax(x, dim=-1)",
                               "[x({R}, {C})]", FLOATS),
    "log_softmax_lse": (SOFTMAX, "def forward(self, x):\n    return x - torch.logsumexp(x, dim=-1, keepdim=True)",
                        "[x({R}, {C})]", F32),
    "logsumexp": (SOFTMAX, "def forward(self, x):\n    return torch.logsumexp(x, dim=1)", "[x({R}, {C})]", F32),
    "logsumexp_manual": (SOFTMAX, "def forward(self, x):\n    m = x.amax(-1, keepdim=True)\n"
                         "    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)",
                         "[x({R}, {C})]", F32),
    # --- norms --------------------------------------------------------------------------------------------------------
    "layernorm_module": (SOFTMAX, "def __init__(self):\n    super().__init__()\n    self.n = nn.LayerNorm({C})\n"
                         "def forward(self, x):\n    return self.n(x)", "[x({R}, {C})]", F32),
    "layernorm_functional": (SOFTMAX, "def __init__(self):\n    super().__init__()\n"
                             "    self.w = nn.Parameter(torch.randn({C}))\n    self.b = nn.Parameter(torch.randn({C}))\n"
                             "def forward(self, x):\n    return F.layer_norm(x, ({C},), self.w, self.b, {EPS})",
                             "[x(2, {R}, {C})]", F32),
    "layernorm_var": (SOFTMAX, "def forward(self, x):\n    mu = x.mean(-1, keepdim=True)\n"
                      "    var = x.var(-1, unbiased=False, keepdim=True)\n    return (x - mu) / torch.sqrt(var + {EPS})",
                      "[x({R}, {C})]", F32),
    "layernorm_centered_square": (SOFTMAX, "def forward(self, x):\n    xc = x - x.mean(dim=-1, keepdim=True)\n"
                                  "    return xc * torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + {EPS})",
                                  "[x({R}, {C})]", F32),
    "rmsnorm_rsqrt": (SOFTMAX, "def __init__(self):\n    super().__init__()\n    self.w = nn.Parameter(torch.randn({C}))\n"
                      "def forward(self, x):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + {EPS}) * self.w",
                      "[x({R}, {C})]", FLOATS),
    "rmsnorm_sqrt": (SOFTMAX, "def forward(self, x):\n    return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True)"
                     " + {EPS})", "[x({R}, {C})]", F32),
    "groupnorm_spatial": (SOFTMAX, "def __init__(self):\n    super().__init__()\n    self.n = nn.GroupNorm(4, 16)\n"
                          "def forward(self, x):\n    return torch.tanh(self.n(torch.relu(x)))",
                          "[x({B}, 16, 5, {N})]", FLOATS),
    "groupnorm_3d_no_affine": (SOFTMAX, "def forward(self, x):\n    return F.group_norm(x, 2, eps={EPS}) * 2.0",
                               "[x({B}, 6, 3, 4, {N})]", F32),
    "rmsnorm_float": (SOFTMAX, "def __init__(self):\n    super().__init__()\n    self.w = nn.Parameter(torch.ones({C}))\n"
                      "def forward(self, x):\n    h = x.float()\n"
                      "    h = h * h.square().mean(-1, keepdim=True).add({EPS}).rsqrt()\n    return (h * self.w).to(x.dtype)",
                      "[x({R}, {C})]", ("bfloat16",)),
    "l2_normalize": (SOFTMAX, "def forward(self, x):\n    return F.normalize(x, dim=-1)", "[x({R}, {C})]", F32),
    "l2_norm_manual": (SOFTMAX, "def forward(self, x):\n    return x / x.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-12)",
                       "[x({R}, {C})]", F32),
    # --- lone reductions ----------------------------------------------------------------------------------------------
    "row_sum": (SOFTMAX, "def forward(self, x):\n    return x.sum(-1)", "[x({R}, {C})]", F32),
    "row_mean_keepdim": (SOFTMAX, "def forward(self, x):\n    return torch.mean(x, dim=1, keepdim=True) * 2",
                         "[x({R}, {C})]", F32),
    "row_sum_einsum": (SOFTMAX, "def forward(self, x):\n    return torch.einsum('ij->i', x)", "[x({R}, {C})]", F32),
    "row_max_values": (SOFTMAX, "def forward(self, x):\n    return x.max(dim=-1).values + x.min(dim=-1).values",
                       "[x({R}, {C})]", F32),
    "row_sum_matmul_ones": (SOFTMAX, "def forward(self, x):\n    return (x @ torch.ones(x.shape[1], 1, dtype=x.dtype)).squeeze(1)",
                            "[x({R}, {C})]", F32),
    "row_amax_no_keepdim": (SOFTMAX, "def forward(self, x):\n    return torch.amax(x, dim=1) * 2.0", "[x({R}, {C})]", FLOATS),
    "column_sum_einsum": ("column_reduction", "def forward(self, x):\n    return torch.einsum('ij->j', x)",
                          "[x({C}, {R})]", F32),
    "column_sum": ("column_reduction", "def forward(self, x):\n    return x.sum(dim=0)", "[x({C}, {R})]", F32),
    "column_mean": ("column_reduction", "def forward(self, x):\n    return torch.mean(x, 0, keepdim=True)",
                    "[x({C}, {R})]", F32),
    # --- cross-entropy ------------------------------------------------------------------------------------------------
    "cross_entropy_functional": (SOFTMAX, "def forward(self, x, t):\n    return F.cross_entropy(x, t)",
                                 "[x({R}, {C}), torch.randint(0, {C}, ({R},))]", F32),
    "cross_entropy_nll": (SOFTMAX, "def forward(self, x, t):\n    return F.nll_loss(F.log_softmax(x, dim=1), t)",
                          "[x({R}, {C}), torch.randint(0, {C}, ({R},))]", F32),
    "cross_entropy_gather": (SOFTMAX, "def forward(self, x, t):\n    lp = torch.log_softmax(x, dim=-1)\n"
                             "    return -lp.gather(1, t.unsqueeze(1)).squeeze(1)",
                             "[x({R}, {C}), torch.randint(0, {C}, ({R},))]", F32),
    # --- pointwise ----------------------------------------------------------------------------------------------------
    "gelu_functional": ("pointwise", "def forward(self, x):\n    return F.gelu(x)", "[x({R}, {C})]", FLOATS),
    "gelu_tanh_manual": ("pointwise", "def forward(self, x):\n"
                         "    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))",
                         "[x({R}, {C})]", F32),
    "gelu_erf_manual": ("pointwise", "def forward(self, x):\n    return x * 0.5 * (1.0 + torch.erf(x / 1.41421356))",
                        "[x({R}, {C})]", F32),
    "silu_functional": ("pointwise", "def forward(self, x):\n    return F.silu(x)", "[x({R}, {C})]", FLOATS),
    "silu_sigmoid": ("pointwise", "def forward(self, x):\n    return x * torch.sigmoid(x)", "[x({R}, {C})]", F32),
    "silu_exp": ("pointwise", "def forward(self, x):\n    return x / (1 + torch.exp(-x))", "[x({R}, {C})]", F32),
    "scale_bias_relu": ("pointwise", "def __init__(self):\n    super().__init__()\n"
                        "    self.s = nn.Parameter(torch.randn({C}))\n    self.b = nn.Parameter(torch.randn({C}))\n"
                        "def forward(self, x):\n    return torch.relu(x * self.s + self.b)", "[x({R}, {C})]", FLOATS),
    "scale_bias_clamp": ("pointwise", "def __init__(self):\n    super().__init__()\n"
                         "    self.s = nn.Parameter(torch.randn({C}))\n"
                         "def forward(self, x):\n    return (x * self.s + 1).clamp(min=0)", "[x({R}, {C})]", F32),
    "leaky_relu_where": ("pointwise", "def forward(self, x):\n    return torch.where(x > 0, x, 0.01 * x)",
                         "[x({R}, {C})]", F32),
    "broadcast_gate": ("pointwise", "def forward(self, x, g):\n    return x * torch.sigmoid(g) + x",
                       "[x({R}, {C}), x({R}, 1)]", FLOATS),
    # --- jagged and embedding bags ------------------------------------------------------------------------------------
    "jagged_sum_offsets": ("segment_reduction", "def forward(self, v, offsets):\n"
                           "    return torch.segment_reduce(v, 'sum', offsets=offsets)", "JAGGED_OFFSETS", F32),
    "jagged_mean_index_add": ("segment_reduction", "def forward(self, v, lengths):\n"
                              "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                              "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype)\n"
                              "    out.index_add_(0, ids, v)\n"
                              "    return out / lengths.clamp(min=1).unsqueeze(1).to(v.dtype)", "JAGGED_LENGTHS", F32),
    "jagged_sum_scatter_add": ("segment_reduction", "def forward(self, v, lengths):\n"
                               "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                               "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype)\n"
                               "    return out.scatter_add(0, ids.unsqueeze(1).expand(-1, v.shape[1]), v)",
                               "JAGGED_LENGTHS", F32),
    "jagged_sum_index_put": ("segment_reduction", "def forward(self, v, lengths):\n"
                             "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                             "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype)\n"
                             "    return out.index_put((ids,), v, accumulate=True)", "JAGGED_LENGTHS", F32),
    "jagged_mean_lengths_from_offsets": ("segment_reduction", "def forward(self, v, offsets):\n"
                                         "    lengths = offsets[1:] - offsets[:-1]\n"
                                         "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                                         "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype)\n"
                                         "    out.index_add_(0, ids, v)\n"
                                         "    return out / lengths.clamp(min=1).unsqueeze(1).to(v.dtype)",
                                         "JAGGED_OFFSETS", F32),
    "jagged_sum_lengths": ("segment_reduction", "def forward(self, v, lengths):\n"
                           "    return torch.segment_reduce(v, 'sum', lengths=lengths)", "JAGGED_LENGTHS", F32),
    "jagged_sum_bucketize": ("segment_reduction", "def forward(self, v, offsets):\n"
                             "    ids = torch.bucketize(torch.arange(v.shape[0]), offsets[1:], right=True)\n"
                             "    out = torch.zeros(offsets.numel() - 1, v.shape[1], dtype=v.dtype)\n"
                             "    return out.index_add(0, ids, v)", "JAGGED_OFFSETS", F32),
    "jagged_mean_scatter_reduce": ("segment_reduction", "def forward(self, v, lengths):\n"
                                   "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                                   "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype)\n"
                                   "    idx = ids.unsqueeze(1).expand(-1, v.shape[1])\n"
                                   "    return out.scatter_reduce(0, idx, v, 'mean', include_self=False)",
                                   "JAGGED_LENGTHS", F32),
    "jagged_mean_bincount": ("segment_reduction", "def forward(self, v, lengths):\n"
                             "    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)\n"
                             "    out = torch.zeros(lengths.numel(), v.shape[1], dtype=v.dtype).index_add_(0, ids, v)\n"
                             "    n = torch.bincount(ids, minlength=lengths.numel()).clamp(min=1)\n"
                             "    return out / n.unsqueeze(1).to(v.dtype)", "JAGGED_LENGTHS", F32),
    "jagged_sum_cumsum_offsets": ("segment_reduction", "def forward(self, v, lengths):\n"
                                  "    offsets = torch.cumsum(lengths, 0)\n"
                                  "    ids = torch.searchsorted(offsets, torch.arange(v.shape[0]), right=True)\n"
                                  "    out = v.new_zeros(lengths.numel(), v.shape[1])\n"
                                  "    return out.index_add_(0, ids, v)", "JAGGED_LENGTHS", F32),
    "jagged_mean_searchsorted": ("segment_reduction", "def forward(self, v, offsets):\n"
                                 "    pos = torch.arange(v.shape[0])\n"
                                 "    ids = torch.searchsorted(offsets[1:], pos, right=True)\n"
                                 "    out = torch.zeros(offsets.numel() - 1, v.shape[1], dtype=v.dtype)\n"
                                 "    out.index_add_(0, ids, v)\n"
                                 "    n = (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1)\n"
                                 "    return out / n", "JAGGED_OFFSETS", F32),
    "embedding_bag_module": ("segment_reduction", "def __init__(self):\n    super().__init__()\n"
                             "    self.e = nn.EmbeddingBag(97, {C}, mode='sum')\n"
                             "def forward(self, idx, offsets):\n    return self.e(idx, offsets)", "BAGS", F32),
    "embedding_bag_functional_mean": ("segment_reduction", "def __init__(self):\n    super().__init__()\n"
                                      "    self.w = nn.Parameter(torch.randn(97, {C}))\n"
                                      "def forward(self, idx, offsets):\n"
                                      "    return F.embedding_bag(idx, self.w, offsets, mode='mean')", "BAGS", F32),
    # --- matmul-shaped ------------------------------------------------------------------------------------------------
    "linear_gelu": ("matmul", "def __init__(self):\n    super().__init__()\n    self.fc = nn.Linear({C}, {N})\n"
                    "def forward(self, x):\n    return F.gelu(self.fc(x))", "[x({R}, {C})]", FLOATS),
    "matmul_t_bias": ("matmul", "def __init__(self):\n    super().__init__()\n"
                      "    self.w = nn.Parameter(torch.randn({N}, {C}) / {C} ** 0.5)\n"
                      "    self.b = nn.Parameter(torch.randn({N}))\n"
                      "def forward(self, x):\n    return torch.relu(x @ self.w.t() + self.b)", "[x({R}, {C})]", F32),
    "linear_functional": ("matmul", "def __init__(self):\n    super().__init__()\n"
                          "    self.w = nn.Parameter(torch.randn({N}, {C}) / {C} ** 0.5)\n"
                          "def forward(self, x):\n    return torch.tanh(F.linear(x, self.w))", "[x({R}, {C})]", F32),
    "addmm_scale": ("matmul", "def __init__(self):\n    super().__init__()\n"
                    "    self.w = nn.Parameter(torch.randn({C}, {N}) / {C} ** 0.5)\n"
                    "    self.b = nn.Parameter(torch.randn({N}))\n"
                    "def forward(self, x):\n    return torch.addmm(self.b, x, self.w) * 0.5", "[x({R}, {C})]", F32),
    "einsum_linear": ("matmul", "def __init__(self):\n    super().__init__()\n"
                      "    self.w = nn.Parameter(torch.randn({N}, {C}) / {C} ** 0.5)\n"
                      "def forward(self, x):\n    return torch.sigmoid(torch.einsum('bk,nk->bn', x, self.w))",
                      "[x({R}, {C})]", F32),
    "swiglu": ("dual_gemm", "def __init__(self):\n    super().__init__()\n"
               "    self.w1 = nn.Linear({C}, {N}, bias=False)\n    self.w3 = nn.Linear({C}, {N}, bias=False)\n"
               "def forward(self, x):\n    return F.silu(self.w1(x)) * self.w3(x)", "[x({R}, {C})]", F32),
    "swiglu_chunked": ("dual_gemm", "def __init__(self):\n    super().__init__()\n"
                       "    self.w13 = nn.Linear({C}, 2 * {N}, bias=False)\n"
                       "def forward(self, x):\n    a, b = self.w13(x).chunk(2, dim=-1)\n    return F.silu(a) * b",
                       "[x({R}, {C})]", F32),
    "dcn_cross": ("dcn_cross", "def __init__(self):\n    super().__init__()\n    self.fc = nn.Linear({C}, {C})\n"
                  "def forward(self, x0):\n    return x0 * self.fc(x0) + x0", "[x({R}, {C})]", F32),
    "linear_softmax_rows": ("matmul_reduction", "def __init__(self):\n    super().__init__()\n"
                            "    self.gate = nn.Linear({C}, {N})\n"
                            "def forward(self, x):\n    return torch.softmax(self.gate(x), dim=-1)",
                            "[x(1024 + {R}, {C})]", F32),
    "towers_baddbmm": ("batched_matmul", "def __init__(self):\n    super().__init__()\n"
                       "    self.w1 = nn.Parameter(torch.randn(3, {C}, 32) * 0.1)\n"
                       "    self.b1 = nn.Parameter(torch.randn(3, 1, 32))\n"
                       "    self.w2 = nn.Parameter(torch.randn(3, 32, {N}) * 0.1)\n"
                       "def forward(self, x):\n"
                       "    return torch.bmm(torch.relu(torch.baddbmm(self.b1, x, self.w1)), self.w2)",
                       "[x(3, {R}, {C})]", F32),
    "towers_matmul_broadcast": ("batched_matmul", "def __init__(self):\n    super().__init__()\n"
                                "    self.w1 = nn.Parameter(torch.randn(4, {C}, 16) / {C} ** 0.5)\n"
                                "    self.w2 = nn.Parameter(torch.randn(4, 16, 1) * 0.2)\n"
                                "def forward(self, x):\n    h = torch.relu(torch.matmul(x.unsqueeze(0), self.w1))\n"
                                "    return torch.sigmoid(torch.matmul(h, self.w2)).squeeze(-1).transpose(0, 1)",
                                "[x({R}, {C})]", F32),
    # --- feature interactions -----------------------------------------------------------------------------------------
    "dlrm_tril_indices": ("pairwise_interaction", "def forward(self, dense, sparse):\n"
                          "    t = torch.cat([dense.unsqueeze(1), sparse], dim=1)\n"
                          "    z = torch.bmm(t, t.transpose(1, 2))\n"
                          "    i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)\n"
                          "    return torch.cat([dense, z[:, i, j]], dim=1)", "[x({R}, 16), x({R}, 5, 16)]", F32),
    "fm_second_order": ("pairwise_interaction", "def forward(self, v):\n"
                        "    return 0.5 * (v.sum(1) ** 2 - (v * v).sum(1)).sum(1, keepdim=True)",
                        "[x({R}, 7, 16)]", F32),
    # --- attention ----------------------------------------------------------------------------------------------------
    "attention_sdpa": ("attention", "def forward(self, q, k, v):\n"
                       "    return F.scaled_dot_product_attention(q, k, v)",
                       "[x(2, 3, {R}, 16), x(2, 3, {N}, 16), x(2, 3, {N}, 16)]", F32),
    "attention_manual": ("attention", "def forward(self, q, k, v):\n"
                         "    s = torch.matmul(q, k.transpose(-2, -1)) / 4.0\n"
                         "    return torch.matmul(torch.softmax(s, dim=-1), v)",
                         "[x(2, 3, {R}, 16), x(2, 3, {N}, 16), x(2, 3, {N}, 16)]", F32),
    "attention_causal_mask": ("attention", "def forward(self, q, k, v):\n"
                              "    s = q @ k.transpose(-1, -2) * 0.25\n"
                              "    mask = torch.tril(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool))\n"
                              "    s = s.masked_fill(~mask, float('-inf'))\n    return s.softmax(-1) @ v",
                              "[x(2, 3, {R}, 16), x(2, 3, {R}, 16), x(2, 3, {R}, 16)]", F32),
}

INPUTS = {
    "JAGGED_OFFSETS": "lengths = torch.randint(0, 6, ({B},))\n    offsets = torch.cat([torch.zeros(1, dtype=torch.long), "
                      "lengths.cumsum(0)])\n    return [x(int(lengths.sum()), {C}), offsets]",
    "JAGGED_LENGTHS": "lengths = torch.randint(0, 6, ({B},))\n    return [x(int(lengths.sum()), {C}), lengths]",
    "BAGS": "idx = torch.randint(0, 97, (3 * {B},))\n"
            "    offsets = torch.sort(torch.randint(0, 3 * {B}, ({B},))).values\n    offsets[0] = 0\n"
            "    return [idx, offsets]",
}
ROWS = (1, 3, 17, 33)
COLS = (7, 40, 100, 257)
SECOND = (5, 24, 33)


@dataclass(frozen=True)
class ZooProblem:
    name: str
    formulation: str
    kind: str  # the region kind its family must claim
    dtype: str
    source: str


def _module(body: str) -> str:
    lines = body.splitlines()
    return "class Model(nn.Module):\n" + "\n".join(("    " + line) if line else line for line in lines) + "\n"


def zoo(seed: int = 0) -> list[ZooProblem]:
    """One problem per formulation, its sizes and dtype drawn with ``seed``."""
    rng = random.Random(seed)
    out = []
    for name, (kind, body, inputs, dtypes) in FORMULATIONS.items():
        sizes = {"R": rng.choice(ROWS), "C": rng.choice(COLS), "N": rng.choice(SECOND), "B": rng.choice((1, 5, 9)),
                 "EPS": rng.choice((1e-5, 1e-6))}
        dtype = rng.choice(dtypes)
        make = f"def x(*shape):\n    return torch.randn(*shape).to(torch.{dtype})\n\n\n"
        get = (f"def get_inputs():\n    {INPUTS[inputs]}\n" if inputs in INPUTS
               else f"def get_inputs():\n    return {inputs}\n").format(**sizes)
        text = body.format(**sizes)
        if "def __init__" in text:  # the module's weights in the problem's dtype
            text = text.replace("\ndef forward", f"\n    self.to(torch.{dtype})\ndef forward", 1)
        source = (HEAD + "\n\n" + make + _module(text) + "\n\n" + get
                  + "\n\ndef get_init_inputs():\n    return []\n")
        tag = "x".join(str(sizes[k]) for k in ("R", "C"))
        out.append(ZooProblem(f"{name}-{dtype}-{tag}", name, kind, dtype, source))
    return out
