"""Selection: which nodes of the search tree to expand next."""
from __future__ import annotations

from typing import Protocol

from kernelevolve.rows import Node, fastest_timed


class Selector(Protocol):
    def select(self, history: list[Node], k: int) -> list[Node]:
        ...


def best_node(history: list[Node]) -> tuple[Node | None, str]:
    """The fastest timed ok node; else the first verified one; with the reason for the choice."""
    timed = fastest_timed(history)
    if timed:
        return timed[0], "fastest timed candidate"
    verified = [n for n in history if n.ok]
    if verified:
        return verified[0], "best verified candidate (no candidate was timed)"
    return None, "no candidate was verified"


class GreedySelector:
    """Best-first: expand the k fastest verified nodes."""

    def select(self, history: list[Node], k: int) -> list[Node]:
        return (fastest_timed(history) or [n for n in history if n.ok])[:k]


SELECTORS = {"greedy": GreedySelector}


def make_selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise ValueError(f"unknown selection strategy {name!r}; available: {', '.join(SELECTORS)}")
    return SELECTORS[name]()
