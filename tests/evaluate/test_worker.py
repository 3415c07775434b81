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


def test_outputs_kept_in_host_memory_are_never_shared_through_the_device():
    """A checked copy kept on the host goes by the host path: exporting it would copy its bytes to a temporary,
    not into the shared block, and take device room the parent's references need."""
    import torch

    from kernelevolve.evaluate import devshare
    from kernelevolve.evaluate.worker import Session

    class NoExport:
        def export(self, tensors):
            raise AssertionError("host tensors exported through the device")

    session = Session.__new__(Session)
    session.device, session.job, session.exporter = "cuda", {"share_min_bytes": 0}, NoExport()
    header, blob = session._pack([torch.arange(6, dtype=torch.float32)])
    chunks = blob if isinstance(blob, list) else [blob]
    assert "shared" not in header and sum(len(memoryview(c).cast("B")) for c in chunks) == 24
    with pytest.raises(devshare.DeviceShareError, match="only device tensors"):
        devshare.Exporter().export([torch.ones(3)])


def test_shared_outputs_leave_room_for_the_parents_references(monkeypatch):
    """Where a copy would leave less than the reserve free on the device, it goes to host memory."""
    import torch

    from kernelevolve.evaluate import devshare

    monkeypatch.setattr(devshare, "_free_bytes", lambda device: 1000)
    out = devshare._room_for(600, torch.device("cuda"), reserve=500)
    assert out.device.type == "cpu" and out.numel() == 600
