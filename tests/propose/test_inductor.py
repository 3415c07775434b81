"""InductorProposer: a search over torch.compile options rendered as self-contained candidate files."""
import ast
from pathlib import Path

import pytest
import torch

from kernelevolve.propose import ProposalContext, ProposerError, make_proposers
from kernelevolve.propose.inductor import CPU_KNOBS, CUDA_KNOBS, InductorProposer, config_key
from kernelevolve.problem import load_problem
from kernelevolve.rows import Node
from tests.factories import make_node

EXAMPLE = Path(__file__).parents[2] / "examples" / "gelu_mlp.py"


@pytest.fixture(scope="module")
def problem():
    return load_problem(EXAMPLE)


def as_nodes(cands, start: int = 1) -> list[Node]:
    """The history nodes of candidates (results are irrelevant to the proposer)."""
    return [make_node(start + i, None, c.parent, c.proposer, meta=c.meta, source=c.source, language=c.language)
            for i, c in enumerate(cands)]


def ctx(problem, history=(), parents=(), device="cpu") -> ProposalContext:
    return ProposalContext(problem, device, None, list(history), list(parents))


def imports(source: str) -> set[str]:
    names = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            names.add(n.module or "")
    return names


def test_proposes_distinct_configs(problem):
    cands = InductorProposer("cpu", seed=0).propose(ctx(problem), 8)
    assert len(cands) == 8
    keys = [config_key(c.meta["options"]) for c in cands]
    assert len(set(keys)) == len(keys)
    assert len({c.sha for c in cands}) == len(cands)
    assert cands[0].meta == {"label": "default", "options": {}}
    assert all(c.proposer == "inductor" and c.language == "inductor" for c in cands)


def test_never_repeats_history(problem):
    prop = InductorProposer("cpu", seed=1)
    history: list[Node] = []
    for _ in range(6):
        cands = prop.propose(ctx(problem, history, history[-1:]), 5)
        tried = {config_key(n.meta["options"]) for n in history}
        assert not tried & {config_key(c.meta["options"]) for c in cands}
        history += as_nodes(cands, start=len(history) + 1)
    keys = [config_key(n.meta["options"]) for n in history]
    assert len(keys) == len(set(keys)) >= 20


def test_a_fresh_proposer_respects_a_resumed_history(problem):
    first = InductorProposer("cpu", seed=2).propose(ctx(problem), 5)
    again = InductorProposer("cpu", seed=2).propose(ctx(problem, as_nodes(first)), 5)
    assert {c.sha for c in first}.isdisjoint(c.sha for c in again)


def test_mutations_carry_parent_id(problem):
    prop = InductorProposer("cpu", seed=3)
    parent = make_node(7, proposer="inductor", meta={"label": "freezing", "options": {"freezing": True}})
    cands = prop.propose(ctx(problem, [parent], [parent]), 200)
    mutations = [c for c in cands if c.parent is not None]
    assert mutations and all(c.parent == 7 for c in mutations)
    base = parent.meta["options"]
    for c in mutations:  # exactly the labelled knob differs from the parent's options
        opts = c.meta["options"]
        changed = {k for k in prop.space if opts.get(k, prop.space[k][0]) != base.get(k, prop.space[k][0])}
        assert changed == {c.meta["label"].split("=")[0]}
    seeds = [c for c in cands if c.parent is None and c.meta["label"] != "random"]
    assert seeds, "the stock configurations come first"


def test_no_mutations_of_foreign_parents(problem):
    foreign = make_node(9, proposer="llm")
    cands = InductorProposer("cpu", seed=4).propose(ctx(problem, [], [foreign]), 200)
    assert all(c.parent is None for c in cands)


def test_rendered_source_is_self_contained(problem):
    cands = InductorProposer("cpu", seed=5).propose(ctx(problem), 6)
    for c in cands:
        compile(c.source, "x", "exec")
        assert problem.source.rstrip() in c.source
        assert "class ModelNew(Model)" in c.source
        assert not any(m == "kernelevolve" or m.startswith("kernelevolve.") for m in imports(c.source))
        assert imports(c.source) <= {"torch", "torch.nn"}


def test_rendered_modelnew_matches_reference_state(problem):
    """ModelNew subclasses Model: same constructor, same state_dict keys (construction compiles nothing)."""
    cand = InductorProposer("cpu", seed=6).propose(ctx(problem), 2)[1]
    ns: dict = {"__name__": "cand"}
    exec(compile(cand.source, "cand.py", "exec"), ns)
    new, ref = ns["ModelNew"](64), ns["Model"](64)
    assert isinstance(new, torch.nn.Module)
    assert new.state_dict().keys() == ref.state_dict().keys()
    assert ns["COMPILE_OPTIONS"] == cand.meta["options"]


def test_cuda_knobs_absent_on_cpu(problem):
    prop = InductorProposer("cpu", seed=7)
    assert not set(CUDA_KNOBS) & set(prop.space)
    assert set(CPU_KNOBS) & set(prop.space)
    history: list[Node] = []
    for _ in range(5):
        cands = prop.propose(ctx(problem, history, history[-2:]), 10)
        history += as_nodes(cands, start=len(history) + 1)
    used = {k for n in history for k in n.meta["options"]}
    assert used and not used & set(CUDA_KNOBS)
    assert not any(k.startswith("triton.") for k in used)
    options_lines = [ln for n in history for ln in n.source.splitlines() if ln.startswith("COMPILE_OPTIONS")]
    assert len(options_lines) == len(history) and not any("triton." in ln for ln in options_lines)


def test_cuda_space_has_no_cpu_knobs():
    prop = InductorProposer("cuda")
    assert not set(CPU_KNOBS) & set(prop.space)
    assert "triton.cudagraphs" in prop.space


def test_make_proposers():
    (prop,) = make_proposers(["inductor"], "cpu")
    assert isinstance(prop, InductorProposer) and prop.device == "cpu"
    with pytest.raises(ProposerError, match="nope"):
        make_proposers(["inductor", "nope"], "cpu")


@pytest.mark.slow
def test_default_candidate_verifies_on_cpu(problem, tmp_path):
    from kernelevolve.evaluate import EvalConfig, Evaluator, Status, TimingConfig

    cand = InductorProposer("cpu").propose(ctx(problem), 1)[0]
    assert cand.meta["label"] == "default"
    cfg = EvalConfig(device="cpu", timeout_s=300, timing=TimingConfig(budget_ms=100, warmup_ms=10))
    result = Evaluator(problem, cfg, tmp_path).evaluate(cand)
    assert result.status is Status.OK, f"{result.reason}\n{result.error}\n{result.log}"
    assert result.timed and result.runtime_ms is not None and result.runtime_ms > 0
    assert result.compile_s is not None and result.compile_s > 0


def test_the_fallback_is_torch_compiles_own_kernel_as_the_search_proposes_it(problem):
    """The search loop judges the fallback at its close when the baseline's torch.compile time beats its best: it
    must be the very source the proposer's ``default`` seed renders, so that a run never judges it twice."""
    p = InductorProposer("cuda", seed=0)
    (fallback,) = p.fallbacks(problem)
    assert fallback.meta["baseline"] == "compiled" and fallback.meta["options"] == {}
    default = [c for c in p.propose(ctx(problem, device="cuda"), 8) if c.meta["label"] == "default"]
    assert [c.sha for c in default] == [fallback.sha]
