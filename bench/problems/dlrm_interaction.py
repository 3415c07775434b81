"""DLRM pairwise dot interaction: bmm of the stacked features, strict lower triangle gathered with tril_indices,
concatenated with the dense features, fp32 (ads ranking family: DLRM / DLRMv2 interaction layer)."""
import torch
import torch.nn as nn

BATCH = 16384
NUM_SPARSE = 26
DIM = 128
SMALL = {"BATCH": 32, "NUM_SPARSE": 5, "DIM": 16}


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        rows, cols = torch.tril_indices(num_features, num_features, offset=-1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        features = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        dots = torch.bmm(features, features.transpose(1, 2))
        return torch.cat([dense, dots[:, self.rows, self.cols]], dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, NUM_SPARSE, DIM)]


def get_init_inputs():
    return [NUM_SPARSE + 1]
