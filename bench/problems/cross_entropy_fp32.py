"""Mean cross-entropy of fp32 logits over a 32k vocabulary with integer targets (transformer family: LM loss)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 4096
VOCAB = 32000
SMALL = {"TOKENS": 32, "VOCAB": 1000}


class Model(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs():
    return [torch.randn(TOKENS, VOCAB) * 4, torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return []
