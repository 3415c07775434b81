"""DLRM (ads ranking / click-through prediction), inference, fp32.

Ten nn.EmbeddingBag tables (mode="sum", 128 dims): two of 1M rows, four of 500k, four of 100k (4.4M rows, 2.25 GB),
each fed by 1-D indices and bag offsets (bag lengths random in 0..2*POOLING, about 20 ids a bag); a bottom MLP on 13
dense features (13 -> 512 -> 256 -> 128); the pairwise dot interaction of the 11 feature vectors (bmm, strict upper
triangle: 55 dots) concatenated with the bottom MLP's output; a top MLP (183 -> 1024 -> 512 -> 256 -> 1) and a
sigmoid. Batch 4096.
"""
import torch
import torch.nn as nn

BATCH = 4096
DENSE_IN = 13
BOTTOM_1 = 512
BOTTOM_2 = 256
EMB_DIM = 128
ROWS_L = 1_000_000
ROWS_M = 500_000
ROWS_S = 100_000
POOLING = 20
TOP_1 = 1024
TOP_2 = 512
TOP_3 = 256
SMALL = {"BATCH": 32, "BOTTOM_1": 32, "BOTTOM_2": 24, "EMB_DIM": 16, "ROWS_L": 300, "ROWS_M": 200,
         "ROWS_S": 100, "POOLING": 3, "TOP_1": 32, "TOP_2": 24, "TOP_3": 16}


def table_rows():
    return [ROWS_L] * 2 + [ROWS_M] * 4 + [ROWS_S] * 4


def mlp(sizes, last_relu=True):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Model(nn.Module):
    def __init__(self, rows, dense_in, bottom, emb_dim, top):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, emb_dim, mode="sum") for n in rows)
        with torch.no_grad():
            for table in self.tables:  # rows of about unit norm: pooled bags and their dots of order one
                table.weight.normal_(0.0, emb_dim ** -0.5)
        self.bottom = mlp([dense_in, *bottom, emb_dim])
        features = len(rows) + 1
        pairs = features * (features - 1) // 2
        self.top = mlp([emb_dim + pairs, *top, 1], last_relu=False)
        r, c = torch.triu_indices(features, features, offset=1)
        self.register_buffer("pair_rows", r, persistent=False)
        self.register_buffer("pair_cols", c, persistent=False)

    def forward(self, dense, *sparse):
        # sparse: indices_0, offsets_0, indices_1, offsets_1, ...
        x = self.bottom(dense)
        pooled = [table(sparse[2 * t], sparse[2 * t + 1]) for t, table in enumerate(self.tables)]
        feats = torch.stack([x, *pooled], dim=1)  # [B, F, D]
        dots = torch.bmm(feats, feats.transpose(1, 2))  # [B, F, F]
        inter = dots[:, self.pair_rows, self.pair_cols]  # [B, F*(F-1)/2]
        return torch.sigmoid(self.top(torch.cat([x, inter], dim=1)))


def get_inputs():
    inputs = [torch.randn(BATCH, DENSE_IN)]
    for rows in table_rows():
        lengths = torch.randint(0, 2 * POOLING + 1, (BATCH,))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)[:-1]])
        inputs += [torch.randint(0, rows, (int(lengths.sum()),)), offsets]
    return inputs


def get_init_inputs():
    return [table_rows(), DENSE_IN, [BOTTOM_1, BOTTOM_2], EMB_DIM, [TOP_1, TOP_2, TOP_3]]
