"""The ``llm`` proposer: one expansion step whose prompt is rebuilt each time from the run's tree, the profile and the
knowledge base, answered by any OpenAI-compatible or Anthropic endpoint.

How a step expands the tree depends on how the branch is doing:
- ``repair``: the proposer's own newest failure, while its lineage has failed fewer than ``max_repairs`` times in a row;
- ``improve``: continue a fast verified node;
- ``contrast``: a fast verified node that already has children, shown with their outcomes, for a different approach;
- ``scratch``: no verified node yet, or now and then for diversity.
Targets are drawn from the fastest few verified nodes with rank weights, so one lineage cannot take every step, and a
node whose children keep failing is left alone.

Every step is built from verdicts that exist: the proposer keeps at most ``concurrency`` lines of work in flight (one
for ``manual``), so with one line the next prompt waits for the last reply's verdict. A reply that repeats a candidate
the run already holds is not judged again: the next prompt says so, and after ``max_repeats`` such replies in a row
that line of work (the node it expands, or the scratch steps) stops; the proposer stops once every line has. So it does once the run's model budget (calls, tokens, cost) is spent.
"""
from __future__ import annotations

import logging
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kernelevolve.candidate import Candidate, Meta
from kernelevolve.propose.base import ProposalContext
from kernelevolve.propose.prompt import Prompt, PromptInputs, build_prompt, describe_inputs, extract_code, language_of
from kernelevolve.rows import Experience, Node
from kernelevolve.settings import PROMPT_TOKENS
from kernelevolve.spend import SpendLimits

log = logging.getLogger(__name__)

MAX_EXAMPLES = 2  # worked examples from earlier runs per prompt
# Notes a prompt leaves out: its Rules section states what the evaluator accepts, from the judge's own settings.
PROMPT_EXCLUDED_NOTES = ("harness-rules",)


@dataclass(frozen=True)
class ExpandConfig:
    max_repairs: int = 2  # repairs in a row along one lineage before it is given up
    max_child_failures: int = 3  # failed children of a node after which it is no longer expanded
    explore: float = 0.15  # chance of a scratch step once something is verified
    top_k: int = 3  # targets are drawn from this many fastest verified nodes
    max_failed_calls: int = 6  # calls in a row without a candidate after which the proposer gives up
    max_repeats: int = 3  # replies in a row that repeat a known candidate after which their line of work stops
    max_repeats_total: int = 4  # such replies in a row over every line, after which the proposer stops


def failed(node: Node) -> bool:
    """Judged and not verified, or stopped by the screen's one check (a wrong output, a compile error): a verdict that
    a repair can start from either way. A node still waiting for the screen or the judge is neither."""
    if node.result is not None:
        return not node.result.ok
    s = node.screen
    return s is not None and not s.ok and not s.harness


def pending(node: Node) -> bool:
    """Neither judged nor done with by the screen: its verdict is still to come."""
    return node.result is None and not node.screened_out


def fastest_verified(history: Sequence[Node]) -> list[Node]:
    """The verified nodes, the timed ones fastest first, then the untimed ones in creation order."""
    return sorted((node for node in history if node.ok),
                  key=lambda node: float("inf") if node.runtime_ms is None else node.runtime_ms)


Step = tuple[str, Node | None, list[Node]]  # (strategy, the node it expands, that node's children so far)


