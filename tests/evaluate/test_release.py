"""Outputs a child shares on the device go back as soon as the parent has its copies: the parent asks the child to
let them go (and the child answers once its freed memory is back with the driver), before the next reference."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from kernelevolve.evaluate.evaluator import _shared_back, _Verdict


class _Child:
    def __init__(self, reply: str = "released") -> None:
        self.sent: list[dict[str, Any]] = []
        self.reply = reply

    def send(self, cmd: dict[str, Any]) -> None:
        self.sent.append(cmd)

    def recv(self) -> tuple[dict[str, Any], bytes]:
        return {"msg": self.reply}, b""


def test_shared_outputs_are_released_at_once() -> None:
    child, outs = _Child(), (torch.zeros(2),)
    assert _shared_back(child, {"tensors": [], "shared": [{"handle": "00", "bytes": 8}]}, outs) is outs
    assert child.sent == [{"cmd": "release"}]


def test_outputs_sent_by_bytes_need_no_release() -> None:
    child = _Child()
    _shared_back(child, {"tensors": []}, ())
    assert child.sent == []


def test_a_child_that_answers_otherwise_breaks_the_protocol() -> None:
    with pytest.raises(_Verdict, match="protocol violation"):
        _shared_back(_Child("output"), {"shared": []}, ())


def test_the_child_serves_the_release_command() -> None:
    from kernelevolve.evaluate.worker import Session

    assert callable(getattr(Session, "cmd_release", None))
