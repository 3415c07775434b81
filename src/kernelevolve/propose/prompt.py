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
from typing import Any, Sequence

import torch

from kernelevolve.problem import Problem, import_module_from_path
from kernelevolve.profile import Profile
from kernelevolve.rows import Node

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
             f"- eager reference {profile.eager_ms:.4g} ms"
             + (f"; roofline floor {profile.floor_ms:.4g} ms" if _hard_floor(profile) else "")]
    ops = profile.top_ops
    if ops:
        lines.append("- dominant kernels of the reference: " + "; ".join(
            f"{op['name'][:70]} {op['pct']:.0f}%" for op in ops[:5]))
    return "\n".join(lines)


def what_limits(profile: Profile | None, parent: Node | None) -> tuple[str, str] | None:
    """(title, text) from the hardware counters ncu read for the step's parent (a start kernel, the best) or, for a
    step from scratch, for the reference: each of its slowest kernels and the bound its counters name."""
    counters = profile.counters if profile is not None else {}
    if parent is None:
        key, whose = "reference", "the reference"
    elif parent.meta.get("start"):
        key, whose = f"start: {parent.meta['start']}", "the candidate to start from"
    else:
        key, whose = Profile.counters_key(parent.id), "the candidate to start from"
    got = counters.get(key) or (parent is not None and counters.get(Profile.counters_key(parent.id, True))) or {}
    kernels = sorted(got.get("kernels") or [], key=lambda k: -(k.get("duration_us") or 0.0))[:3]
    if not kernels:
        return None
    lines = [f"- {k['name']} ({k['duration_us']:.1f} us): {k['why']}" if k.get("duration_us") is not None
             else f"- {k['name']}: {k['why']}" for k in kernels]
    return f"What limits {whose} (hardware counters)", "\n".join(lines)


def _hard_floor(profile: Profile | None) -> bool:
    """Whether the profile's floor is one no kernel can beat: from datasheet ceilings, not measured ones (a CPU op
    that fits in cache runs faster than a measured memory ceiling says)."""
    return bool(profile is not None and profile.floor_ms and profile.ceilings_source == "table")


def _ms(node: Node, profile: Profile | None = None) -> str:
    """A node's time and how it stands: against eager and torch.compile, and against the roofline floor."""
    r = node.result
    if r is None:
        return "not evaluated"
    if not (r.timed and r.runtime_ms is not None):
        return "verified, untimed" if r.ok else r.status.value
    against = [f"{x:.2f}x {name}" for x, name in ((r.speedup_eager, "eager"), (r.speedup_compile, "torch.compile"))
               if x is not None]
    if _hard_floor(profile):
        against.append(f"{100 * profile.floor_ms / r.runtime_ms:.0f}% of the roofline floor's speed")
    return f"{r.runtime_ms:.4g} ms" + (f" ({', '.join(against)})" if against else "")


def _label(node: Node) -> str:
    """The node's id (as the tree and ``kernelevolve show`` name it), its proposer and what it is."""
    what = node.meta.get("label")
    return f"node {node.id}, {node.proposer}" + (f": {what}" if what else "")


def _aim(parent: Node, device: str, parent_ms: str, ways: str) -> dict[str, str]:
    """How the task states the parent's speed and what to aim for: a faster kernel where the parent was timed; on the
    CPU, where a Triton kernel runs under the interpreter and is verified but never timed, what this run can
    measure instead."""
    r = parent.result
    if r is not None and r.timed and r.runtime_ms is not None:
        return {"speed": f" that runs in {parent_ms}", "aim": f"Make it faster while keeping it correct: {ways}."}
    if device != "cpu":
        return {"speed": ", verified but not timed", "aim": f"Make it faster while keeping it correct: {ways}."}
    return {"speed": (", verified but not timed: its Triton kernels run under Triton's interpreter on the CPU, "
                      "whose times say nothing of a kernel's speed"),
            "aim": (f"Aim for what this run can measure: torch code (no Triton kernel), which is timed here, that "
                    f"beats eager PyTorch through {ways}; or keep the Triton kernels and make them do less work "
                    "(fewer passes over memory, fewer launches), which this run verifies and a GPU run times.")}


