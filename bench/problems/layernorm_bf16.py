"""nn.LayerNorm over a wide hidden dimension in bf16 (transformer family: pre-norm blocks of large models)."""
import torch
import torch.nn as nn

TOKENS = 16384
HIDDEN = 8192
SMALL = {"TOKENS": 64, "HIDDEN": 256}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.1)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN).to(torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN]