class Expander:
    """Chooses the strategy and the parent of each step from the run's nodes."""

    def __init__(self, name: str, cfg: ExpandConfig, rng: random.Random):
        self.name, self.cfg, self.rng = name, cfg, rng
        self.stale: set[int | None] = set()  # lines of work stopped: node ids no longer expanded; None: scratch

    def repair_depth(self, node: Node | None, by_id: dict[int, Node]) -> int:
        depth = 0
        while node is not None and node.proposer == self.name and failed(node):
            depth += 1
            node = by_id.get(node.parent) if node.parent is not None else None
        return depth

    def plan(self, history: Sequence[Node], n: int) -> list[Step]:
        by_id = {node.id: node for node in history}
        children: dict[int, list[Node]] = {}
        for node in history:
            if node.parent is not None:
                children.setdefault(node.parent, []).append(node)
        repairs = [node for node in reversed(history) if node.proposer == self.name and failed(node)
                   and node.id not in children and node.id not in self.stale
                   and self.repair_depth(node, by_id) <= self.cfg.max_repairs]
        alive = [node for node in fastest_verified(history) if node.id not in self.stale
                 and sum(failed(c) for c in children.get(node.id, [])) < self.cfg.max_child_failures]
        targets = alive[:self.cfg.top_k]
        scratch = None not in self.stale
        steps: list[Step] = []
        picked: dict[int, int] = {}
        for _ in range(n):
            if repairs:
                node = repairs.pop(0)
                steps.append(("repair", node, []))
            elif scratch and (not targets or self.rng.random() < self.cfg.explore):
                steps.append(("scratch", None, []))
            elif not targets:
                break  # every line of work is stopped
            else:
                node = self.rng.choices(targets, weights=[1 / (i + 1) for i in range(len(targets))])[0]
                kids = children.get(node.id, [])
                earlier = picked.get(node.id, 0)
                picked[node.id] = earlier + 1
                steps.append(("contrast" if len(kids) + earlier >= 2 else "improve", node, kids))
        return steps


@dataclass(frozen=True)
class Reply:
    """One answered (or failed) step, whatever answered it."""
    text: str | None
    model: str
    error: str = ""  # "kind: message" when the call failed
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float | None = None
    ref: str = ""  # where the reply came from, when it has a name of its own (manual: the reply file)