def failure_text(node: Node, max_chars: int = 3000) -> str:
    """What the harness said about a failed node, as a kernel engineer would want it: for a wrong output the count,
    size and place of the errors; for a compile or run-time error the message and the line of the candidate it points
    at; for a rejection the rule and why. The judge's verdict where there is one, else the screen's."""
    from kernelevolve.evaluate.feedback import describe_failure

    if node.result is not None:
        return describe_failure(node.result, node.source, max_chars)
    if node.screen is None:
        raise PromptError(f"node {node.id} has no result to report")
    return describe_failure(node.screen, node.source, max_chars - 40) + "\n(found by the screen's one check)"


def verdict_of(node: Node) -> tuple[dict[str, Any], str]:
    """A node's verdict as data (for a verdict file) and as short markdown: the judge's, else the screen's."""
    r, sc = node.result, node.screen
    payload: dict[str, Any] = {"node": node.id, "run": node.run_id, "judged": r is not None}
    if r is not None:
        payload.update(status=r.status.value, reason=r.reason, runtime_ms=r.runtime_ms if r.timed else None,
                       speedup_eager=r.speedup_eager, speedup_compile=r.speedup_compile,
                       mismatch=r.details.get("mismatch"))
    elif sc is not None:
        payload.update(status=sc.status.value, reason=sc.reason, screen_ms=sc.ms, mismatch=sc.details.get("mismatch"))
    if sc is not None:
        payload["screen"] = {"status": sc.status.value, "reason": sc.reason, "ms": sc.ms,
                             "sent_to_judge": node.finalist}
    if node.ok:
        text = f"**ok** (node {node.id}): {_ms(node) if r.timed else r.reason}"
    elif r is not None or (sc is not None and not sc.ok):
        text = f"**{payload['status']}** (node {node.id})\n\n{failure_text(node)}"
    else:
        text = (f"**screened** (node {node.id}): checked once and timed at {_fmt(sc.ms if sc else None)} ms; not "
                "judged (slower than the batch's finalists, a backup finalist behind one the judge confirmed, or no "
                "judge evaluation was left)")
    return payload, text


def _fmt(ms: float | None) -> str:
    return "?" if ms is None else f"{ms:.4g}"


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
    device: str = "cuda"  # where the run's candidates run: "cuda" or "cpu"


def tolerance_text(problem: Problem, device: str = "cuda") -> str:
    """The judge's correctness rule for this problem, from the judge's own function and constants."""
    from kernelevolve.evaluate.checks import REF_ERROR_FACTOR, tolerance

    per, floating = [], False
    for name in dict.fromkeys(problem.output_dtypes):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            continue
        atol, rtol = tolerance(dtype, problem.allow_tf32, problem.atol, problem.rtol)
        if dtype.is_floating_point or dtype.is_complex:
            floating = floating or dtype.is_floating_point
            per.append(f"atol {atol:g}, rtol {rtol:g} for {name} outputs")
        else:
            per.append(f"an exact match for {name} outputs")
    own = [n for n, v in (("ATOL", problem.atol), ("RTOL", problem.rtol)) if v is not None]
    text = (f"every element must satisfy |out - ref| <= atol + rtol * |ref|, with {'; '.join(per)}"
            + (f" ({' and '.join(own)} set by the problem)" if own else ""))
    if device == "cuda" and "float32" in problem.output_dtypes and not own:
        text += ("; this problem allows TF32" if problem.allow_tf32
                 else "; TF32 matmuls miss it (this problem does not allow TF32)")
    text += ". NaN and Inf must sit where the reference has them"
    if floating and not own:  # the judge widens against the float64 result only under its own tolerances
        text += (f". On long reductions an element also passes within {REF_ERROR_FACTOR:g}x the reference's own "
                 "error from a float64 result")
    return text


