"""Jagged sum pooling of [total, D] fp32 values by per-row lengths via torch.segment_reduce (ads ranking family:
user-history sequence pooling in TorchRec-style jagged tensors)."""
import torch
import torch.nn as nn

BATCH = 16384
AVG_LEN = 32
DIM = 128
SMALL = {"BATCH": 32, "AVG_LEN": 4, "DIM": 16}


class Model(nn.Module):
    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(values, "sum", lengths=lengths, axis=0, unsafe=True)


def get_inputs():
    # Random cut points: lengths vary (zeros included) and always sum to BATCH * AVG_LEN.
    total = BATCH * AVG_LEN
    cuts = torch.randint(0, total + 1, (BATCH - 1,)).sort().values
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.full((1,), total, dtype=torch.long)])
    return [torch.randn(total, DIM), bounds.diff()]


def get_init_inputs():
    return []
