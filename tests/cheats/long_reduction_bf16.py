"""Cheat: computes the fp32 product from bf16 operands and returns it as fp32."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.bfloat16() @ w.bfloat16()).float()
