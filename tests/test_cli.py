"""The CLI as a user runs it: a subprocess, its exit code, stdout and stderr."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernelevolve.store import Store
from test_problem import BAD, write_bad

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(32, 64)]


def get_init_inputs():
    return [64]
'''

GOOD_CAND = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.addmm(self.fc.bias, x, self.fc.weight.t()).clamp_min(0)
'''

WRONG_CAND = GOOD_CAND.replace(".clamp_min(0)", ".clamp_min(0) + 1")
JSON_KEYS = {"status", "reason", "runtime_ms", "speedup_eager", "speedup_compile"}
FAST = ["--no-baseline", "--timing-budget-ms", "50", "--timeout", "300"]


def ke(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelevolve.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    out = {"dir": d}
    for name, text in [("problem", PROBLEM), ("good", GOOD_CAND), ("wrong", WRONG_CAND)]:
        out[name] = d / f"{name}.py"
        out[name].write_text(text)
    for case in BAD:
        out[f"bad:{case}"] = write_bad(d, case)
    return out


@pytest.fixture(scope="module")
def bad_runs(files) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every bad problem through `check` and `inspect`, run concurrently: each subprocess spends seconds importing torch."""
    jobs = {(case, cmd): ([cmd, files[f"bad:{case}"]] + ([files["good"]] if cmd == "check" else []))
            for case in BAD for cmd in ("check", "inspect")}
    with ThreadPoolExecutor(max_workers=min(8, 2 * (os.cpu_count() or 1))) as pool:
        futures = {key: pool.submit(ke, *args, cwd=files["dir"]) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


@pytest.mark.parametrize("cmd", ["check", "inspect"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_problem_exits_2_with_one_line(bad_runs, files, case, cmd):
    p = bad_runs[(case, cmd)]
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1, p.stderr
    assert str(files[f"bad:{case}"]) in lines[0]
    assert BAD[case][1] in lines[0]
    assert "Traceback" not in p.stderr + p.stdout


def test_debug_shows_traceback(files):
    p = ke("--debug", "inspect", files["bad:forward_raises"], cwd=files["dir"])
    assert p.returncode == 2
    assert "Traceback" in p.stderr and "ProblemError" in p.stderr and "forward exploded" in p.stderr


def test_check_good_candidate(files):
    p = ke("check", files["problem"], files["good"], "--json", *FAST, cwd=files["dir"])
    assert p.returncode == 0, p.stdout + p.stderr
    (line,) = p.stdout.strip().splitlines()
    payload = json.loads(line)
    assert JSON_KEYS <= set(payload)
    assert payload["status"] == "ok" and payload["reason"]
    assert isinstance(payload["runtime_ms"], float) and payload["runtime_ms"] > 0
    assert payload["speedup_eager"] is None and payload["speedup_compile"] is None  # --no-baseline


def test_check_wrong_candidate(files):
    p = ke("check", files["problem"], files["wrong"], "--json", *FAST, cwd=files["dir"])
    assert p.returncode == 1, p.stdout + p.stderr
    payload = json.loads(p.stdout)
    assert payload["status"] == "incorrect" and payload["reason"]
    assert payload["runtime_ms"] is None


def test_check_wrong_candidate_plain_text(files):
    p = ke("check", files["problem"], files["wrong"], *FAST, cwd=files["dir"])
    assert p.returncode == 1
    assert p.stdout.startswith("incorrect: ")


def test_check_missing_candidate(files):
    missing = files["dir"] / "no_such_candidate.py"
    p = ke("check", files["problem"], missing, *FAST, cwd=files["dir"])
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert str(missing) in line and "Traceback" not in p.stderr


def test_check_usage_error(files):
    assert ke("check", files["problem"], cwd=files["dir"]).returncode == 2  # argparse: candidate missing


def test_inspect_good_problem(files):
    p = ke("inspect", files["problem"], "--device", "cpu", cwd=files["dir"])
    assert p.returncode == 0, p.stderr
    assert "problem problem" in p.stdout and "float32" in p.stdout
    assert "GFLOP" in p.stdout and "bound" in p.stdout and "ceilings" in p.stdout
    assert any(b in p.stdout for b in ("compute", "memory", "overhead", "latency"))


@pytest.mark.parametrize("args", [["runs"], ["show", "latest"], ["show", "1"], ["report", "latest"]])
def test_store_commands_on_missing_db(tmp_path, args):
    db = tmp_path / "absent.db"
    p = ke(*args, "--db", db, cwd=tmp_path)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert str(db) in line and "Traceback" not in p.stderr
    assert not db.exists()


def test_store_commands_on_empty_db(tmp_path):
    db = tmp_path / "empty.db"
    Store(db).close()
    assert ke("runs", "--db", db, cwd=tmp_path).returncode == 0
    p = ke("show", "7", "--db", db, cwd=tmp_path)
    assert p.returncode == 2 and "no run" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_check_with_baseline_reports_speedups(files):
    p = ke("check", files["problem"], files["good"], "--json", "--timing-budget-ms", "50", "--timeout", "300",
           cwd=files["dir"])
    assert p.returncode == 0, p.stdout + p.stderr
    payload = json.loads(p.stdout)
    assert payload["status"] == "ok"
    for key in ("speedup_eager", "speedup_compile", "eager_ms", "compile_ms"):
        assert isinstance(payload[key], float) and payload[key] > 0, (key, payload)


def test_prompt_previews_the_next_step(tmp_path, capsys):
    from kernelevolve.candidate import Candidate
    from kernelevolve.cli import main
    from kernelevolve.evaluate.result import Result, Status
    from kernelevolve.problem import load_problem

    example = Path(__file__).resolve().parents[1] / "examples" / "gelu_mlp.py"
    assert main(["prompt", str(example), "--device", "cpu", "--no-profile"]) == 0
    out = capsys.readouterr().out
    assert "class Model" in out and "caching by pointer" in out and "strategy scratch" in out

    db = tmp_path / "ke.db"
    store = Store(db)
    problem = load_problem(example, "cpu")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    node = store.add_node(run, problem.sha, "cpu:test", Candidate("class ModelNew: pass  # BROKEN\n",
                                                                   proposer="llm", meta={"label": "x"})).id
    store.save_result(node, Result(Status.COMPILE_ERROR, "NameError: torch is not defined"))
    store.close()
    assert main(["prompt", str(example), "--device", "cpu", "--run", "latest", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"strategy repair from node {node}" in out and "# BROKEN" in out and "torch is not defined" in out


def test_optimize_help_lists_every_proposer_and_the_model_budget(capsys):
    import pytest as _pytest

    from kernelevolve.cli import main

    with _pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("template", "inductor", "llm", "manual", "--llm-calls", "--llm-tokens", "--llm-cost"):
        assert name in text, name


@pytest.mark.parametrize("columns, whole", [(250, True), (80, False)])
def test_show_gives_a_reason_the_width_the_terminal_has(tmp_path, monkeypatch, capsys, columns, whole):
    from kernelevolve.candidate import Candidate
    from kernelevolve.cli import main
    from kernelevolve.evaluate.result import Result, Status
    from kernelevolve.problem import load_problem
    from kernelevolve.store import Store

    problem = load_problem(Path(__file__).resolve().parents[1] / "examples" / "gelu_mlp.py", "cpu")
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    node = store.add_node(run, problem.sha, "cpu:test", Candidate("x = 1\n", proposer="manual"))
    reason = "trial 1 shape 0: output: 8188 of 131072 elements outside atol=0.001 rtol=0.001; max abs err 4.67 " \
             "(out 0 vs ref 4.67242) and the last words"
    store.save_result(node.id, Result(Status.INCORRECT, reason))
    store.close()
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["show", "latest", "--db", str(tmp_path / "ke.db")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("and the last words" in out) == whole and "8188 of 131072" in out


def test_show_diff_labels_each_side_with_its_own_node(tmp_path, capsys):
    from kernelevolve.candidate import Candidate
    from kernelevolve.cli import main
    from kernelevolve.evaluate.result import Result, Status
    from kernelevolve.problem import load_problem

    problem = load_problem(Path(__file__).resolve().parents[1] / "examples" / "gelu_mlp.py", "cpu")
    store = Store(tmp_path / "ke.db")
    run = store.create_run(problem, "cpu", "cpu:test", {}, {})
    parent = store.add_node(run, problem.sha, "cpu:test", Candidate("x = 1\n", proposer="manual"))
    child = store.add_node(run, problem.sha, "cpu:test", Candidate("x = 2\n", proposer="manual", parent=parent.id))
    for n in (parent, child):
        store.save_result(n.id, Result(Status.INCORRECT, "wrong"))
    store.close()
    assert main(["show", "latest", "--db", str(tmp_path / "ke.db"), "--diff", str(child.id)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"--- node {parent.id}", f"+++ node {child.id}"] and "-x = 1" in lines and "+x = 2" in lines


def _subparsers():
    import argparse

    from kernelevolve.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_argument_has_help(command):
    missing = [a.option_strings or a.dest for a in _subparsers()[command]._actions if not a.help]
    assert not missing, missing


def test_optimize_help_gives_defaults_and_exit_codes(capsys):
    from kernelevolve.cli import main

    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    out = capsys.readouterr().out
    text = " ".join(out.split())
    for said in ("the problem file", "(default: 20)", "(default: kernelevolve.db)", "(default: kernelevolve-out)",
                 "exit codes: 0 a candidate was verified", "1 no candidate was verified", "2 a usage error",
                 "130 interrupted"):
        assert said in text, said
    assert "(default: None)" not in text and "(default: False)" not in text
    assert text.count("(default: template,inductor)") <= 1  # said once, where the help already says it
    assert max(map(len, out[out.index("exit codes:"):].splitlines())) <= 79


@pytest.mark.parametrize("argv", [["--debug", "runs"], ["runs", "--debug"]])
def test_debug_goes_before_or_after_the_subcommand(argv):
    from kernelevolve.cli import build_parser

    assert build_parser().parse_args(argv).debug is True
    assert build_parser().parse_args(argv[1:] if argv[0] == "--debug" else argv[:1]).debug is False


def test_debug_after_the_subcommand_shows_traceback(files):
    p = ke("inspect", files["bad:forward_raises"], "--debug", cwd=files["dir"])
    assert p.returncode == 2
    assert "Traceback" in p.stderr and "forward exploded" in p.stderr


@pytest.mark.parametrize("columns", [80, 250])
def test_runs_is_readable_at_the_terminal_width(tmp_path, monkeypatch, capsys, columns):
    from kernelevolve.cli import main
    from kernelevolve.problem import load_problem

    problem = load_problem(Path(__file__).resolve().parents[1] / "examples" / "gelu_mlp.py", "cpu")
    store = Store(tmp_path / "ke.db")
    for _ in range(2):
        run = store.create_run(problem, "cuda", "cuda:NVIDIA H100 80GB HBM3", {}, {})
        store.update_run(run, status="finished", stop_reason="stalled: 10 evaluations without a new best")
    store.close()
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["runs", "--db", str(tmp_path / "ke.db")]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= columns and "…" not in out  # nothing cut
    text = " ".join(out.split())
    for said in ("gelu_mlp", "finished", "cuda:NVIDIA H100 80GB HBM3", "stalled: 10 evaluations without a new best"):
        assert said in text, said


def test_cpu_default_proposers_favour_what_the_cpu_times(files):
    from kernelevolve.cli import build_parser, cpu_note, optimize_config

    args = build_parser().parse_args(["optimize", str(files["problem"]), "--max-evals", "6"])
    cpu = optimize_config(args, "cpu")
    assert cpu.proposers == ("inductor", "template") and cpu.proposer_options["template_max"] == 2
    note = cpu_note(cpu)
    assert "verified under Triton's interpreter but not timed" in note and "at most 2 of the 6 evaluations" in note
    gpu = optimize_config(args, "cuda")
    assert gpu.proposers == ("template", "inductor") and "template_max" not in gpu.proposer_options
    named = build_parser().parse_args(["optimize", str(files["problem"]), "--proposer", "template,inductor"])
    cfg = optimize_config(named, "cpu")
    assert cfg.proposers == ("template", "inductor") and "template_max" not in cfg.proposer_options
    assert "at most" not in cpu_note(cfg)
