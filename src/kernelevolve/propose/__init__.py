"""Proposers turn the problem, its profile and the search history into new candidate files."""
from __future__ import annotations

from kernelevolve.propose.base import ProposalContext, Proposer, ProposerError


def make_proposers(names: list[str], device: str) -> list[Proposer]:
    """Instantiate proposers by name (``inductor``, ``template``)."""
    from kernelevolve.propose.inductor import InductorProposer
    from kernelevolve.propose.template import TemplateProposer

    registry = {"inductor": lambda: InductorProposer(device), "template": lambda: TemplateProposer(device)}
    if not names:
        raise ProposerError(f"no proposer named; available: {', '.join(sorted(registry))}")
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ProposerError(f"unknown proposer(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    return [registry[n]() for n in names]


__all__ = ["ProposalContext", "Proposer", "ProposerError", "make_proposers"]
