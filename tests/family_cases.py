"""Small problems, one or more for each template family and its rewrites, shared by the family tests and the golden
kernels (CPU, Triton interpreter)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, Result, TimingConfig
from kernelevolve.problem import Problem, load_problem

HEAD = "import torch, torch.nn as nn, torch.nn.functional as F\n"
# name: (a region kind the plan must hold, the problem after HEAD)
CASES: dict[str, tuple[str, str]] = {
    "pointwise": ("pointwise", """
        class Model(nn.Module):
            def forward(self, x, y, z):
                return x * torch.sigmoid(y) + z
        def get_inputs(): return [torch.randn(33, 40), torch.randn(33, 40), torch.randn(1, 40)]
        def get_init_inputs(): return []
    """),
    "softmax_functional": ("row_reduction", """
        class Model(nn.Module):
            def forward(self, x):
                return F.softmax(x, dim=-1)
        def get_inputs(): return [torch.randn(17, 300)]
        def get_init_inputs(): return []
    """),
    "softmax_manual": ("row_reduction", """
        class Model(nn.Module):
            def forward(self, x):
                e = torch.exp(x - x.max(dim=1, keepdim=True).values)
                return e / e.sum(dim=1, keepdim=True)
        def get_inputs(): return [torch.randn(17, 300)]
        def get_init_inputs(): return []
    """),
    "layernorm_module": ("row_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln = nn.LayerNorm(96)
            def forward(self, x):
                return self.ln(x)
        def get_inputs(): return [torch.randn(4, 5, 96)]
        def get_init_inputs(): return []
    """),
    "cross_entropy": ("row_reduction", """
        class Model(nn.Module):
            def forward(self, x, t):
                return F.cross_entropy(x, t)
        def get_inputs(): return [torch.randn(9, 500), torch.randint(0, 500, (9,))]
        def get_init_inputs(): return []
    """),
    "column_sum": ("column_reduction", """
        class Model(nn.Module):
            def forward(self, x):
                return x.sum(dim=0)
        def get_inputs(): return [torch.randn(200, 24)]
        def get_init_inputs(): return []
    """),
    "linear_gelu": ("matmul", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(40, 24)
            def forward(self, x):
                return F.gelu(self.fc(x))
        def get_inputs(): return [torch.randn(3, 11, 40)]
        def get_init_inputs(): return []
    """),
    "linear_softmax": ("matmul_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.gate = nn.Linear(40, 33)
            def forward(self, x):
                return torch.softmax(self.gate(x), dim=-1)
        def get_inputs(): return [torch.randn(1030, 40)]
        def get_init_inputs(): return []
    """),
    "linear_written_out": ("matmul", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(24, 40))
                self.b = nn.Parameter(torch.randn(24))
            def forward(self, x):
                return F.gelu(x @ self.w.t() + self.b)
        def get_inputs(): return [torch.randn(33, 40)]
        def get_init_inputs(): return []
    """),
    "swiglu": ("dual_gemm", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w1 = nn.Linear(32, 48, bias=False)
                self.w3 = nn.Linear(32, 48, bias=False)
            def forward(self, x):
                return F.silu(self.w1(x)) * self.w3(x)
        def get_inputs(): return [torch.randn(19, 32)]
        def get_init_inputs(): return []
    """),
    "towers": ("batched_matmul", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w1 = nn.Parameter(torch.randn(3, 32, 32) * 0.1)
                self.b1 = nn.Parameter(torch.randn(3, 1, 32))
                self.w2 = nn.Parameter(torch.randn(3, 32, 16) * 0.1)
            def forward(self, x):
                return torch.bmm(torch.relu(torch.baddbmm(self.b1, x, self.w1)), self.w2)
        def get_inputs(): return [torch.randn(3, 21, 32)]
        def get_init_inputs(): return []
    """),
    "dcn_cross": ("dcn_cross", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(32, 32)
            def forward(self, x0):
                return x0 * self.fc(x0) + x0
        def get_inputs(): return [torch.randn(23, 32)]
        def get_init_inputs(): return []
    """),
    "embedding_bag": ("segment_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.EmbeddingBag(100, 24, mode="sum")
            def forward(self, idx, offsets):
                return self.emb(idx, offsets)
        def get_inputs():  # random bag sizes (empty ones too) with a fixed total: the shapes stay put
            cuts = torch.sort(torch.randint(0, 30, (8,))).values
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
            return [torch.randint(0, 100, (30,)), offsets]
        def get_init_inputs(): return []
    """),
    "embedding_bags_grouped": ("segment_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.tables = nn.ModuleList(nn.EmbeddingBag(n, 24, mode="sum") for n in (100, 60, 80))
            def forward(self, i0, o0, i1, o1, i2, o2):
                return torch.stack([t(i, o) for t, i, o in zip(self.tables, (i0, i1, i2), (o0, o1, o2))], 1)
        def get_inputs():  # three bags of eight, each table with its own indices and random bag sizes
            out = []
            for rows in (100, 60, 80):
                cuts = torch.sort(torch.randint(0, 30, (7,))).values
                out += [torch.randint(0, rows, (30,)), torch.cat([torch.zeros(1, dtype=torch.long), cuts])]
            return out
        def get_init_inputs(): return []
    """),
    "dlrm_interaction": ("pairwise_interaction", """
        class Model(nn.Module):
            def forward(self, dense, sparse):
                t = torch.cat([dense.unsqueeze(1), sparse], dim=1)
                z = torch.bmm(t, t.transpose(1, 2))
                i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
                return torch.cat([dense, z[:, i, j]], dim=1)
        def get_inputs(): return [torch.randn(7, 16), torch.randn(7, 5, 16)]
        def get_init_inputs(): return []
    """),
    "layernorm_manual": ("row_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(96))
                self.b = nn.Parameter(torch.randn(96))
            def forward(self, x):
                mu = x.mean(-1, keepdim=True)
                var = ((x - mu) ** 2).mean(-1, keepdim=True)
                return (x - mu) / torch.sqrt(var + 1e-5) * self.w + self.b
        def get_inputs(): return [torch.randn(4, 5, 96)]
        def get_init_inputs(): return []
    """),
    "embedding_bag_written_out": ("segment_reduction", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(100, 24))
            def forward(self, idx, offsets):
                rows = self.weight.index_select(0, idx)
                bag = torch.searchsorted(offsets, torch.arange(idx.numel()), right=True) - 1
                sums = torch.zeros(offsets.numel(), rows.shape[1]).index_add_(0, bag, rows)
                return sums / torch.bincount(bag, minlength=offsets.numel()).clamp(min=1).unsqueeze(1)
        def get_inputs():
            cuts = torch.sort(torch.randint(0, 30, (8,))).values
            return [torch.randint(0, 100, (30,)), torch.cat([torch.zeros(1, dtype=torch.long), cuts])]
        def get_init_inputs(): return []
    """),
    "dlrm_einsum": ("pairwise_interaction", """
        class Model(nn.Module):
            def forward(self, dense, sparse):
                t = torch.cat([dense.unsqueeze(1), sparse], dim=1)
                z = torch.einsum("bid,bjd->bij", t, t)
                i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
                return torch.cat([dense, z[:, i, j]], dim=1)
        def get_inputs(): return [torch.randn(7, 16), torch.randn(7, 5, 16)]
        def get_init_inputs(): return []
    """),
    "fm_second_order": ("pairwise_interaction", """
        class Model(nn.Module):
            def forward(self, x):
                return 0.5 * (x.sum(1) ** 2 - (x * x).sum(1)).sum(1, keepdim=True)
        def get_inputs(): return [torch.randn(13, 7, 16)]
        def get_init_inputs(): return []
    """),
    "hstu": ("attention", """
        class Model(nn.Module):
            def forward(self, q, k, v):
                s = q.shape[-2]
                mask = torch.tril(torch.ones(s, s))
                return (F.silu(q @ k.transpose(-2, -1)) / s * mask) @ v
        def get_inputs(): return [torch.randn(1, 2, 300, 16) for _ in range(3)]
        def get_init_inputs(): return []
    """),
    "attention_manual": ("attention", """
        class Model(nn.Module):
            def forward(self, q, k, v):
                s = q @ k.transpose(-2, -1) / 4.0
                mask = torch.tril(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool))
                return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        def get_inputs(): return [torch.randn(1, 2, 37, 16) for _ in range(3)]
        def get_init_inputs(): return []
    """),
    "masked_reverse_cumsum": ("scan", """
        class Model(nn.Module):
            def forward(self, x, mask):
                return torch.cumsum((x * mask).flip(1), dim=1).flip(1)
        def get_inputs(): return [torch.randn(33, 300), torch.randint(0, 2, (33, 300)).bool()]
        def get_init_inputs(): return []
    """),
    "cumprod_inner_dim": ("scan", """
        class Model(nn.Module):
            def forward(self, x):
                return torch.cumprod(x * 0.5 + 0.75, dim=1)
        def get_inputs(): return [torch.rand(3, 40, 45)]
        def get_init_inputs(): return []
    """),
    "avg_pool_padded": ("pool", """
        class Model(nn.Module):
            def forward(self, x):
                return F.avg_pool2d(torch.relu(x), 3, stride=2, padding=1, count_include_pad=False)
        def get_inputs(): return [torch.randn(2, 3, 17, 20)]
        def get_init_inputs(): return []
    """),
    "max_pool_3d": ("pool", """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.pool = nn.MaxPool3d(3, stride=2, padding=1, dilation=2, ceil_mode=True)
            def forward(self, x):
                return self.pool(x * 0.5)
        def get_inputs(): return [torch.randn(1, 2, 9, 12, 11)]
        def get_init_inputs(): return []
    """),
    "attention_sdpa": ("attention", """
        class Model(nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        def get_inputs(): return [torch.randn(1, 2, 37, 16) for _ in range(3)]
        def get_init_inputs(): return []
    """),
}
FAST = TimingConfig(budget_ms=5, warmup_ms=1, max_reps=3)


def write_problem(tmp_path: Path, name: str) -> Problem:
    """The problem file of case ``name``, written under ``tmp_path`` and loaded."""
    path = tmp_path / f"{name}.py"
    path.write_text(HEAD + textwrap.dedent(CASES[name][1]))
    return load_problem(path)


def judge(problem: Problem, candidate: Candidate, tmp_path: Path) -> Result:
    """The harness's verdict on ``candidate`` on the CPU, timed only briefly."""
    config = EvalConfig(device="cpu", timeout_s=300, timing=FAST)
    return Evaluator(problem, config, tmp_path / "work").evaluate(candidate)
