"""nn.EmbeddingBag sum pooling over a 1M-row fp32 table with variable-length bags (ads ranking family: sparse feature
lookup of a DLRM-style model)."""
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
        self.bag = nn.EmbeddingBag(num_embeddings, dim, mode="sum")

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bag(indices, offsets)


def get_inputs():
    # Bag boundaries at random cut points: the lengths vary (empty bags included) while the total stays fixed.
    total = BAGS * AVG_BAG
    cuts = torch.randint(0, total + 1, (BAGS - 1,)).sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
    return [torch.randint(0, NUM_EMBEDDINGS, (total,)), offsets]


def get_init_inputs():
    return [NUM_EMBEDDINGS, DIM]
