"""A whole model cut into regions: where each op came from, the regions and their signatures, and each region as a
problem file whose inputs are the model's own inputs run through the graph before it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kernelevolve.analyze.graph import capture, node_values, origin
from kernelevolve.model.partition import GLUE, partition
from kernelevolve.model.profile import attribute, hot_regions, op_times
from kernelevolve.model.regionfile import write_region
from kernelevolve.problem import build_model, import_module_from_path, load_problem

BLOCKS = '''
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.norm(h + x)


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return torch.sigmoid(self.head(x))


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return [32, 3]
'''

# indices and offsets the model's inputs carry: a region after the bag must see valid ones
BAGS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, rows, dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="sum")
        self.mlp = nn.Linear(dim, dim)

    def forward(self, ids, offsets, dense):
        pooled = self.bag(ids, offsets)
        x = torch.relu(self.mlp(dense)) * 2.0 + 1.0
        return torch.tanh(pooled) * x


def get_inputs():
    lengths = torch.randint(0, 5, (16,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    ids = torch.randint(0, 100, (int(lengths.sum()),))
    return [ids, offsets, torch.randn(16, 8)]


def get_init_inputs():
    return [100, 8]
'''


# a convolution no family claims, between two claimed regions
CONV = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc(x))
        return torch.softmax(self.conv(y), dim=-1)


def get_inputs():
    return [torch.randn(2, 4, 16)]


def get_init_inputs():
    return []
'''

# a model's plain tensor attribute (not a parameter or buffer), copied into each call as KernelBench's VanillaRNN
# does: a traced constant too large to embed in a file, whose values are never read
STATEFUL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.randn(4, 20000)
        self.i2h = nn.Linear(8 + 20000, 16)

    def forward(self, x, h0):
        self.hidden.copy_(h0)
        return torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))


def get_inputs():
    return [torch.randn(4, 8), torch.randn(4, 20000)]


def get_init_inputs():
    return []
'''


def _model(tmp_path: Path, source: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    problem = load_problem(path)
    return problem, capture(problem, origins=True)


def test_every_op_names_its_module_and_line(tmp_path: Path) -> None:
    problem, graph = _model(tmp_path, BLOCKS)
    where = [origin(n, problem.path) for n in graph.calls()]
    modules = {m for m, _ in where}
    assert {"blocks.0.fc", "blocks.2.norm", "head"} <= modules
    assert all(line is not None for _, line in where)
    lines = BLOCKS.splitlines()
    fc = next(line for m, line in where if m == "blocks.1.fc")
    assert "self.fc(x)" in lines[fc - 1]


def test_identical_blocks_are_one_problem(tmp_path: Path) -> None:
    problem, graph = _model(tmp_path, BLOCKS)
    part = partition(graph, problem, "cpu")
    groups = list(part.groups().values())
    sizes = sorted(len(g) for g in groups)
    assert sizes == [1, 3, 3], [(g[0].kind, g[0].where, len(g)) for g in groups]
    kinds = {g[0].kind for g in groups}
    assert "matmul" in kinds and "row_reduction" in kinds
    # every op that computes is in exactly one region
    seen = [n for r in part.regions for n in r.nodes]
    assert len(seen) == len(set(seen))
    norm = next(g for g in groups if g[0].kind == "row_reduction")
    assert [r.where.split(" ")[0] for r in norm] == ["blocks.0.norm", "blocks.1.norm", "blocks.2.norm"]


def test_unclaimed_ops_form_glue_regions(tmp_path: Path) -> None:
    from kernelevolve.analyze.graph import is_convex

    problem, graph = _model(tmp_path, CONV)
    part = partition(graph, problem, "cpu")
    glue = [r for r in part.regions if r.kind == GLUE]
    assert glue and any("convolution" in r.ops() for r in glue), [(r.kind, r.ops()) for r in part.regions]
    assert all(is_convex(r.nodes) for r in part.regions)
    # a run of views alone is no region
    assert not any(set(r.ops()) <= {"view", "permute", "unsqueeze"} for r in part.regions)


# a module called twice, a LayerNorm the graph holds as its primitive ops, and ops of the root's own forward
TWICE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        h = self.norm(self.fc(h) + x)
        return torch.sigmoid(h).sum(dim=1)


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return [32]
'''


# ops the normal form writes in place of others (an einsum that sums), in a submodule and in the root
REWRITTEN = '''
import torch
import torch.nn as nn


class Inner(nn.Module):
    def forward(self, h):
        return torch.einsum("ij->j", h.relu())


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.inner = Inner()

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return self.inner(h) + torch.einsum("ij->j", h)


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
'''


def _module_calls(graph) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for n in graph.calls():
        custom = n.meta.get("custom") or {}
        out.setdefault((custom.get("module", ""), custom.get("call", 0)), []).append(n.name)
    return out


def test_each_module_calls_ops_are_scaled_to_that_calls_own_time(tmp_path: Path) -> None:
    """The graph's ops of one module call take, together, the model's own time of that call, in their proportions."""
    from kernelevolve.model.profile import calibrate

    _, graph = _model(tmp_path, TWICE)
    calls = _module_calls(graph)
    assert {("fc", 1), ("fc", 2), ("norm", 1), ("", 1)} <= set(calls), calls
    assert len(calls[("norm", 1)]) > 3  # the LayerNorm as primitives
    per_node = {n.name: 1.0 + i for i, n in enumerate(graph.calls())}
    own = {key: 10.0 * (k + 1) for k, key in enumerate(sorted(calls))}
    scaled = calibrate(graph, per_node, own)
    for key, names in calls.items():
        assert sum(scaled[n] for n in names) == pytest.approx(own[key])
        first, last = names[0], names[-1]
        assert scaled[last] / scaled[first] == pytest.approx(per_node[last] / per_node[first])
    # a call the model's profile did not time keeps the graph's own times
    del own[("norm", 1)]
    kept = calibrate(graph, per_node, own)
    assert all(kept[n] == per_node[n] for n in calls[("norm", 1)])


def test_ops_the_normal_form_writes_keep_their_module_call(tmp_path: Path) -> None:
    """A rewritten op is its module call's, not the root's: scaled, the ops add up to the module calls' own times."""
    from kernelevolve.model.profile import calibrate

    _, graph = _model(tmp_path, REWRITTEN)
    calls = _module_calls(graph)
    assert ("", 0) not in calls and ("inner", 1) in calls, calls
    own = {key: 10.0 * (k + 1) for k, key in enumerate(sorted(calls))}
    scaled = calibrate(graph, {n.name: 1.0 for n in graph.calls()}, own)
    assert sum(scaled.values()) == pytest.approx(sum(own.values()))


