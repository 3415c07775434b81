"""Experience across runs: earlier winners are ranked by how alike their problems are, then seed the template and
inductor proposers and give the prompted proposers worked examples."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.propose.base import ProposalContext  # noqa: E402
from kernelevolve.propose.inductor import InductorProposer  # noqa: E402
from kernelevolve.propose.llm import LLMProposer  # noqa: E402
from kernelevolve.propose.template import TemplateProposer, plan_problem  # noqa: E402
from kernelevolve.search.turns import rank_experience  # noqa: E402
from tests.factories import make_experience, make_profile  # noqa: E402

SOFTMAX = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, -1)
def get_inputs(): return [torch.randn(16, 96)]
def get_init_inputs(): return []
"""


@pytest.fixture
def problem(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(textwrap.dedent(SOFTMAX))
    return load_problem(path)


entry = make_experience


def test_similar_problems_rank_first():
    entries = [entry(dtype="bfloat16", nbytes=1e6, speedup=9.0, problem="other dtype"),
               entry(nbytes=1e9, speedup=5.0, problem="far size"),
               entry(nbytes=1.5e6, speedup=1.2, problem="near, slower"),
               entry(nbytes=0.9e6, speedup=2.0, problem="near, faster"),
               entry(nbytes=None, speedup=3.0, problem="unprofiled")]
    ranked = rank_experience(entries, make_profile(dtype="float32", bytes=1e6))
    assert [e.problem for e in ranked] == ["near, faster", "near, slower", "far size", "unprofiled", "other dtype"]


def test_template_proposer_starts_from_an_earlier_winners_config(problem):
    plan = plan_problem(problem, "cpu")
    region = next(r for r in plan.regions if r.match.family == "row_reduction")
    knob = next(k for k, v in region.space.items() if len(v) > 1)
    won = dict(region.default(), **{knob: region.space[knob][-1]})
    exp = [entry(meta={"configs": [{"family": "row_reduction", "config": won}]})]
    cands = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, [], [], exp), 2)
    seeded = [c for c in cands if c.meta["label"] == "experience"]  # right after the defaults
    assert len(seeded) == 1 and seeded[0].meta["genome"][region.key][knob] == region.space[knob][-1]
    cold = TemplateProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, []), 8)
    assert not any(c.meta["label"] == "experience" for c in cold)


def test_inductor_proposer_tries_earlier_winning_options_first(problem):
    exp = [entry(proposer="inductor", meta={"options": {"coordinate_descent_tuning": True, "max_fusion_size": 16}})]
    first = InductorProposer("cpu", seed=0).propose(ProposalContext(problem, "cpu", None, [], [], exp), 1)[0]
    assert first.meta["label"] == "experience"
    assert first.meta["options"] == {"coordinate_descent_tuning": True, "max_fusion_size": 16}


class NoClient:
    def pick(self):
        return SimpleNamespace(name="none")


def test_prompts_carry_worked_examples_sharing_the_problems_families(problem):
    settings = SimpleNamespace(concurrency=1, models=())
    p = LLMProposer("cpu", settings, client=NoClient(), seed=0)
    exp = [entry(meta={"label": "mm", "configs": [{"family": "matmul", "config": {}}]}, source="# MATMUL\n",
                 problem="gemm"),
           entry(proposer="inductor", meta={"options": {}}, source="# COMPILE\n"),
           entry(meta={"label": "rows", "configs": [{"family": "row_reduction", "config": {}}]},
                 source="# ROWS\n", problem="layernorm", speedup=2.5)]
    pin = p.prompt_inputs(ProposalContext(problem, "cpu", None, [], [], exp))
    assert [ex["source"] for ex in pin.examples] == ["# ROWS\n", "# MATMUL\n"]  # shared family first; no compile
    assert pin.examples[0]["result"] == "2.50x over eager" and "layernorm" in pin.examples[0]["label"]
    from kernelevolve.propose.prompt import build_prompt

    text = build_prompt("scratch", pin).user
    assert "Worked example from an earlier run" in text and "# ROWS" in text
