"""Prompts for kernel-writing language models, and the parsing of their replies.

A prompt is assembled from the template files in ``prompts/`` (a user folder may override any of them) and from
sections built from the run: the problem and its inputs, the profile, device facts from the knowledge base, the
harness's rules, the best candidates so far, worked examples from earlier runs and, for a repair, the parent's failure.
Each section has a priority; when the prompt would exceed its token budget, the lowest-priority sections are cut first.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kernelevolve.problem import Problem, import_module_from_path
from kernelevolve.rows import Node

if TYPE_CHECKING:
    from kernelevolve.profile import Profile

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
STRATEGIES = ("scratch", "improve", "repair", "contrast")
CHARS_PER_TOKEN = 4  # a conservative estimate for code and English; no tokenizer needed
SOURCE_CHARS = 12000  # the longest candidate source quoted whole; longer ones are cut in the middle


class PromptError(Exception):
    pass


# --- templates --------------------------------------------------------------------------------------------------------
def load_template(name: str, override_dir: str | Path | None = None) -> str:
    """``prompts/NAME.md``, or the user's file of that name when ``override_dir`` holds one."""
    for folder in ([Path(override_dir)] if override_dir else []) + [PROMPTS_DIR]:
        path = folder / f"{name}.md"
        if path.is_file():
            return path.read_text()
    raise PromptError(f"no prompt template {name}.md in {override_dir or PROMPTS_DIR}")


def estimate_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def cut_middle(text: str, max_chars: int) -> str:
    """``text`` with lines removed from its middle so that it fits ``max_chars``, saying how many were cut."""
    if len(text) <= max_chars:
        return text
    lines = text.splitlines()
    head, tail, used = [], [], 0
    while lines and used < max_chars // 2:
        used += len(lines[0]) + 1
        head.append(lines.pop(0))
    while lines and used < max_chars:
        used += len(lines[-1]) + 1
        tail.insert(0, lines.pop())
    return "\n".join(head + [f"# ... [{len(lines)} lines cut] ..."] + tail)


# --- sections ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    title: str
    text: str
    priority: int  # 0: always kept; the highest numbers are cut first


@dataclass(frozen=True)
class Prompt:
    strategy: str
    system: str
    user: str
    kept: tuple[str, ...]
    dropped: tuple[str, ...]

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.system) + estimate_tokens(self.user)

    @property
    def sha(self) -> str:
        return hashlib.sha256((self.system + "\0" + self.user).encode()).hexdigest()


