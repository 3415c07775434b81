"""The family registry: every family class of the library exactly once, in the order families claim regions."""
import importlib
import inspect
import pkgutil

import kernelevolve.templates
from kernelevolve.templates.registry import FAMILIES, NAMES


def library_families() -> set[type]:
    """The family classes defined anywhere under kernelevolve.templates: a class with a family name and the seam."""
    found = set()
    for info in pkgutil.walk_packages(kernelevolve.templates.__path__, "kernelevolve.templates."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and isinstance(getattr(cls, "family", None), str) and all(
                    callable(getattr(cls, m, None)) for m in ("find", "space", "render")):
                found.add(cls)
    return found


def test_every_family_registered_once():
    classes = [f.template for f in FAMILIES]
    assert len(set(classes)) == len(classes)
    assert set(classes) == library_families()


def test_names_are_unique_and_the_classes_own():
    assert len(set(NAMES)) == len(NAMES)
    assert NAMES == tuple(f.name for f in FAMILIES)
    for family in FAMILIES:
        assert family.name == family.template.family, family


def test_claim_order_and_aten_alternatives():
    # the bigger pattern first: the towers before attention, SwiGLU, DCN and a GEMM with its row reduction before the
    # plain GEMM (and the reduction), reductions before the pointwise chains around them
    assert NAMES == ("batched_matmul", "attention", "interaction", "segment", "dual_gemm", "cross", "matmul_reduction",
                     "matmul", "scan", "pool", "row_reduction", "pointwise")
    assert {f.name for f in FAMILIES if f.optional} == {"matmul", "batched_matmul", "dual_gemm", "cross",
                                                        "matmul_reduction", "scan", "pool"}
