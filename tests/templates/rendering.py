"""Shared by the template tests: write a tiny problem, capture it, render a match and run it on the traced values."""
from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import torch

from kernelevolve.analyze.graph import CapturedGraph, capture, node_values
from kernelevolve.problem import load_problem
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS
from kernelevolve.templates.base import FILE_HEADER, load_source

_count = itertools.count()


def captured(tmp_path: Path, source: str) -> CapturedGraph:
    path = tmp_path / f"problem_{next(_count)}.py"
    path.write_text(textwrap.dedent(source))
    return capture(load_problem(path))


def run_match(template: Any, graph: CapturedGraph, match: Any, config: dict[str, Any] | None = None,
              atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """Render ``match`` with ``config`` (defaults when None) and compare its outputs with the traced values."""
    space = template.space(match, "cpu")
    cfg = {k: v[0] for k, v in space.items()}
    cfg.update(config or {})
    name = f"k{next(_count)}"
    module = load_source(FILE_HEADER + PRELUDE_IMPORTS + "\n" + PRELUDE + template.render(match, cfg, name), name)
    values = node_values(graph)
    got = getattr(module, name)(*[values[n] for n in match.inputs])
    assert len(got) == len(match.outputs)
    for out, node in zip(got, match.outputs):
        torch.testing.assert_close(out, values[node], atol=atol, rtol=rtol, equal_nan=True)
