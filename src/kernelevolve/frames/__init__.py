"""The frames of the files kernelevolve writes (a candidate's ModelNew, an exported module and its test, a problem
file with derived inputs), each a text file here with ``$name`` placeholders (``string.Template``)."""
from __future__ import annotations

from functools import cache
from importlib.resources import files
from string import Template


@cache
def _frame(name: str) -> Template:
    return Template(files(__package__).joinpath(name).read_text())


def fill(name: str, **values: object) -> str:
    """Frame ``name`` (a file of this folder) with every placeholder filled; a missing value raises KeyError."""
    return _frame(name).substitute(**values)
