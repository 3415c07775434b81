"""Cheat (GPU): the work runs on a side stream, after half a millisecond of spinning, while the calling stream
has nothing to time. Correct once the device is synchronized; the time shows only as device-idle time."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))
        self._side = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._side is None:
            self._side = torch.cuda.Stream()
        out = torch.empty_like(x)
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            torch.cuda._sleep(1_000_000)
            out.copy_(torch.relu(x * self.scale + self.bias))
        return out
