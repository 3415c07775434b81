"""The screen's quick build: a candidate built without nn.init's random fills where the reference's weights replace
every tensor it holds, and built in full wherever that shortcut could change what it computes."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Evaluator, Status
from kernelevolve.evaluate.screen import ScreenConfig, Screener
from kernelevolve.evaluate.worker import _all_state_in, _no_random_init
from kernelevolve.problem import load_problem

from tests.evaluate.conftest import eval_config

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x):
        return self.lin(x)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return [64, 32]
'''

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass ModelNew(nn.Module):\n"
GENUINE = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x):
        return F.linear(x, self.lin.weight, self.lin.bias)
'''
# a transposed copy of the weight made in __init__: right only if __init__ saw the seeded initial values
DERIVED_TENSOR = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.w_t = self.lin.weight.detach().t().contiguous()

    def forward(self, x):
        return x @ self.w_t + self.lin.bias
'''
# a number derived from the initial weight in __init__ and checked in forward: a plain float, which no guard can see
DERIVED_NUMBER = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.total = float(self.lin.weight.detach().double().sum())

    def forward(self, x):
        if not abs(float(self.lin.weight.detach().double().sum()) - self.total) <= 1e-6:  # NaN fails too
            raise RuntimeError("the weights are not those __init__ saw")
        return F.linear(x, self.lin.weight, self.lin.bias)
'''


# a number taken from the initial weight in __init__ and cancelled in forward: wrong outputs if __init__ saw unset
# values (no guard can see a float)
DERIVED_OFFSET = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.first = float(self.lin.weight[0, 0])

    def forward(self, x):
        return F.linear(x, self.lin.weight, self.lin.bias) + (self.first - float(self.lin.weight[0, 0]))
'''
# fills a scratch tensor with nn.init in __init__ and relies on it: raises in __init__ when the fill does nothing
DRAWS = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        scratch = nn.init.uniform_(torch.zeros(8), 1.0, 2.0)
        if not bool((scratch >= 1.0).all()):
            raise ValueError("nn.init.uniform_ left the tensor as it was")

    def forward(self, x):
        return F.linear(x, self.lin.weight, self.lin.bias)
'''
# wrong by a constant: wrong whichever the build
WRONG = GENUINE.replace("return F.linear(x, self.lin.weight, self.lin.bias)",
                        "return F.linear(x, self.lin.weight, self.lin.bias) + 1.0")
# fails its call and leaves a thread running: the process is unfit after it
RAISES = HEAD + '''    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x):
        import threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        raise RuntimeError("no kernel for this shape")
'''


@pytest.fixture(scope="module")
def linear_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    root = tmp_path_factory.mktemp("quick-build")
    (root / "problem_linear.py").write_text(PROBLEM)
    return Evaluator(load_problem(root / "problem_linear.py"), eval_config(), root / "work")


def test_an_honest_candidate_passes_the_screen_whichever_build_it_gets(linear_evaluator):
    """Each candidate in a fresh process of its own, so that a quick build's unset weights are not left-over values
    of an earlier candidate: the plain one is built quickly; the one holding a transposed copy is built in full; the
    one whose check fails when built quickly is checked again built in full, and passes."""
    names = {"genuine": GENUINE, "derived tensor": DERIVED_TENSOR, "derived number": DERIVED_NUMBER,
             "derived offset": DERIVED_OFFSET, "draws": DRAWS}
    got = {}
    for name, source in names.items():
        with Screener(linear_evaluator, ScreenConfig(timeout_s=30.0, parallel=1, keep_processes=False)) as screen:
            got[name] = screen.screen([Candidate(source)])[0]
    assert all(r.ok for r in got.values()), got
    # "build" comes from the timing stage's reply: the quick build there too
    assert got["genuine"].details.get("build") == "quick" and got["genuine"].ms is not None
    assert "rebuilt" not in got["genuine"].details
    assert got["derived tensor"].details.get("build") is None and "rebuilt" not in got["derived tensor"].details
    assert got["derived number"].details.get("build") is None and "rebuilt" in got["derived number"].details
    assert got["derived offset"].details.get("build") is None and "rebuilt" in got["derived offset"].details


def test_a_wrong_or_failing_candidate_is_still_named_and_spoils_no_other(linear_evaluator):
    """A quick build that fails is checked again built in full, with a deadline of its own and, after a failed call,
    in a fresh process: a wrong candidate still gets its mismatch report, and one that fails its call and leaves a
    thread behind costs the genuine candidates after it nothing."""
    with Screener(linear_evaluator, ScreenConfig(timeout_s=30.0, parallel=1)) as screen:
        results = screen.screen([Candidate(s) for s in (WRONG, RAISES, GENUINE, GENUINE)])
    wrong, raises, *genuine = results
    assert wrong.status is Status.INCORRECT and wrong.details.get("mismatch"), wrong
    assert raises.status is Status.RUNTIME_ERROR and "no kernel for this shape" in raises.reason, raises
    assert not raises.harness and all(r.ok and not r.harness for r in genuine), results


def test_the_full_build_when_the_screen_is_told_so(linear_evaluator):
    with Screener(linear_evaluator, ScreenConfig(timeout_s=30.0, parallel=1, quick_build=False)) as screen:
        r = screen.screen([Candidate(GENUINE)])[0]
    assert r.ok and r.details.get("build") is None


def test_the_judge_builds_in_full(linear_evaluator):
    r = linear_evaluator.evaluate(Candidate(DERIVED_NUMBER))
    assert r.ok, f"{r.status.value}: {r.reason}"


class _Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)


def test_only_a_model_whose_every_tensor_is_in_the_weights_counts_as_covered():
    model = _Plain()
    state = model.state_dict()
    assert _all_state_in(model, state)
    assert not _all_state_in(model, {k: v for k, v in state.items() if k != "lin.bias"})
    for attach in (lambda m: setattr(m, "cache", torch.zeros(2)),
                   lambda m: setattr(m.lin, "parts", [torch.zeros(2)]),
                   lambda m: setattr(m, "table", {"a": torch.zeros(2)}),
                   lambda m: m.register_buffer("scratch", torch.zeros(2), persistent=False)):
        other = _Plain()
        attach(other)
        assert not _all_state_in(other, state)


def test_the_random_fills_come_back_after_a_build_that_raised():
    before = torch.nn.init.kaiming_uniform_
    with pytest.raises(ValueError), _no_random_init():
        t = torch.zeros(3)
        assert torch.nn.init.normal_(t) is t and bool(torch.isnan(t).all())  # NaN, not whatever t held
        ints = torch.zeros(3, dtype=torch.int64)
        assert torch.nn.init.normal_(ints) is ints and int(ints.abs().sum()) == 0  # left as it is
        raise ValueError("the candidate's __init__ failed")
    assert torch.nn.init.kaiming_uniform_ is before
    assert torch.nn.init.normal_(torch.zeros(1000)).abs().sum() > 0
