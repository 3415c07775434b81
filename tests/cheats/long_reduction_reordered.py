"""Genuine: the same fp32 product summed in another order (8 partial products over strided slices of K, then added)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        parts = x.reshape(m, 8, k // 8).transpose(0, 1) @ w.reshape(8, k // 8, w.shape[1])
        return parts.sum(0)
