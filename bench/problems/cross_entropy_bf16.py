"""Mean cross-entropy of bf16 logits over a 128k vocabulary (transformer family: Llama-3 LM loss)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 2048
VOCAB = 128256
SMALL = {"TOKENS": 32, "VOCAB": 1000}


class Model(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs():
    return [(torch.randn(TOKENS, VOCAB) * 4).to(torch.bfloat16), torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return []
