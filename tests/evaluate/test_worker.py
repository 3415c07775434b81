"""Unit tests of the child side that need no child process."""
from __future__ import annotations

import pytest

from kernelevolve.evaluate.worker import classify


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as e:  # noqa: BLE001 - building a realistic exception with its cause
        return e


def test_plain_errors_are_runtime_errors():
    assert classify(RuntimeError("boom")) == "runtime_error"
    assert classify(AttributeError("x")) == "runtime_error"


def test_triton_compilation_error_is_a_compile_error():
    errors = pytest.importorskip("triton.compiler.errors")
    assert classify(errors.CompilationError.__new__(errors.CompilationError)) == "compile_error"


@pytest.mark.parametrize("cause", [AttributeError("no tl.foo"), NameError("x"), TypeError("t"),
                                   ValueError("incompatible dimensions")])
def test_interpreter_errors_that_a_compiler_would_report_are_compile_errors(cause):
    errors = pytest.importorskip("triton.runtime.errors")
    assert classify(_raised(errors.InterpreterError(repr(cause)), cause)) == "compile_error"
    nested = _raised(errors.InterpreterError("outer"), _raised(errors.InterpreterError("inner"), cause))
    assert classify(nested) == "compile_error"


def test_other_interpreter_errors_are_runtime_errors():
    errors = pytest.importorskip("triton.runtime.errors")
    assert classify(_raised(errors.InterpreterError("x"), RuntimeError("y"))) == "runtime_error"
    assert classify(errors.InterpreterError("no cause")) == "runtime_error"


def _compilation_error(message: str | None, cause: BaseException | None = None) -> BaseException:
    import ast

    errors = pytest.importorskip("triton.compiler.errors")
    src = "def kernel(x):\n    y = tl.no_such_function(x)\n"
    node = ast.parse(src).body[0].body[0]
    return _raised(errors.CompilationError(src, node, message), cause)


def test_compilation_error_reason_names_the_error_not_just_the_location():
    from kernelevolve.evaluate.worker import _one_line

    reason = _one_line(_compilation_error("'tl' has no attribute 'no_such_function'\nmore"))
    assert reason == "CompilationError: at 2:4: 'tl' has no attribute 'no_such_function'"
    reason = _one_line(_compilation_error(None, AttributeError("no attribute 'no_such_function'")))
    assert reason == "CompilationError: at 2:4: AttributeError(\"no attribute 'no_such_function'\")"
