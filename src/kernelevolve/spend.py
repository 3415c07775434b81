"""A run's budget for model calls (the llm and manual proposers), as its stored proposer options give it: read by
the proposers that spend it and by the CLI and the report that show it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpendLimits:
    """A run's budget for model calls: each limit None for none. The cost counts only calls whose price is known."""

    calls: int | None = 60
    tokens: int | None = 1_000_000  # input and output together
    cost_usd: float | None = 10.0

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "SpendLimits":
        """From a run's proposer options ``max_calls``, ``max_tokens``, ``max_cost_usd``: absent, the default; 0 or
        None, no limit."""
        d = cls()
        get = lambda key, default: (options[key] or None) if key in options else default  # noqa: E731
        return cls(get("max_calls", d.calls), get("max_tokens", d.tokens), get("max_cost_usd", d.cost_usd))
