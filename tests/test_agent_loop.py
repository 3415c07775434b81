"""The prompted proposers inside the real loop and judge (CPU): a manual replier whose buggy reply is judged, whose
repair prompt names the bad region and the error size, and whose fix is verified, in that order, with a verdict file
beside every reply; and a model that always answers the same kernel, which costs a handful of calls and ends the run
with the reason."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from kernelevolve.engine import LocalPool
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
from kernelevolve.problem import load_problem
from kernelevolve.propose.llm import LLMProposer
from kernelevolve.propose.manual import ManualProposer
from kernelevolve.search import GreedySelector, SearchConfig, run_search
from kernelevolve.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gelu_mlp.py"  # x [256, 512] fp32 -> [256, 512]

KERNEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x):
        out = torch.addcmul(x, self.scale, torch.nn.functional.gelu(self.fc(x)))
{bug}        return out
'''
# a store mask off by a block: columns 64-95 are never written (they stay zero)
BUGGY = KERNEL.format(bug="        out[:, 64:96] = 0\n")
FIXED = KERNEL.format(bug="")


def _loop(tmp_path: Path, proposer, max_evals: int):
    problem = load_problem(EXAMPLE, "cpu")
    store = Store(tmp_path / "ke.db")
    run_id = store.create_run(problem, "cpu", "cpu:test", {}, {})
    evaluator = Evaluator(problem, EvalConfig(device="cpu", timing=TimingConfig(budget_ms=20, warmup_ms=5)),
                          tmp_path / "work")
    pool = LocalPool(evaluator, 1)
    try:
        outcome = run_search(store, run_id, problem, "cpu", "cpu:test", pool, [proposer], GreedySelector(),
                             SearchConfig(max_evals=max_evals, stall=None), None)
    finally:
        pool.shutdown()
    return store, run_id, outcome


def test_a_bad_reply_is_judged_then_repaired_from_its_verdict(tmp_path):
    folder = tmp_path / "prompts"
    seen: list[tuple[str, str, bool]] = []  # (prompt file, its text, whether the last verdict was there first)
    stop = threading.Event()

    def replier():
        for k, reply in ((1, BUGGY), (2, FIXED)):
            prompt = folder / f"run1-{k:03d}.prompt.md"
            while not prompt.exists() and not stop.is_set():
                time.sleep(0.02)
            if stop.is_set():
                return
            seen.append((prompt.name, prompt.read_text(), (folder / f"run1-{k - 1:03d}.verdict.json").exists()))
            (folder / f"run1-{k:03d}.reply.md").write_text(f"```python\n{reply}```\n")

    thread = threading.Thread(target=replier, daemon=True)
    thread.start()
    try:
        store, run_id, outcome = _loop(tmp_path, ManualProposer("cpu", folder, timeout_s=120, seed=0), 2)
    finally:
        stop.set()
        thread.join(10)
    assert [name for name, _, _ in seen] == ["run1-001.prompt.md", "run1-002.prompt.md"]
    repair = seen[1][1]
    assert seen[1][2], "the second prompt was written before the first reply's verdict"
    assert "strategy: repair" in repair and "`incorrect`" in repair
    assert "columns 64-95" in repair  # where the errors are
    assert "max abs err" in repair  # and how large
    first = json.loads((folder / "run1-001.verdict.json").read_text())
    second = json.loads((folder / "run1-002.verdict.json").read_text())
    assert first["status"] == "incorrect" and first["judged"] and first["mismatch"]
    assert second["status"] == "ok" and second["judged"]
    assert "columns 64-95" in (folder / "run1-001.verdict.md").read_text()
    assert outcome.best is not None and outcome.best.parent == outcome.best.id - 1
    assert [c["strategy"] for c in store.llm_calls(run_id)] == ["scratch", "repair"]
    # best.py starts with where it came from
    from kernelevolve.report import write_outputs

    files, _ = write_outputs(store, run_id, tmp_path / "out")
    best = files["best"].read_text()
    head = best.splitlines()[:3]
    assert head[0].startswith("# kernelevolve: run 1 of gelu_mlp on cpu:test"), head
    assert head[1].startswith(f"# node {outcome.best.id}, proposer manual (repair (manual))"), head
    assert head[2].startswith("# verdict: ok: verified"), head
    compile(best, "best.py", "exec")


class SameKernel:
    """A model that answers every prompt with the same file."""

    def __init__(self, source: str):
        self.source, self.prompts = source, []

    def pick(self):
        return SimpleNamespace(name="same-model")

    def complete(self, system, user, spec=None):
        self.prompts.append(user)
        return SimpleNamespace(text=f"```python\n{self.source}```", model="same-model", input_tokens=4000,
                               output_tokens=600, cost_usd=None, latency_s=0.0)


def test_a_model_that_repeats_itself_costs_a_handful_of_calls_and_says_why_the_run_stopped(tmp_path):
    settings = SimpleNamespace(concurrency=4, models=(SimpleNamespace(name="same-model", key_env=None),))
    client = SameKernel(FIXED)
    store, run_id, outcome = _loop(tmp_path, LLMProposer("cpu", settings, client=client, seed=0), 3)
    calls = store.llm_calls(run_id)
    assert outcome.evaluations == 1
    assert len(calls) <= 5, [c["status"] for c in calls]  # one judged candidate, then a few repeats
    assert [c["status"] for c in calls].count("repeat") == 4
    assert "repeated candidates the run already holds" in outcome.stop_reason
    assert "identical to node" in client.prompts[-1]
