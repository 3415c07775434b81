"""Prompt assembly (sections, priorities, the token budget, templates) and the parsing of model replies."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.evaluate.result import Result, Status, Timing
from kernelevolve.problem import load_problem
from kernelevolve.propose.prompt import (
    PromptError,
    PromptInputs,
    Section,
    assemble,
    build_prompt,
    cut_middle,
    describe_inputs,
    extract_code,
    language_of,
)
from kernelevolve.rows import Node
from tests.factories import make_node, make_profile

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gelu_mlp.py"
GOOD = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


@pytest.fixture(scope="module")
def pin() -> PromptInputs:
    problem = load_problem(EXAMPLE, "cpu")
    profile = make_profile(device_name="NVIDIA H200", dtype="float32", bound="memory", flops=2e9, bytes=5e7,
                           floor_ms=0.01, eager_ms=0.05, top_ops=[{"name": "addmm", "pct": 80.0}],
                           ceilings_source="table")
    return PromptInputs(problem, "NVIDIA H200", describe_inputs(problem), profile,
                        knowledge="H200: 132 SMs, 4.8 TB/s HBM3e.")


def node(i: int, source: str, status: Status = Status.OK, ms: float | None = 1.0, parent=None, **kw) -> Node:
    timing = Timing.from_samples([ms], "cuda_event") if ms is not None else None
    result = Result(status, kw.pop("reason", "verified" if status is Status.OK else "mismatch"), timing=timing,
                    timed=ms is not None, error=kw.pop("error", ""))
    return make_node(i, result, parent, kw.pop("proposer", "llm"), meta={"label": f"n{i}"}, source=source)


def test_scratch_prompt_carries_problem_inputs_profile_device_facts_and_rules(pin):
    p = build_prompt("scratch", pin)
    assert "class Model" in p.user and "input 0: float32" in p.user
    assert "roofline floor" in p.user and "addmm" in p.user
    assert "132 SMs" in p.user and "NVIDIA H200" in p.user
    assert "caching by pointer" in p.user and "ModelNew" in p.system
    assert p.dropped == () and p.tokens > 0 and len(p.sha) == 64


def test_repair_prompt_carries_the_parent_and_its_failure(pin):
    bad = node(7, GOOD.replace("return x", "return x * 2"), Status.INCORRECT, None,
               reason="output 0 mismatch: max abs err 3.1", error="Traceback: something specific")
    p = build_prompt("repair", pin, parent=bad)
    assert "return x * 2" in p.user and "max abs err 3.1" in p.user and "something specific" in p.user
    assert "`incorrect`" in p.user


def test_contrast_prompt_lists_the_siblings(pin):
    parent = node(1, GOOD, ms=2.0)
    kids = [node(2, GOOD, ms=3.0, parent=1), node(3, GOOD, Status.COMPILE_ERROR, None, parent=1, reason="bad syntax")]
    p = build_prompt("contrast", pin, parent=parent, siblings=kids, best=[parent, kids[0]])
    assert "Attempts already made" in p.user and "bad syntax" in p.user and "3 ms" in p.user


def test_budget_drops_lowest_priority_sections_first(pin):
    big = PromptInputs(pin.problem, pin.device_name, pin.inputs, pin.profile, knowledge="fact\n" * 20000)
    p = build_prompt("scratch", big, budget_tokens=3000)
    assert p.tokens <= 3000 + 200
    assert "Rules" in p.kept and "Reference (the problem file)" in p.kept
    assert any("Facts about the target" in d for d in p.dropped) or "lines cut" in p.user


def test_assemble_keeps_order_and_required_sections():
    sections = [Section("a", "x" * 400, 0), Section("b", "y" * 40000, 3), Section("c", "z" * 400, 1)]
    text, kept, dropped = assemble(sections, budget_tokens=400)
    assert kept == ("a", "c") and dropped == ("b",)
    assert text.index("## a") < text.index("## c")


def test_cut_middle_says_how_much_was_cut():
    text = "\n".join(f"line {i}" for i in range(1000))
    cut = cut_middle(text, 500)
    assert len(cut) < 700 and "lines cut" in cut and cut.startswith("line 0") and cut.endswith("line 999")


def test_user_template_folder_overrides_a_template(pin, tmp_path):
    (tmp_path / "scratch.md").write_text("CUSTOM TASK for {device}\n")
    p = build_prompt("scratch", PromptInputs(pin.problem, pin.device_name, pin.inputs, None,
                                             templates_dir=str(tmp_path)))
    assert "CUSTOM TASK for NVIDIA H200" in p.user and "caching by pointer" in p.user


def test_bad_strategy_and_missing_parent(pin):
    with pytest.raises(PromptError):
        build_prompt("dream", pin)
    with pytest.raises(PromptError):
        build_prompt("repair", pin)


@pytest.mark.parametrize("reply, found", [
    (f"Here it is:\n```python\n{GOOD}```\nThis fuses everything.", "one code block"),
    (f"```python\nimport triton\n```\nand the module:\n```python\n{GOOD}```", "last complete ModelNew block"),
    ("```python\nimport torch\n\ndef helper(x):\n    return x\n```\n```python\n"
     "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return helper(x)\n```", "joined"),
    (GOOD, "whole reply"),
    (f"```\n{GOOD}```", "one code block"),
    (f"```python\n{GOOD}", "one code block"),  # cut off before the closing fence
])
def test_code_is_found(reply, found):
    parsed = extract_code(reply)
    assert parsed.code is not None and "class ModelNew" in parsed.code and found in parsed.why


@pytest.mark.parametrize("reply, why", [
    ("I cannot help with that.", "no code block"),
    ("", "no code block"),
    ("```python\nprint('hi')\n```", "no code block defines class ModelNew"),
    ("```python\nclass ModelNew(torch.nn.Module:\n    pass\n```", "does not parse"),
])
def test_replies_without_a_candidate(reply, why):
    parsed = extract_code(reply)
    assert parsed.code is None and why in parsed.why


def test_language():
    assert language_of("import triton\n@triton.jit\ndef k(): pass") == "triton"
    assert language_of(GOOD) == "torch"


# --- a prompt that is true for the run ------------------------------------------------------------------------------
GPU_WORDS = ("CUDA", "GPU", "cuBLAS", "L2", "SM", "HBM", "warp", "Hopper", "H200", "tensor core", "TF32")
CPU_WORDS = ("interpreter", "perf_counter", "CPU tensors")
BF16 = "torch.randn(32, 64).to(torch.bfloat16)"
F32 = "torch.randn(32, 64)"


def _prompt(tmp_path, device: str, text: str = "", device_name: str | None = None, inputs: str = BF16) -> str:
    """The CLI's prompt for a small softmax problem written to ``tmp_path`` (module text ``text`` after the Model)."""
    import contextlib
    import io

    from kernelevolve.cli import main

    path = tmp_path / f"p_{device}.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                    "        return torch.softmax(x.float(), dim=-1).to(x.dtype)\n\n\ndef get_inputs():\n"
                    f"    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n{text}")
    argv = ["prompt", str(path), "--device", device, "--no-profile"] + (
        ["--device-name", device_name] if device_name else [])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def _tolerances(text: str) -> list[tuple[float, float, str]]:
    import re

    return [(float(a), float(r), d) for a, r, d in re.findall(r"atol ([0-9.e+-]+), rtol ([0-9.e+-]+) for (\w+)", text)]


