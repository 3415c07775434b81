import json
import textwrap
from pathlib import Path

import pytest
import torch

from kernelevolve.problem import Problem, source_sha
from kernelevolve.profile import (
    BOUNDS,
    Profile,
    ProfileError,
    measured_ceilings,
    profile_problem,
    render_profile,
    table_ceilings,
)

LINEAR = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = torch.nn.Linear(n, n)

    def forward(self, x):
        return self.fc(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return [256]
"""

RELU = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
"""

BF16_MATMUL = """
import torch

class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b

def get_inputs():
    return [torch.randn(32, 64).bfloat16(), torch.randn(64, 16).bfloat16()]

def get_init_inputs():
    return []
"""


def _problem(tmp_path: Path, name: str, source: str, **kw) -> Problem:
    source = textwrap.dedent(source)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return Problem(path=str(path), source=source, sha=source_sha(source), name=name, **kw)


@pytest.fixture(scope="module")
def linear_profile(tmp_path_factory) -> Profile:
    return profile_problem(_problem(tmp_path_factory.mktemp("linear"), "linear", LINEAR))


def test_linear_flops_and_bytes(linear_profile):
    p = linear_profile
    assert p.flops == 2 * 64 * 256 * 256
    assert p.bytes == 4 * (64 * 256 + 256 * 256 + 256 + 64 * 256)
    assert p.device == "cpu" and p.device_name
    assert p.dtype == "float32"
    assert p.ceilings_source == "measured"
    assert p.floor_ms > 0 and p.eager_ms > 0
    assert p.intensity == pytest.approx(p.flops / p.bytes)
    assert p.ridge == pytest.approx(p.peak_flops / p.peak_bw)
    floor = max(p.flops / p.peak_flops, p.bytes / p.peak_bw) * 1e3
    assert p.floor_ms == pytest.approx(floor)
    assert p.bound in BOUNDS
    assert any(p.bound in n for n in p.notes)


def test_linear_top_ops(linear_profile):
    ops = linear_profile.top_ops
    assert 0 < len(ops) <= 8
    assert all(op["name"] and op["self_ms"] > 0 and op["calls"] >= 1 for op in ops)
    assert [op["self_ms"] for op in ops] == sorted((op["self_ms"] for op in ops), reverse=True)
    assert any("addmm" in op["name"] for op in ops)
    assert sum(op["pct"] for op in ops) <= 100.0 + 1e-6


def test_relu_is_memory_or_latency(tmp_path):
    p = profile_problem(_problem(tmp_path, "relu", RELU))
    assert p.flops == 0
    assert p.bytes == 2 * 1024 * 1024 * 4
    assert p.intensity == 0.0
    assert p.bound in ("memory", "latency")
    assert p.floor_ms == pytest.approx(p.bytes / p.peak_bw * 1e3)
    assert any("relu" in op["name"] for op in p.top_ops)


def test_bf16_dtype(tmp_path):
    p = profile_problem(_problem(tmp_path, "mm", BF16_MATMUL))
    assert p.dtype == "bfloat16"
    assert p.flops == 2 * 32 * 64 * 16
    assert p.bytes == 2 * (32 * 64 + 64 * 16 + 32 * 16)


GATHER = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(4096, 32)
        self.proj = torch.nn.Parameter(torch.randn(32, 8))

    def forward(self, ids, rows):
        bags = torch.nn.functional.embedding_bag(ids, self.table.weight, torch.tensor([0, 40]), mode="sum")
        picked = torch.index_select(rows, 0, ids[:8])  # rows is gathered only: 8 ids, at most 8 distinct rows
        return bags @ self.proj{extra}, picked

def get_inputs():
    return [torch.cat([torch.arange(50), torch.arange(30)]), torch.randn(1000, 16)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("extra, table_read", [("", 50 * 32 * 4), (" + self.table.weight.sum()", 4096 * 32 * 4)],
                         ids=["gathered-only", "also-read-whole"])
def test_gathered_tables_count_only_their_distinct_rows(tmp_path, extra, table_read):
    p = profile_problem(_problem(tmp_path, "gather", GATHER.replace("{extra}", extra)))
    ids, rows_read, proj, outputs = 80 * 8, 8 * 16 * 4, 32 * 8 * 4, 2 * 8 * 4 + 8 * 16 * 4
    assert p.bytes == ids + table_read + rows_read + proj + outputs


def test_round_trip_json(linear_profile):
    d = json.loads(json.dumps(linear_profile.to_dict()))
    assert Profile.from_dict(d) == linear_profile


def test_render(linear_profile):
    text = render_profile(linear_profile)
    assert linear_profile.bound in text
    assert "GFLOP" in text and "floor" in text and "measured" in text
    assert linear_profile.top_ops[0]["name"][:40] in text


def test_cpu_ceilings_cached():
    assert measured_ceilings("cpu") is measured_ceilings("cpu")
    flops, bw = measured_ceilings("cpu")
    assert flops > 1e8 and bw > 1e8


def test_table_lookup():
    assert table_ceilings("NVIDIA H200")["bw"] == 4.8e12
    assert table_ceilings("NVIDIA H100 80GB HBM3")["bw"] == 3.35e12
    assert table_ceilings("NVIDIA H100 PCIe")["bw"] == 2.0e12
    assert table_ceilings("NVIDIA A100-SXM4-80GB")["fp16"] == 312e12
    assert table_ceilings("AMD Instinct MI300X")["bw"] == 5.3e12
    assert table_ceilings("NVIDIA L40S") is None
    assert table_ceilings("NVIDIA L4")["bw"] == 0.3e12


def test_bad_device(tmp_path):
    with pytest.raises(ProfileError):
        profile_problem(_problem(tmp_path, "relu", RELU), device="tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_linear_on_cuda(tmp_path):
    p = profile_problem(_problem(tmp_path, "linear", LINEAR), device="cuda")
    known = table_ceilings(torch.cuda.get_device_name()) is not None
    assert p.ceilings_source == ("table" if known else "measured")
    assert p.device == "cuda"
    assert p.flops == 2 * 64 * 256 * 256
    assert p.top_ops and all(op["name"] and not op["name"].startswith("aten::") for op in p.top_ops)
    assert p.bound in BOUNDS and p.floor_ms > 0
    measured = profile_problem(_problem(tmp_path, "linear", LINEAR), device="cuda", measure_ceilings=True)
    assert measured.ceilings_source == "measured"


def test_fp32_gemm_floor_takes_the_faster_of_fma_and_tf32x3():
    """Without TF32, fp32 products still run on tensor cores as three TF32 products (the template's tf32x3 modes):
    on an H200 that bounds an fp32 GEMM at 494/3 TFLOP/s, not the 67 of the FMA units; where the FMA peak is the
    higher (an L4: 30.3 against 60/3), it stays; with TF32 allowed, for convolutions or attention (matrix FLOPs no
    template splits), for a pointwise op, or on an AMD GPU, nothing changes."""
    from kernelevolve.profile import _ceilings

    def peak(name, dtype="float32", tf32=False, matmul=True, gemm=True):
        notes: list[str] = []
        flops, _, source = _ceilings("cuda", name, dtype, tf32, matmul, False, "cuda", notes, gemm=matmul and gemm)
        return flops, source, notes

    flops, source, notes = peak("NVIDIA H200")
    assert flops == pytest.approx(494e12 / 3) and source == "table" and any("tf32x3" in n for n in notes)
    assert peak("NVIDIA L4")[0] == 30.3e12
    assert peak("NVIDIA H200", tf32=True)[0] == 494e12
    assert peak("NVIDIA H200", matmul=False)[0] == 67e12
    assert peak("NVIDIA H200", dtype="bfloat16")[0] == 989e12
    assert peak("NVIDIA H200", gemm=False)[0] == 67e12
    assert peak("AMD Instinct MI300X")[0] == 163e12


def test_gemm_share_counts_plain_gemms_only():
    from kernelevolve.profile import _count_flops

    lin = torch.nn.Linear(64, 32)
    total, matmul, gemm = _count_flops(lin, [torch.randn(8, 64)])
    assert total == 2 * 8 * 64 * 32 and matmul == gemm == 1.0
    conv = torch.nn.Conv2d(4, 8, 3)
    _, matmul, gemm = _count_flops(conv, [torch.randn(1, 4, 16, 16)])
    assert matmul == 1.0 and gemm == 0.0
