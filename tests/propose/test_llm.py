"""The llm and manual proposers with a scripted client: strategies chosen from the tree, repair prompts that carry the
failure, replies without code recorded as failures, giving up on a dead endpoint, and the reply-file protocol."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Result, Status, Timing
from kernelevolve.problem import load_problem
from kernelevolve.propose.base import ProposalContext
from kernelevolve.propose.llm import ExpandConfig, Expander, LLMProposer
from kernelevolve.propose.manual import ManualProposer
from kernelevolve.store import Store
from tests.factories import make_node

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gelu_mlp.py"
GOOD = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # {tag}\n"


@dataclass
class FakeCompletion:
    text: str
    model: str = "fake-model"
    input_tokens: int = 100
    output_tokens: int = 50
    cost_usd: float | None = 0.001
    latency_s: float = 0.01


class FakeError(Exception):
    kind = "server"


class FakeClient:
    """Replies from a script; an Exception item is raised as a failed call."""

    def __init__(self, script):
        self.script, self.prompts = list(script), []
        self.lock = threading.Lock()

    def pick(self):
        return SimpleNamespace(name="fake-model")

    def complete(self, system, user, spec=None):
        with self.lock:
            self.prompts.append(user)
            item = self.script.pop(0) if self.script else "no more replies"
        if isinstance(item, Exception):
            raise item
        return FakeCompletion(item)


@pytest.fixture
def problem():
    return load_problem(EXAMPLE, "cpu")


@pytest.fixture
def store(tmp_path, problem):
    s = Store(tmp_path / "ke.db")
    s.run_id = s.create_run(problem, "cpu", "cpu:test", {}, {})
    yield s
    s.close()


def make_llm(monkeypatch, script, store=None, **expand):
    from kernelevolve.propose import providers

    monkeypatch.setattr(providers, "LLMError", FakeError)
    settings = SimpleNamespace(concurrency=2, models=(SimpleNamespace(name="fake-model", key_env=None),))
    p = LLMProposer("cpu", settings, client=FakeClient(script), seed=0, expand=ExpandConfig(**expand))
    if store is not None:
        p.bind(store, store.run_id)
    return p


def ctx(problem, history=()):
    return ProposalContext(problem, "cpu", None, list(history))


def node(i, status=Status.OK, ms=1.0, parent=None, proposer="llm"):
    timing = Timing.from_samples([ms], "perf_counter") if ms is not None else None
    result = Result(status, "verified" if status is Status.OK else "output 0 mismatch: max abs err 9",
                    timing=timing, timed=ms is not None)
    return make_node(i, result, parent, proposer, meta={"label": f"n{i}"}, source=GOOD.format(tag=i))


def test_good_reply_becomes_a_candidate_and_the_call_is_recorded(monkeypatch, problem, store):
    p = make_llm(monkeypatch, [f"Sure.\n```python\n{GOOD.format(tag='a')}```"], store)
    cands = p.propose(ctx(problem), 1)
    assert len(cands) == 1 and "# a" in cands[0].source and cands[0].proposer == "llm"
    assert cands[0].meta["strategy"] == "scratch" and cands[0].parent is None
    calls = store.llm_calls(store.run_id)
    assert [(c["status"], c["model"], c["input_tokens"]) for c in calls] == [("candidate", "fake-model", 100)]
    usage = store.llm_usage(store.run_id)
    assert usage["calls"] == 1 and usage["cost_usd"] == pytest.approx(0.001)
    assert "class Model" in p.client.prompts[0]


def test_reply_without_code_is_a_recorded_failure_not_a_crash(monkeypatch, problem, store):
    p = make_llm(monkeypatch, ["I would rather not.", f"```python\n{GOOD.format(tag='b')}```"], store)
    cands = p.propose(ctx(problem), 1)  # the first reply has no code: the proposer asks again
    assert len(cands) == 1 and "# b" in cands[0].source
    assert [c["status"] for c in store.llm_calls(store.run_id)] == ["no_code", "candidate"]
    assert "no code block" in store.llm_calls(store.run_id)[0]["detail"]


def test_dead_endpoint_stops_the_proposer(monkeypatch, problem, store):
    p = make_llm(monkeypatch, [FakeError("HTTP 500")] * 10, store, max_failed_calls=3)
    assert p.propose(ctx(problem), 1) == []
    assert p.propose(ctx(problem), 1) == []  # and stays stopped
    calls = store.llm_calls(store.run_id)
    assert len(calls) == 3 and all(c["status"] == "error" and "HTTP 500" in c["detail"] for c in calls)


def test_failed_llm_node_is_repaired_with_its_failure_in_the_prompt(monkeypatch, problem):
    p = make_llm(monkeypatch, [f"```python\n{GOOD.format(tag='fixed')}```"])
    history = [node(1, Status.INCORRECT, None)]
    cands = p.propose(ctx(problem, history), 1)
    assert cands[0].meta["strategy"] == "repair" and cands[0].parent == 1
    assert "max abs err 9" in p.client.prompts[0] and "# 1" in p.client.prompts[0]


def test_expander_strategies():
    ex = Expander("llm", ExpandConfig(explore=0.0), __import__("random").Random(0))
    assert [s for s, _, _ in ex.plan([], 2)] == ["scratch", "scratch"]
    fast = node(1, ms=1.0, proposer="template")
    assert ex.plan([fast], 1)[0][:2] == ("improve", fast)
    kids = [node(2, ms=2.0, parent=1), node(3, ms=3.0, parent=1)]
    step = ex.plan([fast, *kids], 1)[0]
    assert step[0] == "contrast" and step[1] is fast and len(step[2]) == 2


def test_expander_gives_up_a_lineage_that_keeps_failing():
    ex = Expander("llm", ExpandConfig(explore=0.0, max_repairs=2), __import__("random").Random(0))
    chain = [node(1, Status.INCORRECT, None), node(2, Status.INCORRECT, None, parent=1),
             node(3, Status.COMPILE_ERROR, None, parent=2)]
    assert ex.plan(chain[:2], 1)[0][:2] == ("repair", chain[1])
    assert ex.plan(chain, 1)[0][0] == "scratch"  # three failures in a row: no more repairs of this lineage


def test_expander_leaves_a_node_whose_children_keep_failing():
    ex = Expander("llm", ExpandConfig(explore=0.0, max_child_failures=2, max_repairs=0),
                  __import__("random").Random(0))
    best, other = node(1, ms=1.0, proposer="template"), node(2, ms=5.0, proposer="template")
    failing = [node(3, Status.INCORRECT, None, parent=1), node(4, Status.INCORRECT, None, parent=1)]
    for _ in range(5):
        assert ex.plan([best, other, *failing], 1)[0][1] is other


def test_expander_spreads_steps_over_the_fastest_nodes():
    ex = Expander("llm", ExpandConfig(explore=0.0), __import__("random").Random(1))
    nodes = [node(i, ms=float(i), proposer="template") for i in range(1, 5)]
    parents = {step[1].id for step in ex.plan(nodes, 30)}
    assert parents == {1, 2, 3}  # the top 3, not only the fastest, and never the 4th


def test_key_env_is_kept_from_candidate_processes(monkeypatch):
    from kernelevolve.evaluate import checks

    settings = SimpleNamespace(concurrency=1, models=(SimpleNamespace(name="m", key_env="MY_LLM_CREDS"),))
    LLMProposer("cpu", settings, client=FakeClient([]))
    env = checks.scrub_environment({"MY_LLM_CREDS": "abc", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}


def test_manual_proposer_writes_the_prompt_and_reads_the_reply(problem, store, tmp_path):
    p = ManualProposer("cpu", tmp_path / "prompts", timeout_s=20, seed=0)
    p.bind(store, store.run_id)

    def answer():
        prompt = tmp_path / "prompts" / f"run{store.run_id}-001.prompt.md"
        while not prompt.exists():
            time.sleep(0.05)
        assert "class Model" in prompt.read_text()
        tmp = prompt.with_name(f"run{store.run_id}-001.reply.md.tmp")
        tmp.write_text(f"```python\n{GOOD.format(tag='manual')}```")
        tmp.replace(prompt.with_name(f"run{store.run_id}-001.reply.md"))

    t = threading.Thread(target=answer)
    t.start()
    cands = p.propose(ctx(problem), 3)
    t.join()
    assert len(cands) == 1 and "# manual" in cands[0].source and cands[0].proposer == "manual"
    assert store.llm_calls(store.run_id)[0]["status"] == "candidate"


def test_manual_proposer_times_out_and_asks_for_the_same_file_on_resume(problem, store, tmp_path):
    p = ManualProposer("cpu", tmp_path / "prompts", timeout_s=0.3, seed=0)
    p.bind(store, store.run_id)
    assert p.propose(ctx(problem), 1) == [] and p.done()
    assert store.llm_calls(store.run_id) == []  # nobody answered: not a failed call
    reply = tmp_path / "prompts" / f"run{store.run_id}-001.reply.md"
    reply.write_text(f"```python\n{GOOD.format(tag='late')}```")
    again = ManualProposer("cpu", tmp_path / "prompts", timeout_s=5, seed=0)  # the resumed run
    again.bind(store, store.run_id)
    cands = again.propose(ctx(problem), 1)
    assert len(cands) == 1 and "# late" in cands[0].source


def test_candidates_are_plain_candidates():
    assert Candidate(GOOD.format(tag=1), proposer="llm").language == "torch"


# --- lines of work, repeats and the run's model budget ------------------------------------------------------------
def pending_node(i, proposer="llm"):
    return make_node(i, None, None, proposer, meta={"label": f"n{i}"}, source=GOOD.format(tag=i))


def test_a_line_of_work_waits_for_the_verdict_of_its_last_reply(monkeypatch, problem, store):
    """With one line (concurrency 1, the manual case) no prompt is written while the last reply is being judged; once
    its verdict is in, the next step repairs it."""
    p = make_llm(monkeypatch, [f"```python\n{GOOD.format(tag='fixed')}```"], store)
    p.concurrency = 1
    assert p.propose(ctx(problem, [pending_node(1)]), 1) == [] and p.client.prompts == []
    assert not p.done()  # waiting, not stopped
    cands = p.propose(ctx(problem, [node(1, Status.INCORRECT, None)]), 1)
    assert cands[0].meta["strategy"] == "repair" and cands[0].parent == 1
    assert len(p.client.prompts) == 1


def test_several_lines_of_work_stay_in_flight(monkeypatch, problem, store):
    replies = [f"```python\n{GOOD.format(tag=t)}```" for t in "abc"]
    p = make_llm(monkeypatch, replies, store)  # concurrency 2
    assert len(p.propose(ctx(problem, [pending_node(1)]), 4)) == 1  # one of two lines is free
    assert p.propose(ctx(problem, [pending_node(1), pending_node(2)]), 4) == []


def test_a_screen_failure_is_repaired_like_a_judged_one(monkeypatch, problem, store):
    from kernelevolve.evaluate.result import ScreenResult
    from dataclasses import replace

    p = make_llm(monkeypatch, [f"```python\n{GOOD.format(tag='fixed')}```"], store)
    screened = replace(pending_node(1), screen=ScreenResult(Status.INCORRECT, "output: 7 of 64 elements outside atol"))
    cands = p.propose(ctx(problem, [screened]), 1)
    assert cands[0].meta["strategy"] == "repair" and "7 of 64 elements outside atol" in p.client.prompts[0]


def test_replies_that_repeat_a_known_candidate_are_fed_back_then_stop_their_line_then_the_proposer(
        monkeypatch, problem, store):
    same = f"```python\n{GOOD.format(tag=1)}```"  # node 1's source, already judged
    p = make_llm(monkeypatch, [same] * 10, store, max_repeats=3, max_repeats_total=4)
    judged = node(1, Status.INCORRECT, None)
    assert p.propose(ctx(problem, [judged]), 1) == []
    calls = store.llm_calls(store.run_id)
    # three repairs of node 1 repeat it: that line stops; the scratch line's first repeat is the fourth in a row
    assert [(c["status"], c["strategy"]) for c in calls] == [("repeat", "repair")] * 3 + [("repeat", "scratch")]
    assert "identical to node 1" in calls[0]["detail"] and "judged incorrect" in calls[0]["detail"]
    assert "Your last reply was identical to node 1" in p.client.prompts[1]  # fed back in the next prompt
    assert "Your last reply" not in p.client.prompts[0]
    assert p.done() and "4 replies in a row repeated" in p.stopped and p.expander.stale == {1}
    assert p.propose(ctx(problem, [judged]), 1) == [] and len(p.client.prompts) == 4
    assert store.llm_usage(store.run_id)["repeats"] == 4


def test_a_line_of_work_that_only_repeats_stops_and_the_others_go_on(monkeypatch, problem, store):
    same = f"```python\n{GOOD.format(tag=1)}```"
    p = make_llm(monkeypatch, [same] * 3 + [f"```python\n{GOOD.format(tag='new')}```"], store, max_repeats=3,
                 max_repeats_total=10)
    cands = p.propose(ctx(problem, [node(1, Status.INCORRECT, None)]), 1)
    assert len(cands) == 1 and cands[0].meta["strategy"] == "scratch" and not p.done()
    assert p.expander.stale == {1} and p.repeats[None] == 0


def test_identical_replies_within_one_batch_count_against_nothing(monkeypatch, problem, store):
    """Identical prompts sent at once (several scratch steps) may come back identical: one is a candidate, the
    others are recorded as repeats, and no line of work is stopped for it."""
    same = f"```python\n{GOOD.format(tag='x')}```"
    p = make_llm(monkeypatch, [same] * 4, store, max_repeats=1, max_repeats_total=1)
    p.concurrency = 4
    assert len(p.propose(ctx(problem), 4)) == 1
    assert not p.done() and p.expander.stale == set() and p.notes == []


def test_a_repeat_within_one_batch_is_caught(monkeypatch, problem, store):
    same = f"```python\n{GOOD.format(tag='x')}```"
    p = make_llm(monkeypatch, [same, same], store)
    cands = p.propose(ctx(problem), 2)
    assert len(cands) == 1
    calls = store.llm_calls(store.run_id)
    assert sorted(c["status"] for c in calls) == ["candidate", "repeat"]
    assert "another reply of the same batch" in [c["detail"] for c in calls if c["status"] == "repeat"][0]


@pytest.mark.parametrize("limits, fragment", [
    ({"calls": 2}, "2 calls of 2"),
    ({"calls": None, "tokens": 300}, "300 tokens of 300"),  # 150 tokens a call
    ({"calls": None, "tokens": None, "cost_usd": 0.002}, "$0.00 of $0.002"),
])
def test_the_model_budget_stops_the_proposer(monkeypatch, problem, store, limits, fragment):
    from kernelevolve.propose.llm import SpendLimits

    p = make_llm(monkeypatch, ["no code here"] * 10, store)
    p.limits = SpendLimits(**{"calls": None, "tokens": None, "cost_usd": None, **limits})
    assert p.propose(ctx(problem), 1) == []
    assert len(store.llm_calls(store.run_id)) == 2 and p.done() and "budget is spent" in p.stopped
    assert fragment.split(" of ")[1] in p.stopped


def test_a_resumed_run_counts_its_earlier_calls_against_the_budget(monkeypatch, problem, store):
    from kernelevolve.propose.llm import SpendLimits

    for _ in range(3):
        store.add_llm_call(store.run_id, "llm", "fake-model", "scratch", "no_code", "", None, 10, 10)
    p = make_llm(monkeypatch, [f"```python\n{GOOD.format(tag='a')}```"], store)
    p.limits = SpendLimits(calls=3)
    assert p.propose(ctx(problem), 1) == [] and p.client.prompts == [] and "3 calls of 3" in p.stopped


def test_manual_replies_get_their_verdicts_beside_them(problem, store, tmp_path):
    import json

    from kernelevolve.evaluate.result import Result

    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / f"run{store.run_id}-001.reply.md").write_text("no code, sorry")
    (folder / f"run{store.run_id}-002.reply.md").write_text(f"```python\n{GOOD.format(tag='m')}```")
    p = ManualProposer("cpu", folder, timeout_s=5, seed=0)
    p.bind(store, store.run_id)
    cands = p.propose(ctx(problem), 1)
    first = json.loads((folder / f"run{store.run_id}-001.verdict.json").read_text())
    assert first["status"] == "no_code" and not first["judged"]
    assert "no code block" in (folder / f"run{store.run_id}-001.verdict.md").read_text()
    assert cands[0].meta["reply"] == f"run{store.run_id}-002.reply.md"
    assert store.llm_calls(store.run_id)[1]["input_tokens"] > 100  # the prompt's size, estimated
    wrong = make_node(7, Result(Status.INCORRECT, "output: 3 of 10 elements outside atol"), None, "manual",
                      meta=cands[0].meta, source=cands[0].source)
    p.observe(wrong)
    verdict = json.loads((folder / f"run{store.run_id}-002.verdict.json").read_text())
    assert verdict["status"] == "incorrect" and verdict["node"] == 7 and verdict["judged"]
    assert "3 of 10 elements outside atol" in (folder / f"run{store.run_id}-002.verdict.md").read_text()


def test_the_budget_is_the_runs_whatever_proposer_spends_it(monkeypatch, problem, store, tmp_path):
    from kernelevolve.propose.llm import SpendLimits

    a = make_llm(monkeypatch, ["no code"] * 5, store)
    b = make_llm(monkeypatch, ["no code"] * 5, store)
    for p in (a, b):
        p.limits = SpendLimits(calls=3, tokens=None, cost_usd=None)
    a.propose(ctx(problem), 2)  # two calls: the limit leaves one
    b.propose(ctx(problem), 2)
    assert len(store.llm_calls(store.run_id)) == 3 and b.done() and "3 calls of 3" in b.stopped


def test_a_manual_verdict_goes_only_beside_a_reply_of_its_own_run(problem, store, tmp_path):
    from kernelevolve.evaluate.result import Result

    p = ManualProposer("cpu", tmp_path, timeout_s=1, seed=0)
    p.bind(store, store.run_id)
    other = make_node(3, Result(Status.OK, "verified"), None, "manual", meta={"reply": "run99-001.reply.md"})
    p.observe(other)  # a kernel an earlier run verified, reused here: its verdict file is that run's
    assert not list(tmp_path.glob("*.verdict.*"))


def test_the_screens_compile_error_is_fed_back_with_the_candidates_line(monkeypatch, problem, store):
    from dataclasses import replace

    from kernelevolve.evaluate.result import ScreenResult

    source = GOOD.format(tag=1).replace("return x", "return x.no_such_method()")
    error = ('Traceback (most recent call last):\n  File "/w/screen_abc_1.py", line 5, in forward\n'
             '    return x.no_such_method()  # 1\nAttributeError: no_such_method\n')
    sc = ScreenResult(Status.RUNTIME_ERROR, "AttributeError: no_such_method", error=error)
    screened = replace(make_node(1, None, None, "llm", meta={"label": "n1"}, source=source), screen=sc)
    p = make_llm(monkeypatch, [f"```python\n{GOOD.format(tag='fixed')}```"], store)
    p.propose(ctx(problem, [screened]), 1)
    assert "line 5" in p.client.prompts[0] and "x.no_such_method()" in p.client.prompts[0]
    assert "found by the screen's one check" in p.client.prompts[0]
