"""User-history sequence model with target attention (DIN-like, ads ranking), inference, fp32.

An item table of 1M rows x 64 dims (256 MB). Each user's history is jagged: item ids as values + offsets [B+1], lengths
random in 0..200 (about 100 a user, 205k ids a batch). The history's embeddings are mean-pooled per user with a
segment sum (torch.segment_reduce) divided by the lengths; the same history, scattered into a padded [B, 200, 64]
tensor with a validity mask, is attended by the target item: an MLP (256 -> 80 -> 40 -> 1) scores [q, k, q-k, q*k] at
every position, a masked softmax weighs the history. The tower (target, pooled, attended, 32 user features: 224 ->
512 -> 256 -> 1) ends in a sigmoid. Batch 2048.
"""
import torch
import torch.nn as nn

BATCH = 2048
NUM_ITEMS = 1_000_000
EMB_DIM = 64
MAX_LEN = 200
NUM_USER = 32
ATT_1 = 80
ATT_2 = 40
TOWER_1 = 512
TOWER_2 = 256
SMALL = {"BATCH": 16, "NUM_ITEMS": 200, "EMB_DIM": 8, "MAX_LEN": 12, "NUM_USER": 4, "ATT_1": 16, "ATT_2": 8,
         "TOWER_1": 32, "TOWER_2": 16}


class Model(nn.Module):
    def __init__(self, num_items, emb_dim, max_len, num_user, att, tower):
        super().__init__()
        self.max_len = max_len
        self.items = nn.Embedding(num_items, emb_dim)
        self.att = nn.Sequential(nn.Linear(4 * emb_dim, att[0]), nn.Sigmoid(), nn.Linear(att[0], att[1]),
                                 nn.Sigmoid(), nn.Linear(att[1], 1))
        self.tower = nn.Sequential(nn.Linear(3 * emb_dim + num_user, tower[0]), nn.ReLU(),
                                   nn.Linear(tower[0], tower[1]), nn.ReLU(), nn.Linear(tower[1], 1))
        self.register_buffer("positions", torch.arange(max_len), persistent=False)

    def forward(self, target, hist_values, hist_offsets, user):
        batch = target.shape[0]
        lengths = hist_offsets[1:] - hist_offsets[:-1]  # [B]
        q = self.items(target)  # [B, D]
        h = self.items(hist_values)  # [total, D]

        # jagged mean pooling: segment sums over the lengths, then divide (an empty history pools to zeros)
        sums = torch.segment_reduce(h, "sum", lengths=lengths, axis=0, unsafe=True)
        pooled = sums / lengths.clamp(min=1).unsqueeze(1).to(h.dtype)

        # jagged -> padded [B, L, D]: each value's row and its position within the row (no op is given the jagged
        # total as a size: it differs from draw to draw)
        rows = torch.repeat_interleave(torch.arange(batch, device=target.device), lengths)
        cols = torch.ones_like(rows).cumsum(0) - 1 - hist_offsets[:-1][rows]
        padded = h.new_zeros(batch, self.max_len, h.shape[1]).index_put((rows, cols), h)
        mask = self.positions.unsqueeze(0) < lengths.unsqueeze(1)  # [B, L]

        # target attention: MLP scores over [q, k, q - k, q * k], masked softmax, weighted sum
        qe = q.unsqueeze(1).expand_as(padded)
        scores = self.att(torch.cat([qe, padded, qe - padded, qe * padded], dim=-1)).squeeze(-1)  # [B, L]
        scores = scores.masked_fill(~mask, -1e9)
        weights = torch.softmax(scores, dim=1) * mask.to(scores.dtype)  # an empty history attends to nothing
        attended = torch.bmm(weights.unsqueeze(1), padded).squeeze(1)  # [B, D]

        return torch.sigmoid(self.tower(torch.cat([q, pooled, attended, user], dim=1)))


def get_inputs():
    lengths = torch.randint(0, MAX_LEN + 1, (BATCH,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
    total = int(offsets[-1])
    return [torch.randint(0, NUM_ITEMS, (BATCH,)), torch.randint(0, NUM_ITEMS, (total,)), offsets,
            torch.randn(BATCH, NUM_USER)]


def get_init_inputs():
    return [NUM_ITEMS, EMB_DIM, MAX_LEN, NUM_USER, [ATT_1, ATT_2], [TOWER_1, TOWER_2]]
