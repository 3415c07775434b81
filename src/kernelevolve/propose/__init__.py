"""Proposers turn the problem, its profile and the search history into new candidate files."""
from __future__ import annotations

from typing import Any, Callable

from kernelevolve.propose.base import ProposalContext, Proposer, ProposerError


def make_proposers(names: list[str], device: str, options: dict[str, Any] | None = None) -> list[Proposer]:
    """Instantiate proposers by name (``inductor``, ``template``, ``llm``, ``manual``).

    ``options`` (JSON-safe, stored with the run) configures the prompted proposers: ``llm`` (an ``LLMSettings``
    dict), ``knowledge_dirs``, ``prompts_dir``, ``prompt_tokens``, ``manual_dir``, ``manual_timeout_s``, and the
    run's model budget ``max_calls``, ``max_tokens`` and ``max_cost_usd`` (absent: the defaults of SpendLimits; None
    or 0: no limit)."""
    from kernelevolve.propose.inductor import InductorProposer
    from kernelevolve.propose.llm import SpendLimits
    from kernelevolve.propose.template import TemplateProposer

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
        "inductor": lambda: InductorProposer(device), "template": lambda: TemplateProposer(device), "llm": llm,
        "manual": manual}
    if not names:
        raise ProposerError(f"no proposer named; available: {', '.join(sorted(registry))}")
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ProposerError(f"unknown proposer(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    return [registry[n]() for n in names]


PROPOSERS = ("template", "inductor", "llm", "manual")

__all__ = ["PROPOSERS", "ProposalContext", "Proposer", "ProposerError", "make_proposers"]
