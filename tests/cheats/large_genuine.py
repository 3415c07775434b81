"""Genuine: the large elementwise problem, computed in place on a fresh output."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.mul(x, 2.0)
        return out.add_(1.0).relu_()
