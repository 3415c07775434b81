"""Task towers: one shared input through T per-task heads, relu(x W1[t] + b1[t]) then sigmoid(h W2[t] + b2[t]) to one
logit per task, fp32 (ads ranking family: the output heads of a multi-task ranker)."""
import torch
import torch.nn as nn

TASKS = 8
BATCH = 8192
DIM = 512
HIDDEN = 256
SMALL = {"TASKS": 3, "BATCH": 33, "DIM": 24, "HIDDEN": 16}


class Model(nn.Module):
    def __init__(self, tasks: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(tasks, dim, hidden) / dim**0.5)
        self.b1 = nn.Parameter(torch.randn(tasks, 1, hidden) * 0.1)
        self.w2 = nn.Parameter(torch.randn(tasks, hidden, 1) / hidden**0.5)
        self.b2 = nn.Parameter(torch.randn(tasks, 1, 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.matmul(x.unsqueeze(0), self.w1) + self.b1)  # [tasks, batch, hidden]
        return torch.sigmoid(torch.matmul(h, self.w2) + self.b2).squeeze(-1).transpose(0, 1)  # [batch, tasks]


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [TASKS, DIM, HIDDEN]
