"""SwiGLU MLP, (silu(x W1) * (x W3)) W2, in fp32 with TF32 not allowed (transformer family: a small model's
feed-forward block run at full precision)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 2048
HIDDEN = 2048
INTERMEDIATE = 5632
SMALL = {"TOKENS": 17, "HIDDEN": 32, "INTERMEDIATE": 48}


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
