"""A skinny fp32 product with a reduction 65536 long, accumulated 16 terms at a time as a blocked kernel does: the
reference itself is about 1e-3 from the exact result, so near-zero outputs of any other summation order fall outside
atol=1e-3 around it."""
import torch
import torch.nn as nn

M, N, K, CHUNK = 128, 128, 65536, 16


class Model(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
        for k in range(0, x.shape[1], CHUNK):
            acc += x[:, k:k + CHUNK] @ w[k:k + CHUNK]
        return acc


def get_inputs():
    return [torch.randn(M, K) * 16, torch.randn(K, N)]


def get_init_inputs():
    return []
