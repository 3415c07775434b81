"""Selection: which nodes of the search tree to expand next."""
from __future__ import annotations

from typing import Any, Protocol

from kernelevolve.rows import runtime


class Selector(Protocol):
    def select(self, history: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
        ...


def best_node(history: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The fastest timed ok node; else the first verified one; with the reason for the choice."""
    timed = [n for n in history if runtime(n) is not None]
    if timed:
        return min(timed, key=runtime), "fastest timed candidate"
    verified = [n for n in history if n.get("result") is not None and n["result"].ok]
    if verified:
        return verified[0], "best verified candidate (no candidate was timed)"
    return None, "no candidate was verified"


class GreedySelector:
    """Best-first: expand the k fastest verified nodes."""

    def select(self, history: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
        timed = sorted((n for n in history if runtime(n) is not None), key=runtime)
        if timed:
            return timed[:k]
        return [n for n in history if n.get("result") is not None and n["result"].ok][:k]


SELECTORS = {"greedy": GreedySelector}


def make_selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise ValueError(f"unknown selection strategy {name!r}; available: {', '.join(SELECTORS)}")
    return SELECTORS[name]()