class PromptedProposer:
    """The parts shared by every proposer that answers prompts: context, planning, parsing and the call record."""

    name = "prompted"
    examples_from_any = True  # the loop hands it earlier winners of every proposer, as worked examples

    def __init__(self, device: str, seed: int | None = None, knowledge_dirs: Sequence[str | Path] = (),
                 prompts_dir: str | None = None, budget_tokens: int = PROMPT_TOKENS, expand: ExpandConfig = ExpandConfig(),
                 concurrency: int = 1, limits: SpendLimits = SpendLimits()):
        self.device = device
        self.rng = random.Random(seed)
        self.knowledge_dirs, self.prompts_dir, self.budget_tokens = tuple(knowledge_dirs), prompts_dir, budget_tokens
        self.expander = Expander(self.name, expand, self.rng)
        self.concurrency = concurrency  # lines of work in flight: prompts answered and not yet judged
        self.limits = limits
        self.failed_calls = 0
        self.repeats: dict[int | None, int] = {}  # per line of work (the node a step expands; None: scratch)
        self.repeats_in_a_row = 0  # over every line
        self.notes: list[str] = []  # what the next prompt must say about the last replies (repeats)
        self.stopped = ""  # why this proposer asks no more, once it does not
        self._spent = {"calls": 0.0, "tokens": 0.0, "cost_usd": 0.0}  # without a store: this proposer's calls
        self._inputs: tuple[str, PromptInputs] | None = None
        self.store: Any = None
        self.run_id: int | None = None
        self.families: list[str] = []
        self.device_name: str | None = None  # the device's name where no profile gives it

    def bind(self, store: Any, run_id: int) -> None:
        """Called by the search loop: where this proposer records its calls."""
        self.store, self.run_id = store, run_id

    def answer(self, prompt: Prompt, index: int) -> Reply:
        """The reply to one prompt; subclasses ask a model or a person. This base has nobody to ask."""
        return Reply(None, "none", "no_model: this proposer has no model to answer its prompts")

    def done(self) -> bool:
        """True once this proposer will answer no more prompts."""
        return bool(self.stopped)

    def observe(self, node: Node) -> None:
        """The screen's or the judge's verdict on one of this proposer's nodes has arrived (the loop calls this)."""

    def on_call(self, reply: Reply, status: str, detail: str) -> None:
        """A call is recorded: ``status`` is candidate, no_code, repeat or error."""

    # --- spend ------------------------------------------------------------------------------------------------------
    def spent(self) -> dict[str, float]:
        """Calls, tokens and cost of the run's calls so far, every proposer's (the store's count; a resumed run's
        earlier calls included), or this proposer's own where it records none."""
        if self.store is None or self.run_id is None:
            return self._spent
        usage = self.store.llm_usage(self.run_id)
        return {"calls": usage["calls"] if usage else 0,
                "tokens": usage["input_tokens"] + usage["output_tokens"] if usage else 0,
                "cost_usd": (usage["cost_usd"] or 0.0) if usage else 0.0}

    def _calls_allowed(self, wanted: int) -> int:
        """How many of ``wanted`` calls the budget still allows; 0 (and the proposer stops) once it is spent."""
        spent, lim = self.spent(), self.limits
        if lim.tokens is not None and spent["tokens"] >= lim.tokens:
            self.stopped = f"the model budget is spent: {spent['tokens']:.0f} tokens of {lim.tokens}"
        elif lim.cost_usd is not None and spent["cost_usd"] >= lim.cost_usd:
            self.stopped = f"the model budget is spent: ${spent['cost_usd']:.2f} of ${lim.cost_usd:g}"
        elif lim.calls is not None and spent["calls"] >= lim.calls:
            self.stopped = f"the model budget is spent: {spent['calls']:.0f} calls of {lim.calls}"
        if self.stopped:
            return 0
        return wanted if lim.calls is None else min(wanted, lim.calls - int(spent["calls"]))

    def _count(self, reply: Reply) -> None:
        spent = self._spent
        spent["calls"] += 1
        spent["tokens"] += reply.input_tokens + reply.output_tokens
        spent["cost_usd"] += reply.cost_usd or 0.0

    # --- context ----------------------------------------------------------------------------------------------
    def prompt_inputs(self, ctx: ProposalContext) -> PromptInputs:
        if self._inputs is None or self._inputs[0] != ctx.problem.sha:
            device_name = (ctx.profile.device_name if ctx.profile else "") or self.device_name or (
                "a CUDA GPU" if self.device == "cuda" else "the CPU")
            self.families = _families(ctx)
            self._inputs = (ctx.problem.sha, PromptInputs(
                ctx.problem, device_name, describe_inputs(ctx.problem), ctx.profile,
                knowledge=self._knowledge(device_name, ctx), examples=self._examples(ctx),
                templates_dir=self.prompts_dir, device=self.device))
        return self._inputs[1]

    def _examples(self, ctx: ProposalContext) -> tuple[dict[str, str], ...]:
        """Worked examples: earlier winners (template or model kernels, not torch.compile wrappers) on this device,
        those sharing the most op families with this problem first, then in the loop's order of similarity."""
        mine = set(self.families)
        entries = [e for e in ctx.experience if e.proposer != "inductor"]
        shared = lambda e: len(mine & _entry_families(e))  # noqa: E731
        entries.sort(key=lambda e: -shared(e))  # stable: ties keep the loop's ranking
        return tuple({"label": f"{e.proposer}: {e.meta.get('label')} on {e.problem}",
                      "result": f"{e.speedup_eager:.2f}x over eager" if e.speedup_eager else "verified",
                      "source": e.source} for e in entries[:MAX_EXAMPLES])

    def _knowledge(self, device_name: str, ctx: ProposalContext) -> str:
        try:
            from kernelevolve.knowledge import render, retrieve
        except ImportError:  # the knowledge package is optional for this proposer
            return ""
        families = self.families
        bound = ctx.profile.bound if ctx.profile else None
        text = render(retrieve(device_name, families, bound, self.knowledge_dirs,
                               max_chars=self.budget_tokens * 4 // 3, cpu=self.device == "cpu",
                               exclude=PROMPT_EXCLUDED_NOTES))
        return re.sub(r"^(#+) ", r"##\1 ", text, flags=re.M)  # the notes' headings sit below the prompt's own

    # --- a batch of steps ---------------------------------------------------------------------------------------
    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        if self.done():
            return []
        waiting = sum(pending(node) for node in ctx.history if node.proposer == self.name)
        lines = self.concurrency - waiting
        if lines <= 0:  # every line of work waits for its verdict: the next step is built from it
            return []
        pin = self.prompt_inputs(ctx)
        best = fastest_verified(ctx.history)
        known = {node.sha: node for node in ctx.history}
        out: list[Candidate] = []
        while not out and not self.done():
            k = self._calls_allowed(min(n, lines))
            if not k:
                break
            steps = self.expander.plan(ctx.history, k)
            if not steps:  # every line of work is stopped: a verdict still to come may open one
                if not any(pending(node) for node in ctx.history):
                    self.stopped = (f"every line of work repeated candidates the run already holds "
                                    f"{self.expander.cfg.max_repeats} times in a row")
                break
            notes, self.notes = self.notes, []
            prompts = [build_prompt(strategy, pin, parent, kids, best, self.budget_tokens, notes=notes)
                       for strategy, parent, kids in steps]
            calls: Callable[[int], Reply] = lambda i: self.answer(prompts[i], i)  # noqa: E731
            workers = max(1, min(self.concurrency, len(prompts)))
            if workers == 1:  # in this thread: answer() may use the store, whose connection belongs to it
                replies = [calls(i) for i in range(len(prompts))]
            else:
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    replies = list(pool.map(calls, range(len(prompts))))
            for (strategy, parent, _), prompt, reply in zip(steps, prompts, replies):
                cand = self._candidate(strategy, parent, prompt, reply, known)
                if cand is not None:
                    known[cand.sha] = None  # a twin later in this batch is a repeat too
                    out.append(cand)
        if self.stopped:
            log.warning("%s stops: %s", self.name, self.stopped)
        return out

    def _candidate(self, strategy: str, parent: Node | None, prompt: Prompt, reply: Reply,
                   known: dict[str, Node | None] | None = None) -> Candidate | None:
        """The reply as a new candidate, recorded as a call; None for a failed call, a reply without code, or one
        that repeats a candidate in ``known`` (sha -> node; None for one proposed in the same batch)."""
        parent_id = parent.id if parent else None
        cand, twin = None, None
        if reply.text is None:
            status, detail = "error", reply.error
            log.warning("%s (%s): the call failed: %s", self.name, reply.model, reply.error)
        else:
            parsed = extract_code(reply.text)
            status, detail = ("candidate" if parsed.code else "no_code"), parsed.why
            if parsed.code is None:
                log.info("%s (%s): no candidate in the reply: %s", self.name, reply.model, parsed.why)
            else:
                meta = Meta(label=f"{strategy} ({reply.model})", strategy=strategy, model=reply.model,
                            families=self.families, prompt_tokens=prompt.tokens, dropped_sections=list(prompt.dropped))
                if reply.ref:
                    meta["reply"] = reply.ref
                cand = Candidate(parsed.code, proposer=self.name, language=language_of(parsed.code), parent=parent_id,
                                 meta=meta)
                if known is not None and cand.sha in known:
                    twin = known[cand.sha]
                    status, detail, cand = "repeat", repeat_detail(twin), None
        self._count(reply)
        call_id = None
        if self.store is not None and self.run_id is not None:
            call_id = self.store.add_llm_call(
                self.run_id, self.name, reply.model, strategy, status, detail, parent_id, reply.input_tokens,
                reply.output_tokens, reply.cost_usd, reply.latency_s, prompt.sha)
        self._tally(status, detail, parent_id, twin is not None)
        self.on_call(reply, status, detail)
        if cand is not None:
            cand.meta["llm_call"] = call_id
        return cand

    def _tally(self, status: str, detail: str, line: int | None, known: bool) -> None:
        """Count the outcome of a call toward the stop rules, and note a repeat for the next prompt. ``line``: the
        node the step expanded (None for scratch); ``known``: a repeat of a node the run holds (not of another reply
        of the same batch, which identical prompts may give: that counts against nothing)."""
        cfg = self.expander.cfg
        if status == "repeat":
            if known:
                self.repeats[line] = self.repeats.get(line, 0) + 1
                self.repeats_in_a_row += 1
                if self.repeats_in_a_row >= cfg.max_repeats_total:
                    self.stopped = f"{self.repeats_in_a_row} replies in a row repeated candidates the run already holds"
                note = (f"Your last reply was {detail}: it is not judged again. Take a clearly different approach "
                        "(another decomposition, fusion boundary, schedule or algorithm).")
                if note not in self.notes:
                    self.notes.append(note)
                if self.repeats[line] >= cfg.max_repeats:
                    self.expander.stale.add(line)
                    log.info("%s: %d replies in a row repeated known candidates; the line of %s stops", self.name,
                             self.repeats[line], "scratch steps" if line is None else f"node {line}")
            return
        self.repeats[line] = self.repeats_in_a_row = 0
        self.failed_calls = 0 if status == "candidate" else self.failed_calls + 1
        if self.failed_calls >= cfg.max_failed_calls:
            self.stopped = f"{self.failed_calls} calls in a row gave no candidate"


