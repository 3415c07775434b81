"""DCN-v2 cross network, three layers of x0 * (W x + b) + x, fp32 (ads ranking family: feature-crossing tower of
DCN-v2 rankers)."""
import torch
import torch.nn as nn

BATCH = 8192
DIM = 1024
LAYERS = 3
SMALL = {"BATCH": 32, "DIM": 64}


class Model(nn.Module):
    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.cross = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return x


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [DIM, LAYERS]
