"""The template seam: a family finds the regions of a captured graph it can run, and renders kernels for them.

A ``Match`` claims a convex set of graph nodes. The kernel file a template renders defines one launcher,
``def <name>(*inputs)``, that takes the match's ``inputs`` (runtime tensors, in order) and returns a tuple with one
tensor per ``outputs`` entry, each equal to what that ATen node computes (shape, dtype, values; contiguous strides).
The candidate file is assembled from the problem's source, every rendered kernel and a generated forward.
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol

import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, is_convex, region_io


class TemplateError(Exception):
    pass


class HopelessConfig(TemplateError):
    """A configuration that would render but cannot be worth compiling (its tile spills out of the registers, say):
    the proposer skips that configuration, and the region stays usable with others."""


@dataclass(eq=False)
class Match:
    family: str
    nodes: list[fx.Node]  # claimed nodes, in graph order
    inputs: list[fx.Node]  # external values the launcher takes, in order
    outputs: list[fx.Node]  # values the launcher returns, in order
    spec: dict[str, Any] = field(default_factory=dict)  # what the family needs to render; plain data
    kind: str = ""  # the region class, e.g. "row_reduction", "attention"; defaults to the family

    def __post_init__(self) -> None:
        self.kind = self.kind or self.family

    @property
    def key(self) -> str:
        return f"{self.family}:{','.join(n.name for n in self.nodes)}"


class Template(Protocol):
    family: str

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        """Non-overlapping matches among nodes not in ``taken`` (claimed by families tried earlier)."""
        ...

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        """Knobs and their values as plain data; the first value of each is the default."""
        ...

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        """Source text of the kernel(s) and the launcher ``name``; every module-level name starts with ``name``."""
        ...


def make_match(family: str, nodes: list[fx.Node], spec: dict[str, Any] | None = None, kind: str = "",
               inputs: list[fx.Node] | None = None) -> Match | None:
    """A match over ``nodes`` with inputs/outputs worked out, or None when the set is not convex."""
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    nodes = sorted(set(nodes), key=order.__getitem__)
    if not nodes or not is_convex(nodes):
        return None
    found_inputs, outputs = region_io(nodes)
    if inputs is not None:
        if set(inputs) != set(found_inputs):
            raise TemplateError(f"{family}: declared inputs {inputs} differ from the region's {found_inputs}")
        found_inputs = inputs
    return Match(family, nodes, found_inputs, outputs, spec or {}, kind)


def load_source(source: str, name: str = "kernelevolve_rendered") -> ModuleType:
    """Import rendered source from a real file (triton.jit needs one to read the kernel source back)."""
    folder = Path(tempfile.mkdtemp(prefix="kernelevolve-src-"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


FILE_HEADER = "import torch\nimport triton\nimport triton.language as tl\n"


def claim_each(graph: CapturedGraph, taken: set[fx.Node],
               claim: Callable[[fx.Node, set[fx.Node]], Match | None]) -> list[Match]:
    """Offer every call of ``graph`` not yet taken to ``claim``, in graph order; the nodes of each match are taken
    from then on. ``claim`` gets the node and the nodes taken so far, and answers with a match or None."""
    used, found = set(taken), []
    for node in graph.calls():
        if node in used:
            continue
        match = claim(node, used)
        if match is not None:
            found.append(match)
            used |= set(match.nodes)
    return found
