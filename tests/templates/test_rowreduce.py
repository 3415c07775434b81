import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.templates.rowreduce import RowReduceTemplate  # noqa: E402
from tests.templates.rendering import captured, run_match  # noqa: E402

LAYERNORM_SOFTMAX = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(70)
    def forward(self, x):
        return F.softmax(self.ln(x), -1)
def get_inputs(): return [torch.randn(2, 9, 70)]
def get_init_inputs(): return []
"""
MANUAL_LAYERNORM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(70))
        self.b = nn.Parameter(torch.randn(70))
    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + 1e-5) * self.w + self.b
        e = torch.exp(y - y.max(dim=-1, keepdim=True).values)
        return e / e.sum(-1, keepdim=True)
def get_inputs(): return [torch.randn(2, 9, 70)]
def get_init_inputs(): return []
"""
RMSNORM_RESIDUAL = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(70))
    def forward(self, x, r):
        h = x + r
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w, h
def get_inputs(): return [torch.randn(13, 70).bfloat16(), torch.randn(13, 70).bfloat16()]
def get_init_inputs(): return []
"""
CROSS_ENTROPY = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x, t):
        return F.cross_entropy(x, t)
def get_inputs(): return [torch.randn(13, 300), torch.randint(0, 300, (13,))]
def get_init_inputs(): return []
"""
COLUMNS = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x.sum(0) * 2, torch.log_softmax(x, 0)
def get_inputs(): return [torch.randn(300, 33)]
def get_init_inputs(): return []
"""
NO_REDUCTION = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
def get_inputs(): return [torch.randn(30, 33)]
def get_init_inputs(): return []
"""
SCHEDULES = [{"PERSISTENT": True, "BLOCK_R": 4}, {"PERSISTENT": False, "BLOCK_R": 2, "BLOCK_C": 32},
             {"PERSISTENT": False, "BLOCK_R": 2, "BLOCK_C": 16, "PARTS": 3}]  # each row shared by 3 programs


def _one(graph):
    matches = RowReduceTemplate().find(graph, set())
    assert len(matches) == 1, [m.key for m in matches]
    return matches[0]


@pytest.mark.parametrize("source", [LAYERNORM_SOFTMAX, MANUAL_LAYERNORM], ids=["modules", "manual"])
@pytest.mark.parametrize("config", SCHEDULES, ids=["persistent", "looped", "parts"])
def test_layernorm_softmax_is_one_region_however_written(tmp_path, source, config):
    g = captured(tmp_path, source)
    m = _one(g)
    assert m.kind == "row_reduction"
    assert [n for n in g.calls() if n not in m.nodes] == []  # the whole graph fuses into one kernel
    run_match(RowReduceTemplate(), g, m, config)


