"""The layers the data flows through: modules that only read the store or write files import nothing above them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kernelevolve

SRC = Path(kernelevolve.__file__).parent
ABOVE = ("kernelevolve.search", "kernelevolve.optimize", "kernelevolve.propose")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("module", ["report.py", "export.py"])
def test_readers_import_nothing_above_them(module):
    above = sorted(m for m in _imports(SRC / module) if m.startswith(ABOVE))
    assert not above, f"{module} imports {above}"


def test_old_import_paths_still_work():
    from kernelevolve import candidate, evaluate, optimize, rows, spend
    from kernelevolve.propose import inductor, llm, start

    assert optimize.make_evaluator is evaluate.make_evaluator
    assert inductor.render is candidate.compiled_source and inductor.config_key is candidate.options_key
    assert start.diff_text is candidate.diff_text
    assert llm.SpendLimits is spend.SpendLimits
    assert rows.best_node([]) == (None, "no candidate was verified")
