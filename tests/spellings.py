"""A generator of equivalent spellings: one computation written many ways, each step drawn at random from the ways
users write it, at random (odd) sizes and dtypes. A family must claim every spelling of its
computation; a spelling it misses names a dataflow fact its matching lacks.

Segment pooling (the ``segment`` family): rows of a jagged batch (a values tensor, or rows gathered from a table)
summed or averaged per bag, the bags given as offsets or lengths, each derived from the other in any of the usual
ways, the segment id of every row computed from either, the pooling done by any accumulating scatter, the mean's
counts taken from the lengths or from a bincount of the ids.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
DTYPES = ("float32", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Spelling:
    name: str  # the choices made, joined: enough to rebuild it by hand
    kind: str  # the region kind the family must claim
    source: str  # a KernelBench-format problem file


# lengths [B] from offsets [B + 1] (the last end included)
LENGTHS_FROM_OFFSETS = (
    "offsets[1:] - offsets[:-1]",
    "torch.diff(offsets)",
    "offsets[1:].sub(offsets[:-1])",
    "(offsets - F.pad(offsets, (1, 0))[:-1])[1:]",
)
# offsets [B + 1] from lengths [B]
OFFSETS_FROM_LENGTHS = (
    "torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])",
    "F.pad(torch.cumsum(lengths, dim=0), (1, 0))",
    "torch.cat([torch.zeros(1, dtype=lengths.dtype, device=lengths.device), torch.cumsum(lengths, 0)])",
)
# segment ids [N] of the N rows, from lengths, offsets or ends (offsets[1:]); n is the number of rows
IDS_FROM_LENGTHS = (
    "torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)",
    "torch.arange(lengths.shape[0], device=lengths.device).repeat_interleave(lengths)",
    "torch.repeat_interleave(lengths)",
    "torch.searchsorted(torch.cumsum(lengths, 0), torch.arange(n, device=lengths.device), right=True)",
)
IDS_FROM_OFFSETS = (
    "torch.searchsorted(offsets, torch.arange(n, device=offsets.device), right=True) - 1",
    "torch.bucketize(torch.arange(n, device=offsets.device), offsets, right=True) - 1",
    "torch.searchsorted(offsets[1:], torch.arange(n, device=offsets.device), right=True)",
    "torch.bucketize(torch.arange(n, device=offsets.device), offsets[1:], right=True)",
)
# the pooled sum [B, D] of rows [N, D] by ids [N]
POOLS = (
    "torch.zeros(nb, rows.shape[1], dtype=rows.dtype, device=rows.device).index_add_(0, ids, rows)",
    "rows.new_zeros(nb, rows.shape[1]).index_add(0, ids, rows)",
    "torch.zeros(nb, rows.shape[1], dtype=rows.dtype, device=rows.device).scatter_add_(0, "
    "ids.unsqueeze(1).expand(-1, rows.shape[1]), rows)",
    "torch.zeros(nb, rows.shape[1], dtype=rows.dtype, device=rows.device).index_put_((ids,), rows, accumulate=True)",
    "rows.new_zeros(nb, rows.shape[1]).scatter_reduce(0, ids[:, None].expand_as(rows), rows, 'sum')",
)
# per-bag counts [B] for the mean, clamped to at least 1
COUNTS = (
    "lengths.clamp(min=1)",
    "lengths.clamp_min(1)",
    "torch.bincount(ids, minlength=nb).clamp(min=1)",
)
DIVIDE = (
    "pooled / counts.unsqueeze(1).to(pooled.dtype)",
    "pooled / counts[:, None].float()",
    "pooled / counts.view(-1, 1).to(pooled.dtype)",
    "pooled * (1.0 / counts.to(pooled.dtype)).unsqueeze(-1)",
)
ROWS = (
    ("values", "rows = v"),
    ("embedding", "rows = F.embedding(idx, self.table)"),
    ("index_select", "rows = self.table.index_select(0, idx)"),
    ("indexing", "rows = self.table[idx]"),
)


def segment(rng: random.Random, i: int) -> Spelling:
    """One spelling of a jagged sum or mean, drawn from ``rng``."""
    given = rng.choice(("offsets", "lengths"))
    reduce = rng.choice(("sum", "mean"))
    source, fetch = rng.choice(ROWS)
    steps: list[str] = []
    choices = [given, reduce, source]

    def derive(what: str) -> None:
        """Write the line that makes ``what`` (lengths or offsets) from the other, once."""
        if any(s.startswith(f"{what} = ") for s in steps) or what == given:
            return
        table = LENGTHS_FROM_OFFSETS if what == "lengths" else OFFSETS_FROM_LENGTHS
        k = rng.randrange(len(table))
        choices.append(f"{what}{k}")
        steps.append(f"{what} = {table[k]}")

    ids_from = rng.choice(("lengths", "offsets"))
    derive(ids_from)
    table = IDS_FROM_LENGTHS if ids_from == "lengths" else IDS_FROM_OFFSETS
    k = rng.randrange(len(table))
    choices.append(f"ids-{ids_from}{k}")
    rows_line = fetch
    n_line = "n = rows.shape[0]" if "arange(n," in table[k] else ""
    nb_line = "nb = lengths.numel()" if given == "lengths" or ids_from == "lengths" else "nb = offsets.numel() - 1"
    if nb_line.startswith("nb = lengths") and given != "lengths":
        derive("lengths")
    body = [rows_line, *steps]
    if n_line:
        body.append(n_line)
    body.append(f"ids = {table[k]}")
    body.append(nb_line)
    p = rng.randrange(len(POOLS))
    choices.append(f"pool{p}")
    body.append(f"pooled = {POOLS[p]}")
    if reduce == "sum":
        body.append("return pooled")
    else:
        c = rng.randrange(len(COUNTS))
        if COUNTS[c].startswith("lengths"):
            if not any(s.startswith("lengths = ") for s in body) and given != "lengths":
                k2 = rng.randrange(len(LENGTHS_FROM_OFFSETS))
                choices.append(f"lengths{k2}")
                body.insert(-1, f"lengths = {LENGTHS_FROM_OFFSETS[k2]}")
        d = rng.randrange(len(DIVIDE))
        choices += [f"counts{c}", f"divide{d}"]
        body += [f"counts = {COUNTS[c]}", f"return {DIVIDE[d]}"]
    text, dtype = _problem(given, source, body, rng)
    return Spelling(f"{i:03d}-" + "-".join(choices + [dtype]), "segment_reduction", text)


def _problem(given: str, source: str, body: list[str], rng: random.Random) -> tuple[str, str]:
    bags, dim = rng.choice((1, 2, 5, 9, 17)), rng.choice((7, 16, 40, 100, 257))
    rows = source != "values"
    first = "idx" if rows else "v"
    init = ("    def __init__(self):\n        super().__init__()\n"
            f"        self.table = nn.Parameter(torch.randn(97, {dim}))\n") if rows else ""
    forward = f"    def forward(self, {first}, {given}):\n" + "".join(f"        {line}\n" for line in body)
    dtype = rng.choice(DTYPES)
    if rows:
        init += f"        self.to(torch.{dtype})\n\n"
    make_rows = ("torch.randint(0, 97, (int(lengths.sum()),))" if rows
                 else f"torch.randn(int(lengths.sum()), {dim}).to(torch.{dtype})")
    bag_input = ("torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])" if given == "offsets"
                 else "lengths")
    return ((HEAD + "\n\nclass Model(nn.Module):\n" + init + forward + "\n\n"
            f"def get_inputs():\n    lengths = torch.randint(0, 6, ({bags},))\n"
            f"    return [{make_rows}, {bag_input}]\n\n\ndef get_init_inputs():\n    return []\n"), dtype)


def spellings(count: int, seed: int) -> list[Spelling]:
    rng = random.Random(seed)
    return [segment(rng, i) for i in range(count)]