@pytest.mark.parametrize("config", SCHEDULES, ids=["persistent", "looped", "parts"])
def test_rmsnorm_with_residual_returns_both_outputs_in_bf16(tmp_path, config):
    g = captured(tmp_path, RMSNORM_RESIDUAL)
    m = _one(g)
    assert len(m.outputs) == 2 and m.outputs[0].meta["val"].dtype == torch.bfloat16  # the fp32 weight promotes the other
    run_match(RowReduceTemplate(), g, m, config, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("config", SCHEDULES, ids=["persistent", "looped", "parts"])
def test_cross_entropy_fuses_the_target_pick(tmp_path, config):
    g = captured(tmp_path, CROSS_ENTROPY)
    m = _one(g)
    assert "gather" in {n.target._schema.name.split("::")[-1] for n in m.nodes if hasattr(n.target, "_schema")}
    run_match(RowReduceTemplate(), g, m, config)


def test_column_reductions_reading_one_input_share_a_kernel(tmp_path):
    g = captured(tmp_path, COLUMNS)
    matches = RowReduceTemplate().find(g, set())
    assert [m.kind for m in matches] == ["column_reduction"] and len(matches[0].outputs) == 2
    for m in matches:
        for config in ({"PERSISTENT": True, "BLOCK_R": 16}, {"PERSISTENT": False, "BLOCK_R": 8, "BLOCK_C": 64}):
            run_match(RowReduceTemplate(), g, m, config)


def test_no_reduction_no_match(tmp_path):
    assert RowReduceTemplate().find(captured(tmp_path, NO_REDUCTION), set()) == []


def test_taken_nodes_are_left_alone(tmp_path):
    g = captured(tmp_path, LAYERNORM_SOFTMAX)
    assert RowReduceTemplate().find(g, set(g.calls())) == []

COLUMN_SUM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x.sum(0)
def get_inputs(): return [torch.randn(300, 33)]
def get_init_inputs(): return []
"""


@pytest.mark.parametrize("split", [1, 3, 8])
def test_a_lone_sum_splits_along_the_reduced_dim(tmp_path, split):
    g = captured(tmp_path, COLUMN_SUM)
    m = _one(g)
    assert "SPLIT" in RowReduceTemplate().space(m, "cpu")
    run_match(RowReduceTemplate(), g, m, {"PERSISTENT": False, "SPLIT": split, "BLOCK_C": 16, "BLOCK_R": 16})


def test_a_sum_with_an_epilogue_does_not_split(tmp_path):
    (m,) = RowReduceTemplate().find(captured(tmp_path, COLUMNS), set())
    assert "SPLIT" not in RowReduceTemplate().space(m, "cpu")


def test_a_sibling_reading_the_same_input_joins_the_kernel(tmp_path):
    """Cross-entropy's count of non-ignored targets reads only the targets: it becomes one more output."""
    g = captured(tmp_path, CROSS_ENTROPY)
    m = _one(g)
    assert len(m.outputs) == 2
    run_match(RowReduceTemplate(), g, m, {"PERSISTENT": False, "BLOCK_C": 64})


WIDE_ROWS = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)
def get_inputs(): return [torch.randn(64, 4096)]
def get_init_inputs(): return []
"""


def test_a_tile_that_would_spill_is_not_rendered_and_the_region_stays_usable(tmp_path):
    """16 x 4096 values on one warp would be 2048 a thread: not worth ptxas's minutes. The proposer skips that
    configuration only; the defaults and a tile that fits still render."""
    from kernelevolve.problem import load_problem
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.templates.base import HopelessConfig

    g = captured(tmp_path, WIDE_ROWS)
    m = _one(g)
    spills = {"PERSISTENT": False, "BLOCK_R": 16, "BLOCK_C": 4096, "num_warps": 1, "num_stages": 1}
    with pytest.raises(HopelessConfig, match="values per thread"):
        RowReduceTemplate().render(m, spills, "k_spills")
    run_match(RowReduceTemplate(), g, m, dict(spills, num_warps=16))  # 128 a thread: rendered, and right

    path = tmp_path / "wide.py"
    path.write_text(WIDE_ROWS)
    proposer = TemplateProposer("cpu", seed=0)
    plan = proposer.plan(load_problem(path))
    (region,) = plan.regions
    assert proposer.render(plan, {region.key: dict(region.default(), **spills)}, "spills") is None
    assert not proposer.broken
    assert proposer.render(plan, {region.key: region.default()}, "defaults") is not None


GROUPNORM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, 64)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
    def forward(self, x):
        return torch.nn.functional.hardtanh(self.norm(x * 2.0 + 0.5), -2.0, 2.0)
def get_inputs(): return [torch.randn(9, 64)]
def get_init_inputs(): return []
"""


@pytest.mark.parametrize("config", SCHEDULES, ids=["persistent", "looped", "parts"])
def test_group_norm_statistics_and_affine_are_one_region(tmp_path, config):
    """GroupNorm decomposes into a [N, G, C/G, 1] frame around the [N, G, C/G] reductions: views that only add or drop
    trailing unit dims are free, so the mean, the variance and the per-group scale and shift are one kernel."""
    g = captured(tmp_path, GROUPNORM)
    matches = RowReduceTemplate().find(g, set())
    assert len(matches) == 1, [m.key for m in matches]
    (m,) = matches
    sums = [n for n in m.nodes if n.target is torch.ops.aten.sum.dim_IntList]
    assert len(sums) == 2 and m.spec["full"] == [9, 4, 16]
    run_match(RowReduceTemplate(), g, m, config)


ROW_SCALE = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x, b):
        return torch.softmax(x * b.unsqueeze(-1), -1), (x - b.view(-1, 1)).sum(-1)
def get_inputs(): return [torch.randn(9, 16), torch.rand(9) + 0.5]
def get_init_inputs(): return []
"""


@pytest.mark.parametrize("config", SCHEDULES, ids=["persistent", "looped", "parts"])
def test_an_input_without_the_reduced_dim_viewed_to_a_row_scalar(tmp_path, config):
    """b of shape [N] unsqueezed to [N, 1] scales each row: it is read per row, not along the row."""
    g = captured(tmp_path, ROW_SCALE)
    for m in RowReduceTemplate().find(g, set()):
        run_match(RowReduceTemplate(), g, m, config)


WIDE_SOFTMAX = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x):
        return F.log_softmax(x, dim=-1), torch.softmax(x * 2, dim=-1)
def get_inputs(): return [torch.randn(3, 20001) * 4]
def get_init_inputs(): return []
"""


