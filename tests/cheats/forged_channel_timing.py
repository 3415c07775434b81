"""Cheat: wraps the worker's result channel and divides every reported time of the timed loop by 100. Nothing the
tamper check watches is touched: only the parent's own clock of the loop can tell."""
import sys
import time

import torch
import torch.nn as nn

_worker = sys.modules["kernelevolve.evaluate.worker"]
_send = _worker.Channel.send


def _send_faster(self, header, blob=b""):
    if header.get("msg") == "timed":
        header = dict(header, samples_ms=[t / 100 for t in header["samples_ms"]],
                      device_ms=[t / 100 for t in header["device_ms"]])
    return _send(self, header, blob)


_worker.Channel.send = _send_faster


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.2)
        return torch.relu(x * self.scale + self.bias)
