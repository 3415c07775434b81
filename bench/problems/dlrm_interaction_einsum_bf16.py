"""DLRM pairwise dot interaction written with einsum and a flat triangle index, bf16 (ads ranking family: the same
interaction layer as dlrm_interaction.py, in the style of mixed-precision model code)."""
import torch
import torch.nn as nn

BATCH = 16384
NUM_SPARSE = 26
DIM = 128
SMALL = {"BATCH": 32, "NUM_SPARSE": 5, "DIM": 16}


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        pairs = [i * num_features + j for i in range(num_features) for j in range(i)]
        self.register_buffer("pairs", torch.tensor(pairs), persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        features = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        dots = torch.einsum("bid,bjd->bij", features, features)
        return torch.cat([dense, dots.flatten(1).index_select(1, self.pairs)], dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM).to(torch.bfloat16), torch.randn(BATCH, NUM_SPARSE, DIM).to(torch.bfloat16)]


def get_init_inputs():
    return [NUM_SPARSE + 1]