def test_rows_wider_than_a_tile_are_shared_by_several_programs(tmp_path):
    """Few rows wider than a persistent tile: the first choice splits each row across programs (one kernel per
    reduction stage, partials combined, then one for the outputs) and matches the reference."""
    g = captured(tmp_path, WIDE_SOFTMAX)
    (m,) = RowReduceTemplate().find(g, set())
    space = RowReduceTemplate().space(m, "cuda")
    assert space["PARTS"][0] > 1 and 1 in space["PARTS"]
    source = RowReduceTemplate().render(m, {k: v[0] for k, v in space.items()}, "k")
    assert source.count("@triton.jit") >= 3  # two softmax stages (each an online max and sum) and the outputs
    run_match(RowReduceTemplate(), g, m)
    run_match(RowReduceTemplate(), g, m, {"PARTS": 7, "BLOCK_C": 512})  # parts that do not divide the row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("parts, one_read", [(1, False), (8, False), (64, False), (8, True), (64, True)])
def test_wide_rows_on_the_gpu(tmp_path, parts, one_read):
    """The wide-row kernels compiled and run on the GPU, every PARTS choice (and the one-read kernel, whose programs
    wait on one another) against PyTorch on the device, three calls each."""
    from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS
    from kernelevolve.templates.base import FILE_HEADER, load_source

    g = captured(tmp_path, WIDE_SOFTMAX.replace("torch.randn(3, 20001)", "torch.randn(64, 200001)"))
    (m,) = RowReduceTemplate().find(g, set())
    space = RowReduceTemplate().space(m, "cuda")
    config = {k: v[0] for k, v in space.items()}
    config["PARTS"], config["ONE_READ"] = parts, one_read
    name = f"wide{parts}_{int(one_read)}"
    module = load_source(FILE_HEADER + PRELUDE_IMPORTS + "\n" + PRELUDE + RowReduceTemplate().render(m, config, name),
                         name)
    for _ in range(3):
        x = torch.randn(64, 200001, device="cuda") * 4
        got = getattr(module, name)(x)
        torch.testing.assert_close(got[0], torch.log_softmax(x, -1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], torch.softmax(x * 2, -1), atol=1e-5, rtol=1e-4)


CHAINED_WIDE = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(F.layer_norm(x, (x.shape[-1],)), dim=-1)
def get_inputs(): return [torch.randn(3, 20001)]
def get_init_inputs(): return []
"""


@pytest.mark.parametrize("parts", [7, 16])
def test_rows_shared_by_programs_are_read_once_in_one_kernel(tmp_path, parts):
    """ONE_READ: one kernel, each program reducing a share and later writing the outputs of an earlier share, after
    waiting for that share's rows' partials; it matches the reference, whatever the lag."""
    g = captured(tmp_path, WIDE_SOFTMAX)
    (m,) = RowReduceTemplate().find(g, set())
    space = RowReduceTemplate().space(m, "cuda")
    assert True in space["ONE_READ"]
    config = {"PARTS": parts, "BLOCK_C": 512, "ONE_READ": True}
    source = RowReduceTemplate().render(m, {**{k: v[0] for k, v in space.items()}, **config}, "k")
    assert source.count("@triton.jit") == 1 and "while done <" in source
    run_match(RowReduceTemplate(), g, m, config)


def test_one_read_declines_a_reduction_of_a_reduction(tmp_path):
    """LayerNorm then softmax: the softmax reads the normalized row, which needs the row's mean and variance first;
    the one-read form says so (a hopeless configuration), the split form runs."""
    from kernelevolve.templates.base import HopelessConfig

    g = captured(tmp_path, CHAINED_WIDE)
    (m,) = RowReduceTemplate().find(g, set())
    space = RowReduceTemplate().space(m, "cuda")
    config = {**{k: v[0] for k, v in space.items()}, "PARTS": 8, "ONE_READ": True}
    with pytest.raises(HopelessConfig, match="one-read"):
        RowReduceTemplate().render(m, config, "k")
    run_match(RowReduceTemplate(), g, m, {**config, "ONE_READ": False})
