"""Forges the times of its first timed loop only (divided by 100), then reports honestly: the parent's clock catches
the first loop, the loop is timed again, and the honest second loop is the one that counts. How a loop stalled once
by a loaded machine is treated, made repeatable."""
import sys
import time

import torch
import torch.nn as nn

_worker = sys.modules["kernelevolve.evaluate.worker"]
_send = _worker.Channel.send
_forged = []


def _send_faster_once(self, header, blob=b""):
    if header.get("msg") == "timed" and not _forged:
        _forged.append(True)
        header = dict(header, samples_ms=[t / 100 for t in header["samples_ms"]],
                      device_ms=[t / 100 for t in header["device_ms"]])
    return _send(self, header, blob)


_worker.Channel.send = _send_faster_once


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.2)
        return torch.relu(x * self.scale + self.bias)
