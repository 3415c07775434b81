"""DCN-v2 (Deep & Cross Network v2, ads ranking), inference, fp32.

26 sparse features, each an nn.Embedding lookup (100k rows x 32 dims per table, 333 MB in all), concatenated with 13
dense features into x0 [4096, 845]; three full-rank cross layers x_{l+1} = x0 * (W x_l + b) + x_l (W [845, 845]) in
parallel with a deep MLP (845 -> 1024 -> 1024 -> 512); both outputs concatenated, a final linear to 1 and a sigmoid.
Batch 4096.
"""
import torch
import torch.nn as nn

BATCH = 4096
NUM_DENSE = 13
NUM_SPARSE = 26
VOCAB = 100_000
EMB_DIM = 32
NUM_CROSS = 3
DEEP_1 = 1024
DEEP_2 = 1024
DEEP_3 = 512
SMALL = {"BATCH": 32, "NUM_SPARSE": 4, "VOCAB": 100, "EMB_DIM": 8, "DEEP_1": 32, "DEEP_2": 32,
         "DEEP_3": 16}


class Model(nn.Module):
    def __init__(self, num_dense, num_sparse, vocab, emb_dim, num_cross, deep):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(vocab, emb_dim) for _ in range(num_sparse))
        width = num_dense + num_sparse * emb_dim
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(num_cross))
        layers, prev = [], width
        for h in deep:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        self.deep = nn.Sequential(*layers)
        self.head = nn.Linear(width + prev, 1)

    def forward(self, dense, sparse):
        # sparse: [B, num_sparse] int64, column f indexes table f
        embs = [emb(sparse[:, f]) for f, emb in enumerate(self.embeddings)]
        x0 = torch.cat([dense, *embs], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return torch.sigmoid(self.head(torch.cat([x, self.deep(x0)], dim=1)))


def get_inputs():
    return [torch.randn(BATCH, NUM_DENSE), torch.randint(0, VOCAB, (BATCH, NUM_SPARSE))]


def get_init_inputs():
    return [NUM_DENSE, NUM_SPARSE, VOCAB, EMB_DIM, NUM_CROSS, [DEEP_1, DEEP_2, DEEP_3]]
