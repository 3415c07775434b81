"""Selection: which nodes of the search tree to expand next."""
from __future__ import annotations

from typing import Protocol

from kernelevolve.rows import Node, best_node, fastest_timed  # noqa: F401  (best_node: its old home)


__all__ = ["SELECTORS", "GreedySelector", "Selector", "best_node", "make_selector"]


class Selector(Protocol):
    def select(self, history: list[Node], k: int) -> list[Node]:
        ...


class GreedySelector:
    """Best-first: expand the k fastest verified nodes."""

    def select(self, history: list[Node], k: int) -> list[Node]:
        return (fastest_timed(history) or [n for n in history if n.ok])[:k]


SELECTORS = {"greedy": GreedySelector}


def make_selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise ValueError(f"unknown selection strategy {name!r}; available: {', '.join(SELECTORS)}")
    return SELECTORS[name]()