# What the prompt says of the device: where the candidates run and how they are timed.
DEVICE_TEXT = {
    "cuda": {
        "advice": "Prefer Triton kernels that fuse the whole computation or its memory-bound parts; keep "
                  "cuBLAS/cuDNN-backed torch ops (matmul, conv, SDPA) where they are hard to beat.",
        "ways": "better tiling or block sizes, more fusion, fewer passes over memory, fewer launches",
        "own_work": "Do the work in your own kernels on the current stream. No extra threads, processes or CUDA "
                    "streams",
        "timing": "Speed is the median time over many repetitions, timed with CUDA events, the L2 cache flushed "
                  "before each.",
    },
    "cpu": {
        "advice": "The run is on the CPU: the inputs are CPU tensors and the candidate runs there; only torch code "
                  "can show a speedup in this run (see the rules on timing).",
        "ways": "fewer passes over memory, fused torch ops, fewer temporaries and less Python per call",
        "own_work": "Do the work in the call itself. No extra threads or processes",
        "timing": "Speed is the median wall time (time.perf_counter) over many repetitions, the cache flushed "
                  "before each. Triton kernels run under Triton's interpreter on the CPU: verified but not timed.",
    },
}


def build_prompt(strategy: str, pin: PromptInputs, parent: Node | None = None,
                 siblings: Sequence[Node] = (), best: Sequence[Node] = (),
                 budget_tokens: int = 12000, hint: str = "", notes: Sequence[str] = ()) -> Prompt:
    """The system text and the user message for one expansion step. ``notes``: what the prompt must say about the
    last replies (a repeat of a known candidate, say)."""
    if strategy not in STRATEGIES:
        raise PromptError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    if strategy != "scratch" and parent is None:
        raise PromptError(f"strategy {strategy} needs a parent node")
    t = lambda name: load_template(name, pin.templates_dir)  # noqa: E731
    problem = pin.problem
    mutates = " (the reference mutates some inputs: do exactly what it does)" if problem.mutates_inputs else ""
    fields = {"device": pin.device_name, "strategy": hint, "tolerance": tolerance_text(problem, pin.device),
              "mutates": mutates,
              **DEVICE_TEXT["cpu" if pin.device == "cpu" else "cuda"]}
    if parent is not None:
        fields.update(parent_label=_label(parent), parent_ms=_ms(parent, pin.profile))
        fields.update(_aim(parent, pin.device, fields["parent_ms"], fields["ways"]))
        status = parent.result or parent.screen
        if status is not None:
            fields.update(status=status.status.value, reason=status.reason)
    sections = [
        Section("Task", t(strategy).format(**fields), 0),
        Section("Rules", t("rules").format(**fields), 0),
        Section("Reference (the problem file)", fenced(problem.source), 0),
        Section("Inputs", pin.inputs, 0),
    ]
    if notes:
        sections.append(Section("About your last reply", "\n".join(notes), 0))
    if parent is not None:
        sections.append(Section(f"Candidate to {'fix' if strategy == 'repair' else 'start from'} ({_label(parent)})",
                                fenced(parent.source), 1))
    if strategy == "repair":
        sections.append(Section("What the harness reported", failure_text(parent), 0))
    if siblings:
        tried = [f"- {_label(s)}: {_ms(s)}" + (f" ({(s.result or s.screen).reason[:160]})"
                                              if (s.result or s.screen) is not None and not s.ok else "")
                 for s in siblings]
        sections.append(Section("Attempts already made from this candidate", "\n".join(tried), 1))
    sections.append(Section("Profile of the reference", describe_profile(pin.profile), 2))
    limits = what_limits(pin.profile, parent)
    if limits:
        sections.append(Section(limits[0], limits[1], 2))
    others = [b for b in best if parent is None or b.id != parent.id]
    if others:
        sections.append(Section("Fastest verified candidates so far", "\n".join(
            f"- {_label(b)}: {_ms(b, pin.profile)}" for b in others[:5]), 2))
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


__all__ = ["DEVICE_TEXT", "PROMPTS_DIR", "STRATEGIES", "ParsedReply", "Prompt", "PromptError", "PromptInputs", "Section", "assemble",
           "build_prompt", "cut_middle", "describe_inputs", "describe_profile", "estimate_tokens", "extract_code",
           "failure_text", "language_of", "load_template", "tolerance_text", "verdict_of"]
