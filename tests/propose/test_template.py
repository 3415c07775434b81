import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.candidate import Candidate  # noqa: E402
from kernelevolve.problem import build_model, import_module_from_path, load_problem  # noqa: E402
from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.template import TemplateProposer, genome_key, plan_problem  # noqa: E402
from kernelevolve.templates.base import load_source  # noqa: E402
from tests.factories import make_node, make_profile  # noqa: E402

PROBLEM = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
    def forward(self, x):
        return F.softmax(self.ln(self.fc(x)) * 2.0, -1)
def get_inputs(): return [torch.randn(5, 7, 48)]
def get_init_inputs(): return [48]
"""


@pytest.fixture
def problem(tmp_path):
    path = tmp_path / "fc_ln_softmax.py"
    path.write_text(textwrap.dedent(PROBLEM))
    return load_problem(path)


def _ctx(problem, history=()):
    return ProposalContext(problem, "cpu", make_profile(bound="memory"), list(history))


def _run(source: str, problem, inputs):
    module = import_module_from_path(problem.path, "ref_" + problem.short_sha)
    ref = build_model(module, "Model", 0)
    cand = load_source(source, "cand_" + Candidate(source).sha[:12])
    new = cand.ModelNew(*module.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        return new(*inputs), ref(*inputs)


def test_plan_claims_the_norm_and_leaves_the_matmul_to_aten_or_its_family(problem):
    plan = plan_problem(problem, "cpu")
    kinds = [r.match.kind for r in plan.regions]
    assert "row_reduction" in kinds


def test_candidates_are_self_contained_and_correct(problem):
    cands = TemplateProposer("cpu", seed=0).propose(_ctx(problem), 3)
    assert len(cands) == 3 and len({c.sha for c in cands}) == 3
    for c in cands:
        assert "kernelevolve" not in c.source.split("# ---- the reference")[0].replace("kernelevolve's", "")
        assert c.language == "triton" and c.meta["genome"]
    x = [torch.randn(5, 7, 48)]
    got, want = _run(cands[0].source, problem, x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_other_shapes_take_the_reference_path(problem):
    (cand,) = TemplateProposer("cpu", seed=0).propose(_ctx(problem), 1)
    got, want = _run(cand.source, problem, [torch.randn(2, 3, 48)])
    torch.testing.assert_close(got, want)


def test_search_never_repeats_a_genome_and_breeds_from_the_fastest(problem):
    from kernelevolve.evaluate.result import Result, Status, Timing

    proposer = TemplateProposer("cpu", seed=1)
    first = proposer.propose(_ctx(problem), 2)
    history = []
    for i, c in enumerate(first):
        timing = Timing.from_samples([1.0 + i], "perf_counter")
        history.append(make_node(i + 1, Result(Status.OK, "verified", timing=timing, timed=True), meta=c.meta,
                                 source=c.source))
    nxt = proposer.propose(_ctx(problem, history), 20)  # the remaining seeds first, then offspring
    keys = {genome_key(c.meta["genome"]) for c in first}
    assert nxt and all(genome_key(c.meta["genome"]) not in keys for c in nxt)
    assert any(c.parent == 1 for c in nxt)


JAGGED = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(100, 24, mode="sum")
    def forward(self, idx, offsets):
        return self.emb(idx, offsets)
def get_inputs():  # the total number of indices changes from draw to draw, as in production batches
    lengths = torch.randint(0, 6, (9,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return [torch.randint(0, 100, (int(lengths.sum()),)), offsets]
def get_init_inputs(): return []
"""
VARYING_POINTWISE = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
def get_inputs(): return [torch.randn(int(torch.randint(5, 50, ()).item()))]
def get_init_inputs(): return []
"""


def _write(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return load_problem(path)


def test_a_kernel_that_reads_sizes_at_run_time_serves_every_jagged_total(tmp_path):
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig

    problem = _write(tmp_path, "jagged", JAGGED)
    plan = plan_problem(problem, "cpu")
    assert plan.dynamic == {0: {0}}
    (cand,) = TemplateProposer("cpu", seed=0).propose(_ctx(problem), 1)
    assert "args[0].dim() == 1" in cand.source  # the index count is left out of the guard
    ev = Evaluator(problem, EvalConfig(device="cpu", timeout_s=120, timing=TimingConfig(budget_ms=5, warmup_ms=1,
                                                                                       max_reps=3)), tmp_path / "w")
    r = ev.evaluate(cand)
    assert r.ok, f"{r.status.value}: {r.reason}"


def test_a_kernel_that_bakes_a_varying_size_is_not_proposed(tmp_path):
    problem = _write(tmp_path, "varying", VARYING_POINTWISE)
    assert plan_problem(problem, "cpu").dynamic == {0: {0}}
    assert TemplateProposer("cpu", seed=0).propose(_ctx(problem), 2) == []


def test_fp32_products_try_tf32x3_right_after_the_defaults(tmp_path):
    from tests.benchsuite import load_suite

    suite = load_suite()
    path = suite.write_small_copy(suite.PROBLEMS / "dlrm_interaction.py", tmp_path)
    cands = TemplateProposer("cpu", seed=0).propose(_ctx(load_problem(path)), 2)
    assert [c.meta["label"] for c in cands] == ["defaults", "prior pairwise_interaction INPUT_PRECISION"]
    assert [cfg["config"].get("INPUT_PRECISION") for c in cands for cfg in c.meta["configs"]] == ["ieee", "tf32x3"]


def test_parents_are_ranked_on_one_clock():
    """A node the judge timed but the screen did not is put on the screen's clock by the ratio of the nodes both
    timed: at 1.4x judge over screen, a 0.36 ms judged node is a 0.26 ms screen node, slower than one screened at
    0.25 ms, though 0.25 < 0.36 < 0.30 would rank it otherwise."""
    from kernelevolve.evaluate.result import Result, ScreenResult, Status, Timing
    from kernelevolve.propose.template import _ranked
    from tests.factories import make_node

    def judged(ms):
        return Result(Status.OK, "verified", timing=Timing.from_samples([ms], "perf_counter"), timed=True)

    both = make_node(1, judged(0.42), screen=ScreenResult(Status.OK, "x", ms=0.30))
    judge_only = make_node(2, judged(0.36))
    screen_only = make_node(3, None, screen=ScreenResult(Status.OK, "x", ms=0.25))
    assert [n.id for n in _ranked([both, judge_only, screen_only])] == [3, 2, 1]
    assert [n.id for n in _ranked([judge_only, make_node(4, judged(0.2))])] == [4, 2]  # no ratio: the judge's times


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_each_tensor_core_fp32_mode_is_seeded_once(tmp_path, allow_tf32):
    """An fp32 GEMM's first candidates try tf32x3 and split_tf32x3 right after the defaults; where TF32 is allowed
    (plain TF32 the default) the slower exact FMA dot gets no seed of its own."""
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3
    from tests.benchsuite import load_suite

    suite = load_suite()
    source = suite.small_source((suite.PROBLEMS / "gemm" / "swiglu_mlp_fp32.py").read_text())
    if allow_tf32:
        source += "\nALLOW_TF32 = True\n"
    path = tmp_path / "swiglu_mlp_fp32.py"
    path.write_text(source)
    problem = load_problem(path)
    assert bool(problem.allow_tf32) is allow_tf32
    cands = TemplateProposer("cpu", seed=0).propose(_ctx(problem), 8)
    modes = {c.meta["label"]: {cfg["config"].get("INPUT_PRECISION") for cfg in c.meta["configs"]} for c in cands}
    seeded = {m for label, ms in modes.items() if label.startswith("prior") and "INPUT_PRECISION" in label
              for m in ms}
    if allow_tf32:
        assert "ieee" not in seeded and "tf32x3" in seeded and SPLIT_TF32X3 not in seeded
    else:
        assert {"tf32x3", SPLIT_TF32X3} <= seeded
        assert any(label.endswith(f"INPUT_PRECISION={SPLIT_TF32X3}") for label in modes)


def test_a_tensor_core_mode_is_seeded_in_every_fp32_gemm_at_once(tmp_path):
    """The three cross layers of a DCN (three regions) get each tensor-core mode in one seed, all three at once: one
    layer left on the FMA dot sets the pace of the whole problem."""
    from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3
    from tests.benchsuite import load_suite

    suite = load_suite()
    path = suite.write_small_copy(suite.PROBLEMS / "dcn_v2_cross_fp32.py", tmp_path)
    cands = TemplateProposer("cpu", seed=0).propose(_ctx(load_problem(path)), 3)
    modes = {c.meta["label"]: [cfg["config"].get("INPUT_PRECISION") for cfg in c.meta["configs"]] for c in cands}
    assert modes == {"defaults": ["ieee"] * 3, "prior dcn_cross INPUT_PRECISION": ["tf32x3"] * 3,
                     f"prior dcn_cross INPUT_PRECISION={SPLIT_TF32X3}": [SPLIT_TF32X3] * 3}, modes


def test_a_tensor_core_mode_starts_from_a_tile_of_64_rows(tmp_path):
    """The FMA dot's default tile on a 256 x 256 product over a 65536-long reduction is 32 x 32, which puts TF32
    products on mma.sync; the tensor-core seeds start from 64 x 64 (Hopper's warpgroup MMA), split-K no lower."""
    from tests.benchsuite import load_suite

    suite = load_suite()
    cands = TemplateProposer("cpu", seed=0).propose(_ctx(load_problem(suite.PROBLEMS / "gemm" / "matmul_long_k_fp32.py")),
                                                   4)
    configs = {c.meta["label"]: c.meta["configs"][0]["config"] for c in cands}
    default = configs.pop("defaults")
    assert (default["BLOCK_M"], default["BLOCK_N"], default["INPUT_PRECISION"]) == (32, 32, "ieee"), default
    assert len(configs) == 3 and all(c["INPUT_PRECISION"] != "ieee" for c in configs.values()), configs
    for label, cfg in configs.items():
        assert cfg["BLOCK_M"] >= 64 and cfg["BLOCK_N"] >= 64 and cfg["SPLIT_K"] >= default["SPLIT_K"], (label, cfg)


BUFFERED = """
import torch, torch.nn as nn
class Inner(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.register_buffer("shift", torch.randn(d))
class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.blocks = nn.ModuleList([Inner(d)])
    def forward(self, x):
        b = self.blocks[0]
        return b.ln(x) * 1.5 + b.shift
def get_inputs(): return [torch.randn(6, 40)]
def get_init_inputs(): return [40]
"""


def test_the_forward_reads_nested_parameters_and_buffers_afresh_on_every_call(tmp_path):
    """The candidate's forward looks its state up by name on every call: parameters and buffers of nested modules
    (a ModuleList in the path), and a parameter or buffer replaced after construction is the one used."""
    path = tmp_path / "buffered.py"
    path.write_text(textwrap.dedent(BUFFERED))
    problem = load_problem(path)
    (cand,) = TemplateProposer("cpu", seed=0).propose(_ctx(problem), 1)
    assert cand.meta["regions"], cand.meta
    x = torch.randn(6, 40)
    got, want = _run(cand.source, problem, [x])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    module = import_module_from_path(problem.path, "ref_buffered")
    ref = build_model(module, "Model", 0)
    new = load_source(cand.source, "cand_buffered").ModelNew(*module.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
    for m in (ref, new):  # new objects, not new values in the old ones
        m.blocks[0].ln.weight = torch.nn.Parameter(torch.full((40,), 3.0))
        m.blocks[0].shift = torch.full((40,), -2.0)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)


def test_a_cpu_runs_template_proposer_keeps_the_default_fp32_mode_and_its_cap(tmp_path):
    """make_proposers on the CPU: no tensor-core fp32 mode (none runs or is timed there), and at most
    ``template_max`` candidates in the run."""
    from kernelevolve.propose import make_proposers
    from tests.benchsuite import load_suite

    suite = load_suite()
    ctx = _ctx(load_problem(suite.write_small_copy(suite.PROBLEMS / "dcn_v2_cross_fp32.py", tmp_path)))
    (proposer,) = make_proposers(["template"], "cpu", {"template_max": 2})
    cands = proposer.propose(ctx, 3)
    assert len(cands) == 2
    assert {cfg["config"].get("INPUT_PRECISION") for c in cands for cfg in c.meta["configs"]} == {"ieee"}
    assert proposer.propose(ctx, 3) == []
    (gpu,) = make_proposers(["template"], "cuda", {})
    assert gpu.tensor_core_modes and gpu.max_candidates is None
