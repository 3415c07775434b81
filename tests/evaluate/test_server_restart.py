"""A candidate that kills the fork server must not expose secrets to later candidates."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig
    from kernelevolve.problem import load_problem

    cheats = sys.argv[1]
    ev = Evaluator(load_problem(cheats + "/problem_scale.py"),
                   EvalConfig(device="cpu", timeout_s=60, timing=TimingConfig(budget_ms=10, warmup_ms=2, max_reps=5)))
    killer = open(cheats + "/genuine_torch.py").read() + "\\nimport os, signal\\nos.kill(os.getppid(), signal.SIGKILL)\\n"
    ev.evaluate(Candidate(killer))
    probe = open(cheats + "/secrets_probe.py").read()
    r = ev.evaluate(Candidate(probe))
    print(json.dumps({"status": r.status.value, "reason": r.reason}))
''')


def test_secrets_stay_hidden_after_the_fork_server_is_killed():
    env = dict(os.environ, OPENAI_API_KEY="sk-test-secret", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tests" / "cheats")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"status": "ok"' in proc.stdout.strip().splitlines()[-1], proc.stdout