def repeat_detail(twin: Node | None) -> str:
    """What became of the candidate a reply repeats, in a few words."""
    if twin is None:
        return "identical to another reply of the same batch"
    if twin.result is not None:
        r = twin.result
        verdict = (f"verified at {r.runtime_ms:.4g} ms" if r.ok and r.timed and r.runtime_ms is not None
                   else "verified" if r.ok else f"judged {r.status.value}: {r.reason[:200]}")
    elif twin.screen is not None and twin.screened_out:
        sc = twin.screen
        verdict = (f"screened at {sc.ms:.4g} ms and not fast enough to judge" if sc.ok and sc.ms is not None
                   else f"stopped by the screen, {sc.status.value}: {sc.reason[:200]}")
    else:
        verdict = "still being judged"
    return f"identical to node {twin.id} ({twin.proposer}: {twin.meta.get('label', twin.id)}), {verdict}"


def _entry_families(entry: Experience) -> set[str]:
    """The op families of an earlier winner's problem, as recorded, else as its meta tells."""
    meta = entry.meta
    return set(entry.families) | {c["family"] for c in meta.get("configs", [])} | set(meta.get("families", []))


def _families(ctx: ProposalContext) -> list[str]:
    """The template families the problem's graph holds (none when it cannot be analysed)."""
    try:
        from kernelevolve.propose.template import plan_problem

        plan = plan_problem(ctx.problem, "cpu")
        return sorted({r.match.family for r in plan.regions}) if plan.error is None else []
    except Exception as e:  # analysis is a hint for retrieval only
        log.debug("no families for the prompt: %s", e)
        return []