def test_a_graph_captured_without_origins_is_not_scaled(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(TWICE)
    graph = capture(load_problem(path))
    times = op_times(graph, "cpu", runs=2, warmup=1)
    assert graph.model is None and times.model_ms is None and times.total_ms == times.graph_ms


def test_the_models_own_forward_times_every_module_call_of_the_graph(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity

    from kernelevolve.model.profile import module_times

    _, graph = _model(tmp_path, TWICE)
    own, whole = module_times(graph.model, graph.state_names, graph.example, [ProfilerActivity.CPU], runs=2, warmup=1)
    assert set(_module_calls(graph)) <= set(own), (set(_module_calls(graph)), set(own))
    assert all(v >= 0 for v in own.values()) and whole == pytest.approx(sum(own.values()), rel=0.5)
    times = op_times(graph, "cpu", runs=2, warmup=1)
    assert times.model_ms is not None and times.graph_ms is not None
    assert set(times.per_node) == {n.name for n in graph.calls()}
    graph.model = None  # no model to run: the graph's own times stand
    plain = op_times(graph, "cpu", runs=2, warmup=1)
    assert plain.model_ms is None and plain.total_ms == plain.graph_ms


def test_times_add_up_to_the_model(tmp_path: Path) -> None:
    problem, graph = _model(tmp_path, BLOCKS)
    part = partition(graph, problem, "cpu")
    times = op_times(graph, "cpu", runs=3, warmup=1)
    attribute(part, times)
    assert set(times.per_node) == {n.name for n in graph.calls()}
    rows = hot_regions(part, times)
    assert rows[0].ms == max(r.ms for r in rows)
    assert sum(r.share for r in rows) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("source", [BLOCKS, BAGS, CONV, STATEFUL], ids=["blocks", "bags", "conv", "stateful"])
def test_a_region_file_computes_the_region_on_the_models_own_inputs(tmp_path: Path, source: str) -> None:
    problem, graph = _model(tmp_path, source)
    part = partition(graph, problem, "cpu")
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(problem.path, out / "model.py")
    model_module = import_module_from_path(problem.path, "_test_regions_model")
    for region in part.regions:
        path = write_region(graph, region, out, "model.py", f"region {region.name}")
        loaded = load_problem(path)  # a valid problem file on its own
        mod = import_module_from_path(path, f"_test_region_{region.name}")
        torch.manual_seed(7)
        xs = mod.get_inputs()
        with torch.no_grad():
            got = mod.Model()(*xs)
        # the same draw through the whole model's graph, with the model's weights as built for the file
        torch.manual_seed(7)
        ins = model_module.get_inputs()
        full = build_model(model_module, "Model", 0)
        state = {**dict(full.named_parameters()), **dict(full.named_buffers())}
        values = node_values(graph, [[state[k].detach() for k in graph.state_names], *ins])
        want = [values[n] for n in region.outputs]
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        assert len(got) == len(want), loaded.name
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        # a copy of the file elsewhere (as a candidate built from it is written) still finds the model
        away = tmp_path / "elsewhere" / region.name / path.name
        away.parent.mkdir(parents=True)
        away.write_text(path.read_text())
        copy = import_module_from_path(away, f"_test_region_away_{region.name}")
        with torch.no_grad():
            copied = copy.Model()(*xs)
        for g, w in zip(copied if isinstance(copied, (tuple, list)) else [copied], want):
            torch.testing.assert_close(g, w)
        # a fresh draw is a different draw
        torch.manual_seed(8)
        other = mod.get_inputs()
        assert any(not torch.equal(a, b) for a, b in zip(xs, other) if a.shape == b.shape) or \
            any(a.shape != b.shape for a, b in zip(xs, other))


@pytest.mark.parametrize("source", [BAGS, STATEFUL], ids=["bags", "stateful"])
def test_a_region_file_maps_the_saved_weights_instead_of_building_the_model(tmp_path: Path, source: str) -> None:
    """Weights saved beside the model are read, not built, and give what the built model gives; once the model's
    file changes they are not read."""
    from kernelevolve.model.regionfile import STATE_FILE, save_state

    problem, graph = _model(tmp_path, source)
    part = partition(graph, problem, "cpu")
    saved, built = tmp_path / "saved", tmp_path / "built"
    for d in (saved, built):
        d.mkdir()
        shutil.copy(problem.path, d / "model.py")
    save_state(saved, "model.py")
    assert (saved / STATE_FILE).exists()
    for region in part.regions:
        outs = []
        for d in (saved, built):
            path = write_region(graph, region, d, "model.py", f"region {region.name}")
            mod = import_module_from_path(path, f"_test_saved_{d.name}_{region.name}")
            torch.manual_seed(7)
            xs = mod.get_inputs()
            with torch.no_grad():
                out = mod.Model()(*xs)
            outs.append(list(out) if isinstance(out, (tuple, list)) else [out])
            assert mod._source_model.cache_info().currsize == (0 if d is saved else 1), d.name
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    (saved / "model.py").write_text((saved / "model.py").read_text() + "\n# changed\n")
    stale = import_module_from_path(saved / f"region_{part.regions[0].name}.py", "_test_saved_stale")
    stale.Model()
    assert stale._source_model.cache_info().currsize == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_times_on_the_gpu_are_device_times(tmp_path: Path) -> None:
    problem, graph = _model(tmp_path, BLOCKS.replace("torch.randn(64, 32)", "torch.randn(8192, 1024)")
                            .replace("return [32, 3]", "return [1024, 3]"))
    part = partition(graph, problem, "cuda")
    times = op_times(graph, "cuda", runs=3, warmup=1)
    attribute(part, times)
    gemm = next(r for r in part.regions if r.kind == "matmul")
    # a [8192, 1024] x [1024, 1024] fp32 GEMM: tens of microseconds at least on any GPU, nothing from the host
    assert gemm.time_ms > 0.01 and times.total_ms > gemm.time_ms, times
    views = [n.name for n in graph.calls() if n.target is torch.ops.aten.permute.default]
    assert all(times.per_node[v] < 0.01 for v in views), {v: times.per_node[v] for v in views}


def test_a_range_on_the_gpu_counts_its_kernels_once() -> None:
    """The profiler gives a range on the GPU twice: the host's range, with the device time of the kernels it launched,
    and its span on the device's timeline. Only the first is the range's time."""
    from types import SimpleNamespace

    from kernelevolve.model.profile import PREFIX, _ranges

    host = SimpleNamespace(name=PREFIX + "mm", device_type=torch.autograd.DeviceType.CPU, device_time_total=100.0,
                           cpu_time_total=7.0)
    span = SimpleNamespace(name=PREFIX + "mm", device_type=torch.autograd.DeviceType.CUDA, device_time_total=180.0,
                           cpu_time_total=0.0)
    kernel = SimpleNamespace(name="sm90_gemm", device_type=torch.autograd.DeviceType.CUDA, device_time_total=100.0,
                             cpu_time_total=0.0)
    assert _ranges([host, span, kernel], cuda=True) == {"mm": pytest.approx(0.1)}
    assert _ranges([host], cuda=False) == {"mm": pytest.approx(0.007)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_profile_of_a_model_on_the_gpu_is_not_longer_than_its_call(tmp_path: Path) -> None:
    """A device-bound model: its ops' device times add up to its call (a range counted twice would read about twice as
    long, and the primitives of its LayerNorms run op by op longer than the model's own fused kernels)."""
    problem, graph = _model(tmp_path, BLOCKS.replace("torch.randn(64, 32)", "torch.randn(8192, 1024)")
                            .replace("return [32, 3]", "return [1024, 3]"))
    times = op_times(graph, "cuda", runs=3, warmup=1)
    model = build_model(import_module_from_path(problem.path, "_blocks_call"), "Model", 0).cuda()
    x = torch.randn(8192, 1024, device="cuda")
    calls = []
    with torch.no_grad():
        for _ in range(3):
            model(x)
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(x)
            end.record()
            end.synchronize()
            calls.append(start.elapsed_time(end))
    call_ms = sorted(calls)[len(calls) // 2]
    # its LayerNorms are primitive ops in the graph (eleven kernels each) and one kernel in the model: the op times
    # are scaled to the model's own module calls, so they add up to its call, not to the primitives' longer run
    assert times.model_ms is not None and times.graph_ms is not None
    assert 0.7 * call_ms < times.total_ms < 1.15 * call_ms, (times.total_ms, times.graph_ms, call_ms)