def _numbers(text: str) -> list[float]:
    """Every decimal or e-notation number outside the problem's own source and the profile."""
    import re

    rules = text.split("## Reference")[0]
    return [float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+(?:e-?\d+)?|(?<![\w.])\d+e-?\d+", rules)]


@pytest.mark.parametrize("device, name, inputs", [("cpu", None, BF16), ("cpu", None, F32),
                                                  ("cuda", "NVIDIA H200", BF16), ("cuda", "NVIDIA H200", F32)])
def test_the_prompt_states_the_judges_tolerance_once_and_only_facts_of_its_device(tmp_path, device, name, inputs):
    import re

    import torch

    from kernelevolve.evaluate.checks import REF_ERROR_FACTOR, tolerance

    dtype = torch.bfloat16 if "bfloat16" in inputs else torch.float32
    text = _prompt(tmp_path, device, device_name=name, inputs=inputs)
    assert _tolerances(text) == [(*tolerance(dtype), str(dtype)[6:])]  # once, and the judge's own numbers
    assert text.count("|out - ref|") == 1 and f"within {REF_ERROR_FACTOR:g}x the reference's own error" in text
    # every number the task and the rules state is one of the judge's (no "about 1e-4" anywhere)
    assert set(_numbers(text)) <= {*tolerance(dtype)}, _numbers(text)
    words = GPU_WORDS if device == "cpu" else CPU_WORDS
    assert not [w for w in words if re.search(rf"\b{re.escape(w)}\b", text)], text
    if device == "cpu":
        assert text.count("not timed") == 1 and text.count("interpreter") == 1 and "CPU tensors" in text
        assert text.count("flushed") == 1
    else:
        assert "CUDA events" in text and "NVIDIA H200" in text and "Hopper" in text
        assert ("does not allow TF32" in text) == (dtype == torch.float32)
    assert "What the evaluator accepts" not in text  # the rules are stated once, in the Rules section


def test_the_prompt_follows_the_problems_own_tolerance(tmp_path):
    text = _prompt(tmp_path, "cuda", "\nATOL = 5e-2\nRTOL = 1e-1\n", "NVIDIA H200", inputs=F32)
    assert _tolerances(text) == [(0.05, 0.1, "float32")] and "(ATOL and RTOL set by the problem)" in text
    # the judge compares against the float64 result only under its own tolerances, and TF32 is the problem's affair
    rules = text.split("## Reference")[0]
    assert "float64" not in rules and "TF32" not in rules
    one = _prompt(tmp_path, "cpu", "\nATOL = 5e-2\n", inputs=F32)
    assert _tolerances(one) == [(0.05, 1e-3, "float32")] and "(ATOL set by the problem)" in one


def test_an_improve_prompt_places_the_parent_against_the_baselines_and_the_floor(pin):
    from dataclasses import replace

    parent = node(1, GOOD, ms=0.02)
    parent = replace(parent, result=replace(parent.result, speedup_eager=2.5, speedup_compile=1.25))
    p = build_prompt("improve", pin, parent=parent)
    assert "0.02 ms (2.50x eager, 1.25x torch.compile, 50% of the roofline floor's speed)" in p.user


def test_the_hardware_counters_say_what_limits_the_kernel_a_step_starts_from(pin):
    from dataclasses import replace

    why = "memory-bound: DRAM 86% of peak, SM 31%, tensor pipes 0%"
    counters = {"reference": {"kernels": [{"name": "gelu_kernel", "duration_us": 812.3, "why": why}]},
                "start: mine.py": {"error": "ncu failed: no"}}
    with_counters = replace(pin, profile=replace(pin.profile, counters=counters))
    p = build_prompt("scratch", with_counters)
    assert "## What limits the reference (hardware counters)" in p.user and f"gelu_kernel (812.3 us): {why}" in p.user
    start = make_node(3, Result(Status.OK, "verified"), None, "start", meta={"start": "mine.py", "label": "s"},
                      source=GOOD)
    assert "What limits" not in build_prompt("improve", with_counters, parent=start).user  # its counters failed
    assert "What limits" not in build_prompt("scratch", pin).user  # no counters read
    # a run whose head to head kept a baseline reads its fastest candidate's counters under that name
    lost = {"fastest candidate (node 4)": {"kernels": [{"name": "fused_kernel", "duration_us": 90.0, "why": why}]}}
    p = build_prompt("improve", replace(pin, profile=replace(pin.profile, counters=lost)), parent=node(4, GOOD, ms=2.0))
    assert "## What limits the candidate to start from (hardware counters)" in p.user and "fused_kernel" in p.user


def test_improve_states_the_parents_time_and_names_nodes_by_id(pin):
    parent = node(4, GOOD, ms=2.0)
    p = build_prompt("improve", pin, parent=parent, best=[parent, node(6, GOOD, ms=3.0)])
    assert "(node 4, llm: n4) that runs in 2 ms" in p.user and "Make it faster while keeping it correct" in p.user
    assert "- node 6, llm: n6: 3 ms" in p.user


def test_improve_of_an_untimed_kernel_on_the_cpu_says_what_to_aim_for(pin):
    from dataclasses import replace

    cpu = replace(pin, device="cpu", device_name="cpu")
    parent = node(4, GOOD, ms=None, proposer="template")
    kids = [node(5, GOOD, Status.COMPILE_ERROR, None, parent=4, reason="bad syntax")]
    p = build_prompt("improve", cpu, parent=parent, siblings=kids, best=[parent])
    assert "runs in verified, untimed" not in p.user
    assert "(node 4, template: n4), verified but not timed: its Triton kernels run under Triton's interpreter" in p.user
    assert "Aim for what this run can measure: torch code" in p.user
    assert "- node 5, llm: n5: compile_error (bad syntax)" in p.user
