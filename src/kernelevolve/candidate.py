"""Candidate: one self-contained ModelNew source file, with where it came from."""
from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, TypedDict

LANGUAGES = ("triton", "inductor", "torch", "cuda")

Genome = dict[str, dict[str, Any]]  # template region key -> the knob values of its family's space


class RegionConfig(TypedDict):
    """One template region's configuration, as experience records it: later runs seed per family from it."""

    family: str
    kind: str
    config: dict[str, Any]


class RegionInfo(TypedDict):
    key: str
    family: str
    kind: str
    nodes: int  # ATen ops the region covers


class Meta(TypedDict, total=False):
    """What a proposer records about a candidate, stored as the node's JSON meta. A TypedDict rather than a dataclass:
    each proposer writes its own keys, and keys from other proposers or older stores must survive a round trip."""

    label: str  # every proposer: one line on what the candidate is
    # template: the genome it reads back to breed from, and the per-family view experience keeps
    genome: Genome
    configs: list[RegionConfig]
    regions: list[RegionInfo]
    options: dict[str, Any]  # inductor: the Inductor options, its own search state
    baseline: str  # a proposer's fallback: the field of the run's Baseline that timed this same kernel
    # llm and manual: the step that made it, and the call recorded in llm_calls
    strategy: str
    model: str
    families: list[str]
    prompt_tokens: int
    dropped_sections: list[str]
    llm_call: int | None
    reply: str  # manual: the reply file it came from (its verdict is written beside it)
    start: str  # start: the name of the user's file this node is (a root of the tree)
    root: int  # start: the node of the start file this variant tunes
    reused: bool  # the search loop: seeded from a kernel already verified in another run


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
    meta: Meta = field(default_factory=Meta, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.language:
            object.__setattr__(self, "language", detect_language(self.source))

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


COMPILED_TEMPLATE = '''"""Candidate from kernelevolve's inductor proposer: torch.compile of the reference ({label}).

Inductor options: {options_json}
"""
import torch

# ---- the reference, verbatim from the problem file ------------------------------------------------------------
{problem_source}
# ---- end of reference -----------------------------------------------------------------------------------------

COMPILE_OPTIONS = {options_repr}


class ModelNew(Model):
    """The reference's forward under torch.compile; same constructor and state_dict as Model."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._compiled = torch.compile(super().forward, options=COMPILE_OPTIONS or None, dynamic=False)

    def forward(self, *args):
        return self._compiled(*args)
'''


def options_key(options: dict[str, Any]) -> str:
    """Inductor options as one canonical string: equal options, equal keys."""
    return json.dumps(options, sort_keys=True)


def compiled_source(problem_source: str, options: dict[str, Any], label: str) -> str:
    """A candidate file that runs the reference's forward under torch.compile with these Inductor options (the
    inductor proposer's candidates, and torch.compile's own kernel where a run answers with that baseline)."""
    return COMPILED_TEMPLATE.format(label=label, options_json=options_key(options),
                                    problem_source=problem_source.rstrip(),
                                    options_repr=repr(dict(sorted(options.items()))))


def diff_text(start: str, variant: str, name: str = "start", labels: tuple[str, str] | None = None) -> str:
    """The variant against its start file, as a unified diff; ``labels`` name the two sides (default: the start
    file's ``name``, as start and variant)."""
    old, new = labels or (f"{name} (start)", f"{name} (variant)")
    return "".join(difflib.unified_diff(start.splitlines(keepends=True), variant.splitlines(keepends=True), old, new,
                                        n=1))
