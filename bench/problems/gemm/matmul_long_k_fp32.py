"""A skinny fp32 product with a long reduction, A [256, 65536] @ B [65536, 256], TF32 not allowed (ads ranking
family: a Gram matrix of feature statistics over a large batch)."""
import torch
import torch.nn as nn

M = 256
K = 65536
N = 256
SMALL = {"M": 17, "K": 1023, "N": 33}


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
