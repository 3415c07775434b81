"""Embedding-bag mean written as index_select + index_add_ segment reduction, fp32 (ads ranking family: the pooled
lookup as hand-written model code expresses it)."""
import torch
import torch.nn as nn

NUM_EMBEDDINGS = 1_000_000
DIM = 128
BAGS = 16384
AVG_BAG = 20
SMALL = {"NUM_EMBEDDINGS": 1000, "DIM": 16, "BAGS": 32, "AVG_BAG": 4}


class Model(nn.Module):
    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_embeddings, dim))

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        rows = self.weight.index_select(0, indices)
        positions = torch.arange(indices.numel(), device=indices.device)
        bag = torch.searchsorted(offsets, positions, right=True) - 1
        sums = torch.zeros(offsets.numel(), rows.shape[1], dtype=rows.dtype, device=rows.device)
        sums.index_add_(0, bag, rows)
        counts = torch.bincount(bag, minlength=offsets.numel()).clamp(min=1)
        return sums / counts.unsqueeze(1).to(sums.dtype)


def get_inputs():
    total = BAGS * AVG_BAG
    cuts = torch.randint(0, total + 1, (BAGS - 1,)).sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
    return [torch.randint(0, NUM_EMBEDDINGS, (total,)), offsets]


def get_init_inputs():
    return [NUM_EMBEDDINGS, DIM]
