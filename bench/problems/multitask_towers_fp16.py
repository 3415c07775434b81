"""Multi-task towers: T small two-layer MLPs run as batched baddbmm + bias + ReLU, fp16 (ads ranking family: per-task
heads of MMoE / PLE multi-task rankers)."""
import torch
import torch.nn as nn

TASKS = 8
BATCH = 16384
DIM = 256
SMALL = {"TASKS": 2, "BATCH": 32, "DIM": 16}


class Model(nn.Module):
    def __init__(self, tasks: int, dim: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(tasks, dim, dim) / dim**0.5)
        self.b1 = nn.Parameter(torch.randn(tasks, 1, dim) * 0.1)
        self.w2 = nn.Parameter(torch.randn(tasks, dim, dim) / dim**0.5)
        self.b2 = nn.Parameter(torch.randn(tasks, 1, dim) * 0.1)
        self.to(torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.baddbmm(self.b1, x, self.w1))
        return torch.relu(torch.baddbmm(self.b2, h, self.w2))


def get_inputs():
    return [torch.randn(TASKS, BATCH, DIM).to(torch.float16)]


def get_init_inputs():
    return [TASKS, DIM]
