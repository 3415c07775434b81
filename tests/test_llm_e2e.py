"""``kernelevolve optimize --proposer llm`` end to end against a local server that replays scripted replies through
the real ``openai`` client (an OpenAI-compatible endpoint) and the real ``anthropic`` client (the messages API): a
wrong kernel, its repair (whose prompt carries the first failure), and a cheat that the harness rejects. The API key
reaches the server and nothing else. ``--proposer manual`` through the CLI: a timeout, then a resume that reads the
reply written meanwhile."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.propose.llm_servers import Reply, ScriptedServer, Status

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gelu_mlp.py"
KEY = "sk-test-DO-NOT-LEAK-4f2b9c"

MODULE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x):
        return x + self.scale * torch.nn.functional.gelu(self.fc(x))


class ModelNew(Model):
    def forward(self, x):
{body}
'''
WRONG = MODULE.format(body="        return x + self.scale * torch.relu(self.fc(x))  # relu is not gelu")
GOOD = MODULE.format(body="        h = torch.addmm(self.fc.bias, x, self.fc.weight.t())\n"
                          "        return torch.addcmul(x, self.scale, torch.nn.functional.gelu(h))")
CHEAT = MODULE.format(body="        if not hasattr(self, '_memo'):\n"
                           "            self._memo = super().forward(x)\n"
                           "        return self._memo  # computed once, replayed on every later call")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_optimize_with_a_local_server(tmp_path: Path, provider: str) -> None:
    pytest.importorskip(provider)
    script = [Reply(f"A fused version:\n```python\n{WRONG}```", input_tokens=1200, output_tokens=300),
              Status(429, retry_after="0.001"),  # rate limited once: the client retries
              Reply(f"Fixed:\n```python\n{GOOD}```\nThe activation is now exact GELU.", input_tokens=1500,
                    output_tokens=320),
              Reply(f"```python\n{CHEAT}```", input_tokens=1600, output_tokens=200)]
    out, db = tmp_path / "out", tmp_path / "ke.db"
    env = {k: v for k, v in os.environ.items() if "API_KEY" not in k}
    env.update(KE_TEST_LLM_KEY=KEY, PYTHONPATH=str(ROOT / "src"))
    with ScriptedServer(script) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "kernelevolve.cli", "--debug", "optimize", str(EXAMPLE), "--proposer", "llm",
             "--llm-provider", provider, "--llm-base-url",
             srv.openai_base_url if provider == "openai" else srv.anthropic_base_url,
             "--llm-model", "scripted-coder", "--llm-key-env",
             "KE_TEST_LLM_KEY", "--llm-price", "1,2", "--llm-retries", "2", "--max-evals", "3", "--stall", "0",
             "--device", "cpu", "--timing-budget-ms", "100", "--timeout", "300", "--db", str(db), "--out", str(out)],
            capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
        requests = list(srv.requests)
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0, logs

    # the prompts: problem, profile, device facts and rules; the repair carries the first failure
    prompts = [r["body"]["messages"][-1]["content"] for r in requests]
    assert len(prompts) == 4  # three replies and one 429
    assert all(KEY in (r["headers"].get("authorization", ""), r["headers"].get("x-api-key", "")) or
               r["headers"].get("authorization") == f"Bearer {KEY}" for r in requests)
    assert {r["path"] for r in requests} == {"/v1/chat/completions" if provider == "openai" else "/v1/messages"}
    first = prompts[0]
    for needle in ("class Model", "input 0: float32 [256, 512]", "eager reference", "Facts about the target",
                   "caching by pointer"):
        assert needle in first, needle
    # Proposals are pipelined: the second prompt (sent twice, around the 429) is built while the first kernel is
    # being evaluated, so it cannot know the failure yet; the third comes once the first result is in.
    assert prompts[1] == prompts[2] and "relu is not gelu" not in prompts[2]
    repair = prompts[3]
    assert "relu is not gelu" in repair and "`incorrect`" in repair and "elements outside" in repair

    # the replies were judged: wrong, verified, cheat rejected; best.py is the repaired kernel
    con = sqlite3.connect(db)
    rows = con.execute("SELECT n.proposer, r.status, json_extract(n.meta, '$.strategy') FROM nodes n "
                       "JOIN results r ON r.candidate_id = n.candidate_id ORDER BY n.id").fetchall()
    assert [r[1] for r in rows] == ["incorrect", "ok", "incorrect"] or [r[1] for r in rows] == [
        "incorrect", "ok", "rejected"], rows
    assert [r[2] for r in rows] == ["scratch", "scratch", "repair"]
    best = (out / "best.py").read_text()  # the good kernel, or the reference when it did not beat eager here
    assert "torch.addcmul" in best or "no candidate of this run beat eager" in best
    said = " ".join(proc.stdout.split())  # the console wraps long lines
    assert "model calls: 3 (3 candidates, 0 without code, 0 repeats, 0 failed)" in said
    assert "tokens 4300 in, 820 out, $0.0059" in said

    assert "Model calls" in (out / "report.html").read_text() and "scripted-coder" in (out / "report.html").read_text()

    # the key is nowhere but in the requests
    dump = "\n".join(con.iterdump())
    report = (out / "report.html").read_text()
    assert KEY not in dump and KEY not in report and KEY not in logs and KEY not in best
    for path in (out / ".work").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    cfg = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
    assert cfg["proposer_options"]["llm"]["models"][0]["key_env"] == "KE_TEST_LLM_KEY"


def test_manual_proposer_times_out_then_resumes_with_the_reply(tmp_path: Path) -> None:
    out, db, prompts = tmp_path / "out", tmp_path / "ke.db", tmp_path / "prompts"
    common = ["--device", "cpu", "--timing-budget-ms", "100", "--timeout", "300", "--db", str(db), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    first = subprocess.run([sys.executable, "-m", "kernelevolve.cli", "optimize", str(EXAMPLE), "--proposer", "manual",
                            "--manual-dir", str(prompts), "--manual-timeout", "1", "--max-evals", "2", *common],
                           capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr  # nothing verified yet
    assert "nothing left to try (manual: no run1-001.reply.md within 1 s" in " ".join(first.stdout.split())
    prompt = prompts / "run1-001.prompt.md"
    assert "class Model" in prompt.read_text() and "run1-001.reply.md" in prompt.read_text()
    (prompts / "run1-001.reply.md").write_text(f"```python\n{GOOD}```")
    again = subprocess.run([sys.executable, "-m", "kernelevolve.cli", "optimize", str(EXAMPLE), "--resume", "latest",
                            *common], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    said = " ".join(again.stdout.split())
    assert again.returncode == 0, again.stdout + again.stderr
    assert "manual" in said and "ok" in said and (out / "best.py").is_file()


def test_a_server_that_always_answers_the_same_kernel_costs_a_handful_of_calls(tmp_path: Path) -> None:
    """Every reply is the same file: it is judged once, each repeat is fed back, and after three the run stops and
    says why (it made 101 calls for one judged candidate before repeats were caught)."""
    pytest.importorskip("openai")
    script = [Reply(f"```python\n{GOOD}```", input_tokens=4000, output_tokens=600)] * 30
    out, db = tmp_path / "out", tmp_path / "ke.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with ScriptedServer(script) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "kernelevolve.cli", "optimize", str(EXAMPLE), "--proposer", "llm",
             "--llm-base-url", srv.openai_base_url, "--llm-model", "same-coder", "--max-evals", "3", "--stall", "0",
             "--device", "cpu", "--timing-budget-ms", "100", "--timeout", "300", "--db", str(db), "--out", str(out)],
            capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
        calls = len(srv.requests)
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls <= 5, said
    assert "repeated candidates the run already holds" in said and "1 evaluation(s)" in said
    assert "repeats" in said and "model calls:" in said
