"""The search tree's rows as the code passes them around, and what is read off them."""
from __future__ import annotations

from typing import Any


def runtime(node: dict[str, Any]) -> float | None:
    """A node's run time when it was verified and timed, else None."""
    r = node.get("result")
    return r.runtime_ms if r is not None and r.ok and r.timed else None
