"""A router: softmax over the experts of x W^T + b, in bf16 (transformer family: the gate of a mixture-of-experts
layer; ads ranking family: the gate of an MMoE ranker)."""
import torch
import torch.nn as nn

TOKENS = 32768
HIDDEN = 2048
EXPERTS = 128
SMALL = {"TOKENS": 17, "HIDDEN": 64, "EXPERTS": 24}


class Model(nn.Module):
    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.gate = nn.Linear(hidden, experts)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.gate(x), dim=-1)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN).to(torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, EXPERTS]