class LLMProposer(PromptedProposer):
    """Prompts answered by language-model endpoints (``kernelevolve.propose.providers``)."""

    name = "llm"

    def __init__(self, device: str, settings: Any, client: Any = None, **kw: Any):
        from kernelevolve.evaluate.checks import register_secret

        super().__init__(device, concurrency=kw.pop("concurrency", settings.concurrency), **kw)
        self.settings = settings
        if client is None:
            from kernelevolve.propose.providers import LLMClient

            client = LLMClient(settings, seed=self.rng.randrange(1 << 30))
        self.client = client
        for spec in settings.models:
            if spec.key_env:  # whatever its name, the variable never reaches a candidate process
                register_secret(spec.key_env)

    def answer(self, prompt: Prompt, index: int) -> Reply:
        from kernelevolve.propose.providers import LLMError

        spec = self.client.pick()
        try:
            c = self.client.complete(prompt.system, prompt.user, spec)
        except LLMError as e:
            return Reply(None, spec.name, f"{e.kind}: {e}")
        return Reply(c.text, c.model or spec.name, "", c.input_tokens, c.output_tokens, c.cost_usd, c.latency_s)


__all__ = ["ExpandConfig", "Expander", "LLMProposer", "PromptedProposer", "Reply", "SpendLimits", "Step", "failed",
           "fastest_verified", "pending", "repeat_detail"]
