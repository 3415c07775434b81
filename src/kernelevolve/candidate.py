"""Candidate: one self-contained ModelNew source file, with where it came from."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

LANGUAGES = ("triton", "inductor", "torch", "cuda")


def detect_language(source: str) -> str:
    if re.search(r"@triton\.(jit|autotune|heuristics)", source):
        return "triton"
    if "torch.compile(" in source:
        return "inductor"
    if "load_inline(" in source:
        return "cuda"
    return "torch"


@dataclass(frozen=True)
class Candidate:
    source: str
    proposer: str = "manual"
    language: str = ""
    parent: int | None = None  # node id in the run's search tree
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.language:
            object.__setattr__(self, "language", detect_language(self.source))

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()
