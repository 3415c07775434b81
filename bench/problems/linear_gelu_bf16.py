"""Linear + bias + exact GELU in bf16 (transformer family: the up-projection of a GPT-style MLP)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
IN_FEATURES = 4096
OUT_FEATURES = 16384
SMALL = {"TOKENS": 32, "IN_FEATURES": 64, "OUT_FEATURES": 128}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES).to(torch.bfloat16)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