def assemble(sections: Sequence[Section], budget_tokens: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The sections in their given order, lowest priorities cut (or, when room is left, shortened) to fit the budget."""
    order = sorted(range(len(sections)), key=lambda i: sections[i].priority)
    texts: dict[int, str] = {}
    used = 0
    for i in order:
        s = sections[i]
        block = f"## {s.title}\n\n{s.text.strip()}\n"
        cost = estimate_tokens(block)
        if s.priority == 0 or used + cost <= budget_tokens:
            texts[i], used = block, used + cost
            continue
        room = budget_tokens - used
        if room >= 300:  # worth a shortened copy
            texts[i] = f"## {s.title}\n\n{cut_middle(s.text.strip(), room * CHARS_PER_TOKEN - 200)}\n"
            used += estimate_tokens(texts[i])
    kept = tuple(sections[i].title for i in sorted(texts))
    dropped = tuple(s.title for i, s in enumerate(sections) if i not in texts)
    return "\n".join(texts[i] for i in sorted(texts)), kept, dropped


def describe_inputs(problem: Problem) -> str:
    """One line per input of ``get_inputs()``: its position, dtype and shape (drawn on the meta device when it can be,
    so a multi-GB input costs nothing)."""
    module = import_module_from_path(problem.path, f"_ke_prompt_{problem.short_sha}")
    try:
        with torch.device("meta"):
            values = module.get_inputs()
    except Exception:  # get_inputs() does something the meta device cannot (e.g. .item()); draw it for real
        values = module.get_inputs()
    lines = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            lines.append(f"- input {i}: {str(v.dtype).removeprefix('torch.')} {list(v.shape)}")
        else:
            lines.append(f"- input {i}: {type(v).__name__} {v!r}"[:200])
    init = module.get_init_inputs()
    lines.append(f"- constructor arguments (get_init_inputs): {init!r}"[:300])
    if problem.n_shapes > 1:
        lines.append(f"- the problem declares {problem.n_shapes} input shapes; every one is verified")
    return "\n".join(lines)


def describe_profile(profile: Profile | None) -> str:
    if not profile:
        return "No profile is available."
    lines = [f"- device: {profile.device_name}; dominant dtype {profile.dtype}",
             f"- bound: {profile.bound}; {profile.flops / 1e9:.3g} GFLOP, {profile.bytes / 1e6:.4g} MB moved at least",
             f"- roofline floor {profile.floor_ms:.4g} ms; eager reference {profile.eager_ms:.4g} ms"]
    ops = profile.top_ops
    if ops:
        lines.append("- dominant kernels of the reference: " + "; ".join(
            f"{op['name'][:70]} {op['pct']:.0f}%" for op in ops[:5]))
    return "\n".join(lines)


def _ms(node: Node) -> str:
    r = node.result
    if r is None:
        return "not evaluated"
    if r.timed and r.runtime_ms is not None:
        return f"{r.runtime_ms:.4g} ms"
    return "verified, untimed" if r.ok else r.status.value


def _label(node: Node) -> str:
    return f"{node.proposer}: {node.meta.get('label', node.id)}"


def failure_text(node: Node, max_chars: int = 3000) -> str:
    """What the harness said about a failed node: status, reason and the tail of the error or log."""
    r = node.result
    if r is None:
        raise PromptError(f"node {node.id} has no result to report")
    parts = [f"status: {r.status.value}", f"reason: {r.reason}"]
    if r.error:
        parts.append("details:\n" + r.error[-max_chars:])
    elif r.log:
        parts.append("log tail:\n" + r.log[-max_chars:])
    return "\n".join(parts)


def fenced(source: str) -> str:
    return f"```python\n{cut_middle(source.rstrip(), SOURCE_CHARS)}\n```"


# --- the prompt -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptInputs:
    """What every prompt of a run can draw on."""
    problem: Problem
    device_name: str
    inputs: str
    profile: Profile | None
    knowledge: str = ""
    examples: tuple[dict[str, Any], ...] = ()  # {"label", "result", "source"}: earlier winners on this device
    templates_dir: str | None = None


def _tolerance(problem: Problem) -> str:
    if problem.atol is not None or problem.rtol is not None:
        return f"atol {problem.atol}, rtol {problem.rtol} (set by the problem)"
    return "per dtype: about 1e-4 for fp32 (TF32 math fails it unless the problem allows TF32), 1e-2 for bf16/fp16"


def build_prompt(strategy: str, pin: PromptInputs, parent: Node | None = None,
                 siblings: Sequence[Node] = (), best: Sequence[Node] = (),
                 budget_tokens: int = 12000, hint: str = "") -> Prompt:
    """The system text and the user message for one expansion step."""
    if strategy not in STRATEGIES:
        raise PromptError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    if strategy != "scratch" and parent is None:
        raise PromptError(f"strategy {strategy} needs a parent node")
    t = lambda name: load_template(name, pin.templates_dir)  # noqa: E731
    problem = pin.problem
    mutates = " (the reference mutates some inputs: do exactly what it does)" if problem.mutates_inputs else ""
    fields = {"device": pin.device_name, "strategy": hint, "tolerance": _tolerance(problem), "mutates": mutates}
    if parent is not None:
        fields.update(parent_label=_label(parent), parent_ms=_ms(parent))
        if parent.result is not None:
            fields.update(status=parent.result.status.value, reason=parent.result.reason)
    sections = [
        Section("Task", t(strategy).format(**fields), 0),
        Section("Rules", t("rules").format(**fields), 0),
        Section("Reference (the problem file)", fenced(problem.source), 0),
        Section("Inputs", pin.inputs, 0),
    ]
    if parent is not None:
        sections.append(Section(f"Candidate to {'fix' if strategy == 'repair' else 'start from'} ({_label(parent)})",
                                fenced(parent.source), 1))
    if strategy == "repair":
        sections.append(Section("What the harness reported", failure_text(parent), 0))
    if siblings:
        tried = [f"- {_label(s)}: {_ms(s)}" + (f" ({s.result.reason[:160]})" if s.result and s.failed else "")
                 for s in siblings]
        sections.append(Section("Attempts already made from this candidate", "\n".join(tried), 1))
    sections.append(Section("Profile of the reference", describe_profile(pin.profile), 2))
    others = [b for b in best if parent is None or b.id != parent.id]
    if others:
        sections.append(Section("Fastest verified candidates so far", "\n".join(
            f"- {_label(b)}: {_ms(b)}" for b in others[:5]), 2))
        if strategy in ("scratch", "contrast"):
            sections.append(Section(f"The fastest so far ({_label(others[0])})", fenced(others[0].source), 4))
    if pin.knowledge:
        sections.append(Section(f"Facts about the target ({pin.device_name}) and useful techniques", pin.knowledge, 3))
    for i, ex in enumerate(pin.examples):
        sections.append(Section(f"Worked example from an earlier run ({ex.get('label')}, {ex.get('result')})",
                                fenced(ex["source"]), 5 + i))
    system = t("system")
    user, kept, dropped = assemble(sections, budget_tokens - estimate_tokens(system))
    return Prompt(strategy, system, user, kept, dropped)


# --- replies ----------------------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^```[ \t]*([\w.+-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)


@dataclass(frozen=True)
class ParsedReply:
    code: str | None
    why: str  # how the code was found, or why there is none
    blocks: int


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except SyntaxError:
        return False


def _imports(code: str) -> bool:
    """Whether ``code`` imports anything: a ModelNew block without imports is a fragment of a multi-block reply."""
    return re.search(r"^(import|from)\s+\w", code, re.M) is not None


def _defines_model_new(code: str) -> bool:
    return re.search(r"^class\s+ModelNew\b", code, re.M) is not None


def extract_code(reply: str) -> ParsedReply:
    """The candidate file in a model's reply: fenced blocks (several, or one cut off at the end), prose around them, or
    a bare file. A reply without a ModelNew class is no candidate."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(reply or "")]
    code_blocks = [b for lang, b in blocks if lang in ("", "python", "py", "python3")]
    if not blocks and _defines_model_new(reply or "") and _parses(reply):
        return ParsedReply(reply.strip() + "\n", "the whole reply is a Python file", 0)
    if not blocks:
        return ParsedReply(None, "the reply holds no code block", 0)
    whole = [b for b in code_blocks if _defines_model_new(b) and _parses(b) and _imports(b)]
    if whole:
        why = "one code block" if len(blocks) == 1 else f"the last complete ModelNew block of {len(blocks)}"
        return ParsedReply(whole[-1].rstrip() + "\n", why, len(blocks))
    joined = "\n\n".join(b.rstrip() for b in code_blocks)
    if _defines_model_new(joined) and _parses(joined):
        return ParsedReply(joined + "\n", f"{len(code_blocks)} code blocks joined into one file", len(blocks))
    fragments = [b for b in code_blocks if _defines_model_new(b) and _parses(b)]
    if fragments:  # no imports anywhere: the evaluator will say what is missing
        return ParsedReply(fragments[-1].rstrip() + "\n", "a ModelNew block without imports", len(blocks))
    if any(_defines_model_new(b) for b in code_blocks):
        return ParsedReply(None, "the ModelNew code does not parse (a cut-off reply?)", len(blocks))
    return ParsedReply(None, f"no code block defines class ModelNew ({len(blocks)} block(s))", len(blocks))


def language_of(code: str) -> str:
    return "triton" if "triton" in code and "@triton.jit" in code else "torch"


__all__ = ["PROMPTS_DIR", "STRATEGIES", "ParsedReply", "Prompt", "PromptError", "PromptInputs", "Section", "assemble",
           "build_prompt", "cut_middle", "describe_inputs", "describe_profile", "estimate_tokens", "extract_code",
           "failure_text", "language_of", "load_template"]
