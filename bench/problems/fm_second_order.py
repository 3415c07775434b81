"""Factorization-machine second-order term, 0.5 * ((sum_f x)^2 - sum_f x^2) summed over the embedding dim, fp32
(ads ranking family: the FM component of DeepFM over 39 Criteo fields)."""
import torch
import torch.nn as nn

BATCH = 65536
FIELDS = 39
DIM = 64
SMALL = {"BATCH": 32, "FIELDS": 5, "DIM": 16}


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square_of_sum = x.sum(dim=1).pow(2)
        sum_of_square = x.pow(2).sum(dim=1)
        return 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, FIELDS, DIM)]


def get_init_inputs():
    return []
