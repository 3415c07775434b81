"""Proposers turn the problem, its profile and the search history into new candidate files."""
from __future__ import annotations

from typing import Any, Callable

from kernelevolve.propose.base import ProposalContext, Proposer, ProposerError


def make_proposers(names: list[str], device: str, options: dict[str, Any] | None = None) -> list[Proposer]:
    """Instantiate proposers by name (``inductor``, ``template``, ``llm``, ``manual``).

    ``options`` (JSON-safe, stored with the run) configures the prompted proposers: ``llm`` (an ``LLMSettings``
    dict), ``knowledge_dirs``, ``prompts_dir``, ``prompt_tokens``, ``manual_dir``, ``manual_timeout_s``, and the
    run's model budget ``max_calls``, ``max_tokens`` and ``max_cost_usd`` (absent: the defaults of SpendLimits; None
    or 0: no limit); and the template proposer's ``template_max`` (candidates per run at most; absent: no limit)."""
    from kernelevolve.propose.inductor import InductorProposer
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.spend import SpendLimits

    opts = options or {}
    prompted = {"knowledge_dirs": tuple(opts.get("knowledge_dirs") or ()), "prompts_dir": opts.get("prompts_dir"),
                "budget_tokens": int(opts.get("prompt_tokens") or 12000), "limits": SpendLimits.from_options(opts)}

    def llm() -> Proposer:
        from kernelevolve.propose.llm import LLMProposer
        from kernelevolve.propose.providers import LLMSettings

        if not opts.get("llm"):
            raise ProposerError("the llm proposer needs a model: --llm-model NAME (with --llm-base-url URL for an "
                                "OpenAI-compatible server) or --llm-config FILE")
        return LLMProposer(device, LLMSettings.from_dict(opts["llm"]), **prompted)

    def manual() -> Proposer:
        from kernelevolve.propose.manual import ManualProposer

        return ManualProposer(device, opts.get("manual_dir") or "kernelevolve-prompts",
                              float(opts.get("manual_timeout_s") or 3600.0), **prompted)

    registry: dict[str, Callable[[], Proposer]] = {
        "inductor": lambda: InductorProposer(device),
        "template": lambda: TemplateProposer(device, max_candidates=opts.get("template_max"),
                                             tensor_core_modes=device != "cpu"), "llm": llm,
        "manual": manual}
    if not names:
        raise ProposerError(f"no proposer named; available: {', '.join(sorted(registry))}")
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ProposerError(f"unknown proposer(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    return [registry[n]() for n in names]


PROPOSERS = ("template", "inductor", "llm", "manual")
# The default proposers where --proposer is not given. On the CPU, Triton runs under its interpreter, verified but
# never timed: torch.compile's configurations come first there, and the template proposer gets at most
# CPU_TEMPLATE_SHARE of --max-evals (at least one candidate, to show that its kernels verify).
DEFAULT_PROPOSERS = {"cuda": ("template", "inductor"), "cpu": ("inductor", "template")}
CPU_TEMPLATE_SHARE = 0.25


def default_proposers(device: str, max_evals: int) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The proposers a run on ``device`` gets by default, and the proposer options that go with them."""
    if device != "cpu":
        return DEFAULT_PROPOSERS["cuda"], {}
    return DEFAULT_PROPOSERS["cpu"], {"template_max": max(1, round(max_evals * CPU_TEMPLATE_SHARE))}


__all__ = ["CPU_TEMPLATE_SHARE", "DEFAULT_PROPOSERS", "PROPOSERS", "ProposalContext", "Proposer", "ProposerError",
           "default_proposers", "make_proposers"]
