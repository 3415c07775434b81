"""Jagged mean pooling of bf16 values by offsets, accumulated in fp32 (ads ranking family: mean-pooled sequence
features of jagged tensors)."""
import torch
import torch.nn as nn

BATCH = 16384
AVG_LEN = 32
DIM = 256
SMALL = {"BATCH": 32, "AVG_LEN": 4, "DIM": 16}


class Model(nn.Module):
    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch = offsets.numel() - 1
        positions = torch.arange(values.shape[0], device=values.device)
        segment = torch.searchsorted(offsets, positions, right=True) - 1
        sums = torch.zeros(batch, values.shape[1], dtype=torch.float32, device=values.device)
        sums.index_add_(0, segment, values.float())
        lengths = (offsets[1:] - offsets[:-1]).clamp(min=1)
        return (sums / lengths.unsqueeze(1)).to(values.dtype)


def get_inputs():
    total = BATCH * AVG_LEN
    cuts = torch.randint(0, total + 1, (BATCH - 1,)).sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.full((1,), total, dtype=torch.long)])
    return [torch.randn(total, DIM).to(torch.bfloat16), offsets]


def get_init_inputs():
    return []
