"""State the reference's forward writes: every judged and timed call starts from the initial state on both sides, a
buffer the forward rebinds is read again after the call, and a copy of the reference is ok whatever its forward does
with its state."""
from __future__ import annotations

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Evaluator, Status
from kernelevolve.problem import load_problem
from tests.evaluate.conftest import eval_config

TAIL = '''

def get_inputs():
    return [torch.randn(64, 16)]


def get_init_inputs():
    return []
'''
PROBLEMS = {
    # the output reads the state the forward writes: a timed repetition must start where a judged call starts
    "counter": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count
''',
    # the forward rebinds its buffer rather than writing it in place
    "rebind": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.zeros(16))

    def forward(self, x):
        self.ema = 0.9 * self.ema + 0.1 * x.mean(0)
        return x * 2
''',
    # a buffer outside the state_dict
    "non_persistent": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(16), persistent=False)

    def forward(self, x):
        self.seen.add_(x.abs().amax(0))
        return x + self.seen
''',
    # a parameter the forward writes (a decaying weight)
    "parameter": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16), requires_grad=False)

    def forward(self, x):
        self.scale.mul_(1.01)
        return x * self.scale
''',
    # a growing cache: the forward rebinds its buffer with a new shape
    "grow": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 16))

    def forward(self, x):
        self.cache = torch.cat([self.cache, x[:1]], 0)
        return x * 2 + self.cache.sum()
''',
}
COPY = "\n\nclass ModelNew(Model):\n    pass\n"
FORGETS = {  # the same outputs from a state that never moves
    "counter": "\n\nclass ModelNew(Model):\n    def forward(self, x):\n        return x * 1.0\n",
    "rebind": "\n\nclass ModelNew(Model):\n    def forward(self, x):\n        return x * 2\n",
}


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_a_copy_of_a_stateful_reference_is_ok(name, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEMS[name] + TAIL)
    problem = load_problem(path)
    assert problem.mutated_state
    r = Evaluator(problem, eval_config(), tmp_path / "w").evaluate(Candidate(PROBLEMS[name] + COPY + TAIL))
    assert r.status == Status.OK, f"{r.status.value}: {r.reason}\n{r.error[-800:]}"
    assert r.timing is not None


@pytest.mark.parametrize("name", sorted(FORGETS))
def test_a_candidate_that_leaves_the_state_alone_is_incorrect(name, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEMS[name] + TAIL)
    problem = load_problem(path)
    r = Evaluator(problem, eval_config(), tmp_path / "w").evaluate(Candidate(PROBLEMS[name] + FORGETS[name] + TAIL))
    assert r.status == Status.INCORRECT, f"{r.status.value}: {r.reason}"
