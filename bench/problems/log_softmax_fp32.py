"""Log-softmax over a padded GPT-2 vocabulary in fp32 (transformer family: LM-head log-probabilities)."""
import torch
import torch.nn as nn

TOKENS = 2048
VOCAB = 50304
SMALL = {"TOKENS": 32, "VOCAB": 1000}


class Model(nn.Module):
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)


def get_inputs():
    return [torch.randn(TOKENS, VOCAB) * 4]


def get_init_inputs():
    return []
