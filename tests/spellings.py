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
    # other kinds that claim the same computation whole in one fused kernel (a DCN cross layer whose half-precision
    # addcmul decomposes through float32 casts is a GEMM with that epilogue to the matmul family)
    also: tuple[str, ...] = ()


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


# --- row reductions (the ``row_reduction`` family): softmax, log-softmax, logsumexp, LayerNorm, RMSNorm, sums -------
ROW_MAX = ("x.amax({d}, keepdim=True)", "x.max({d}, keepdim=True).values", "torch.max(x, {d}, keepdim=True)[0]",
           "x.max({d}).values.unsqueeze({d})", "torch.amax(x, dim={d}, keepdim=True)")
ROW_SHIFT = ("x - m", "x.sub(m)", "torch.sub(x, m)", "-(m - x)")
ROW_EXP = ("torch.exp(z)", "z.exp()")
ROW_SUM = ("e.sum({d}, keepdim=True)", "torch.sum(e, dim={d}, keepdim=True)", "e.sum({d}).unsqueeze({d})",
           "e.sum(dim={d}, keepdim=True)")
ROW_NORMALIZE = ("e / s", "e * (1.0 / s)", "e * s.reciprocal()", "torch.div(e, s)")
ROW_LOG = ("z - torch.log(s)", "z - s.log()", "torch.sub(z, s.log())")
SOFTMAX_CALLS = ("F.softmax(x, dim={d})", "x.softmax({d})", "torch.softmax(x, dim={d})", "torch.exp(F.log_softmax(x, {d}))")
LOG_SOFTMAX_CALLS = ("F.log_softmax(x, dim={d})", "x.log_softmax({d})", "x - torch.logsumexp(x, {d}, keepdim=True)")
MEAN = ("x.mean({d}, keepdim=True)", "x.sum({d}, keepdim=True) / x.shape[{d}]", "torch.mean(x, {d}, True)")
VAR = ("((x - mu) ** 2).mean({d}, keepdim=True)", "x.var({d}, unbiased=False, keepdim=True)",
       "(xc * xc).mean({d}, keepdim=True)", "xc.pow(2).mean({d}, keepdim=True)",
       "torch.var(x, {d}, correction=0, keepdim=True)")
NORMALIZE = ("xc / torch.sqrt(var + {eps})", "xc * torch.rsqrt(var + {eps})", "(x - mu) / (var + {eps}).sqrt()")
RMS = ("x * torch.rsqrt(x.pow(2).mean({d}, keepdim=True) + {eps})", "x / torch.sqrt((x * x).mean({d}, keepdim=True) + {eps})",
       "x * (x.square().mean({d}, keepdim=True) + {eps}).rsqrt()")
ROW_SUMS = ("x.sum({d})", "torch.sum(x, dim={d})", "x.mean({d})", "torch.logsumexp(x, {d})", "x.amax({d})",
            "x.sum({d}, keepdim=True) * 2.0")


def row(rng: random.Random, i: int) -> Spelling:
    """One spelling of a row reduction over the last dim (or dim 1 of a 2-D input), drawn from ``rng``."""
    what = rng.choice(("softmax", "log_softmax", "layernorm", "rmsnorm", "reduce"))
    rank = rng.choice((2, 2, 3))
    d = rng.choice(("-1", "1" if rank == 2 else "2"))
    eps = rng.choice(("1e-5", "1e-6"))
    choices: list[str] = [what, f"rank{rank}", f"dim{d}"]

    def pick(name: str, table: tuple[str, ...]) -> str:
        k = rng.randrange(len(table))
        choices.append(f"{name}{k}")
        return table[k].format(d=d, eps=eps)

    body: list[str] = []
    up = rng.random() < 0.3  # computed in float32 from a half input, the result cast back
    if up:
        choices.append("up")
        body.append("dt = x.dtype")
        body.append("x = x.float()")
    if what in ("softmax", "log_softmax"):
        calls = SOFTMAX_CALLS if what == "softmax" else LOG_SOFTMAX_CALLS
        if rng.random() < 0.4:
            body.append(f"y = {pick('call', calls)}")
        else:
            body += [f"m = {pick('max', ROW_MAX)}", f"z = {pick('shift', ROW_SHIFT)}", f"e = {pick('exp', ROW_EXP)}",
                     f"s = {pick('sum', ROW_SUM)}"]
            body.append(f"y = {pick('normalize', ROW_NORMALIZE)}" if what == "softmax" else f"y = {pick('log', ROW_LOG)}")
    elif what == "layernorm":
        body += [f"mu = {pick('mean', MEAN)}", "xc = x - mu", f"var = {pick('var', VAR)}",
                 f"y = {pick('norm', NORMALIZE)}"]
        if rng.random() < 0.5:
            choices.append("affine")
            body.append("y = y * self.w + self.b")
    elif what == "rmsnorm":
        body.append(f"y = {pick('rms', RMS)}")
        if rng.random() < 0.5:
            choices.append("affine")
            body.append("y = y * self.w")
    else:
        body.append(f"y = {pick('reduce', ROW_SUMS)}")
    body.append("return y.to(dt)" if up else "return y")
    rows, cols = rng.choice((1, 3, 17, 33)), rng.choice((7, 40, 100, 257, 1000, 20001))  # the last: rows split
    dtype = rng.choice(("float32", "float32", "bfloat16", "float16"))
    if up and dtype == "float32":
        dtype = "bfloat16"
    shape = f"{rows}, {cols}" if rank == 2 else f"2, {rows}, {cols}"
    init = ""
    if "affine" in choices:
        init = ("    def __init__(self):\n        super().__init__()\n"
                f"        self.w = nn.Parameter(torch.randn({cols}))\n"
                f"        self.b = nn.Parameter(torch.randn({cols}))\n")
        if not up:
            init += f"        self.to(torch.{dtype})\n"
        init += "\n"
    forward = "    def forward(self, x):\n" + "".join(f"        {line}\n" for line in body)
    text = (HEAD + "\n\nclass Model(nn.Module):\n" + init + forward + "\n\n"
            f"def get_inputs():\n    return [torch.randn({shape}).to(torch.{dtype})]\n\n\n"
            "def get_init_inputs():\n    return []\n")
    return Spelling(f"{i:03d}-" + "-".join(choices + [dtype]), "row_reduction", text)


# --- GEMMs with an epilogue (the ``matmul`` family): a Linear however written, then bias, activation, scale ----------
LINEAR = ("F.linear(x, self.w, self.b)", "x @ self.w.t() + self.b", "torch.addmm(self.b, x, self.w.t())",
          "torch.matmul(x, self.w.transpose(0, 1)) + self.b", "self.b + x.mm(self.w.T)", "self.fc(x)")
LINEAR_3D = ("F.linear(x, self.w, self.b)", "x @ self.w.t() + self.b", "torch.matmul(x, self.w.transpose(0, 1)) + self.b",
             "self.fc(x)", "(x.reshape(-1, x.shape[-1]) @ self.w.t() + self.b).view(*x.shape[:-1], -1)")
ACTIVATIONS = ("torch.relu(h)", "F.relu(h)", "h.clamp(min=0)", "torch.clamp_min(h, 0.0)", "torch.where(h > 0, h, 0.0)",
               "F.gelu(h)", "h * 0.5 * (1.0 + torch.erf(h / 1.4142135623730951))", "F.gelu(h, approximate='tanh')",
               "F.silu(h)", "h * torch.sigmoid(h)", "torch.sigmoid(h)", "torch.tanh(h)", "F.leaky_relu(h, 0.1)", "h")
AFTER = ("y", "y * 0.5", "y + 1.0", "y * self.scale", "y.to(x.dtype)")


def gemm(rng: random.Random, i: int) -> Spelling:
    """One spelling of a Linear with a pointwise epilogue, drawn from ``rng``."""
    rank = rng.choice((2, 2, 3))
    table = LINEAR if rank == 2 else LINEAR_3D
    k_lin, k_act, k_after = rng.randrange(len(table)), rng.randrange(len(ACTIVATIONS)), rng.randrange(len(AFTER))
    choices = [f"rank{rank}", f"linear{k_lin}", f"act{k_act}", f"after{k_after}"]
    m, k, n = rng.choice((16, 33, 64, 100)), rng.choice((32, 48, 64, 96)), rng.choice((16, 40, 64, 80))
    dtype = rng.choice(("float32", "float32", "bfloat16", "float16"))
    use_fc = table[k_lin] == "self.fc(x)"
    init = ("    def __init__(self):\n        super().__init__()\n"
            + (f"        self.fc = nn.Linear({k}, {n})\n" if use_fc else
               f"        self.w = nn.Parameter(torch.randn({n}, {k}) / {k} ** 0.5)\n"
               f"        self.b = nn.Parameter(torch.randn({n}))\n")
            + f"        self.scale = nn.Parameter(torch.rand({n}))\n        self.to(torch.{dtype})\n\n")
    body = [f"h = {table[k_lin]}", f"y = {ACTIVATIONS[k_act]}", f"return {AFTER[k_after]}"]
    forward = "    def forward(self, x):\n" + "".join(f"        {line}\n" for line in body)
    shape = f"{m}, {k}" if rank == 2 else f"2, {m}, {k}"
    text = (HEAD + "\n\nclass Model(nn.Module):\n" + init + forward + "\n\n"
            f"def get_inputs():\n    return [torch.randn({shape}).to(torch.{dtype})]\n\n\n"
            "def get_init_inputs():\n    return []\n")
    return Spelling(f"{i:03d}-" + "-".join(choices + [dtype]), "matmul", text)


# --- attention (the ``attention`` family): scores, scale, mask, softmax, weighted sum ---------------------------------
SCORES = ("q @ k.transpose(-2, -1)", "torch.matmul(q, k.transpose(-1, -2))", "torch.einsum('bhqd,bhkd->bhqk', q, k)",
          "q.matmul(k.permute(0, 1, 3, 2))")
SCALE = ("s * {scale}", "s / {inv}", "torch.mul(s, {scale})", "s.div({inv})")
MASKS = ("s", "s.masked_fill(~torch.tril(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device)), "
         "float('-inf'))",
         "s.masked_fill(torch.triu(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device), 1), "
         "float('-inf'))",
         "s + torch.triu(torch.full((s.shape[-2], s.shape[-1]), float('-inf'), device=s.device, dtype=s.dtype), 1)")
PROBS = ("torch.softmax(s, dim=-1)", "F.softmax(s, -1)", "s.softmax(-1)",
         "torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)")
WEIGHTED = ("p @ v", "torch.matmul(p, v)", "torch.einsum('bhqk,bhkd->bhqd', p, v)")


def attention(rng: random.Random, i: int) -> Spelling:
    """One spelling of scaled dot-product attention (causal or not), drawn from ``rng``."""
    d = rng.choice((16, 32, 64))
    causal = rng.random() < 0.5
    choices = ["causal" if causal else "full", f"d{d}"]

    def pick(name: str, table: tuple[str, ...]) -> str:
        k = rng.randrange(len(table))
        choices.append(f"{name}{k}")
        return table[k].format(scale=f"{d ** -0.5!r}", inv=f"{d ** 0.5!r}")

    if rng.random() < 0.25:
        body = [f"return F.scaled_dot_product_attention(q, k, v, is_causal={causal})"]
        choices.append("sdpa")
    else:
        body = [f"s = {pick('scores', SCORES)}", f"s = {pick('scale', SCALE)}"]
        if causal:
            k = 1 + rng.randrange(len(MASKS) - 1)
            choices.append(f"mask{k}")
            body.append(f"s = {MASKS[k]}")
        body += [f"p = {pick('probs', PROBS)}", f"return {pick('weighted', WEIGHTED)}"]
    b, h, n = rng.choice((1, 2)), rng.choice((1, 3)), rng.choice((16, 33, 64, 100))
    dtype = rng.choice(("float32", "float32", "bfloat16", "float16"))
    forward = "    def forward(self, q, k, v):\n" + "".join(f"        {line}\n" for line in body)
    x = f"torch.randn({b}, {h}, {n}, {d}).to(torch.{dtype})"
    text = (HEAD + "\n\nclass Model(nn.Module):\n" + forward + "\n\n"
            f"def get_inputs():\n    return [{x}, {x}, {x}]\n\n\ndef get_init_inputs():\n    return []\n")
    return Spelling(f"{i:03d}-" + "-".join(choices + [dtype]), "attention", text)


# --- SwiGLU (``dual_gemm``), DCN cross (``dcn_cross``), FM and DLRM interactions (``pairwise_interaction``) ---------
GATE = ("F.silu(a) * b", "a * torch.sigmoid(a) * b", "b * F.silu(a)", "torch.mul(F.silu(a), b)",
        "a / (1 + torch.exp(-a)) * b")
HALVES = ("a, b = self.w1(x), self.w3(x)", "a, b = F.linear(x, self.w1.weight), F.linear(x, self.w3.weight)",
          "a, b = x @ self.w1.weight.t(), x @ self.w3.weight.t()", "a, b = self.w13(x).chunk(2, dim=-1)",
          "h = self.w13(x)\n        a, b = h[..., :{n}], h[..., {n}:]")
CROSS = ("x0 * self.fc(x0) + x0", "x0 * (x0 @ self.fc.weight.t() + self.fc.bias) + x0",
         "torch.addcmul(x0, x0, self.fc(x0))", "x0 + x0 * F.linear(x0, self.fc.weight, self.fc.bias)",
         "self.fc(x0).mul(x0).add(x0)")
FM = ("0.5 * (v.sum(1) ** 2 - (v * v).sum(1)).sum(1, keepdim=True)",
      "0.5 * (torch.sum(v, dim=1).pow(2) - torch.sum(v.pow(2), dim=1)).sum(dim=1, keepdim=True)",
      "((v.sum(1) * v.sum(1) - v.square().sum(1)) / 2).sum(-1, keepdim=True)")
DLRM = ("i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)\n        return torch.cat([dense, z[:, i, j]], dim=1)",
        "i, j = torch.triu_indices(t.shape[1], t.shape[1], offset=1)\n        return torch.cat([dense, z[:, j, i]], dim=1)",
        "i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)\n"
        "        return torch.cat([dense, z.flatten(1)[:, i * t.shape[1] + j]], dim=1)")
PRODUCT = ("torch.bmm(t, t.transpose(1, 2))", "t @ t.transpose(-1, -2)", "torch.einsum('bnd,bmd->bnm', t, t)",
           "torch.matmul(t, t.permute(0, 2, 1))")


def _module_text(init: list[str], body: list[str], inputs: str, args: str) -> str:
    init_text = ("    def __init__(self):\n        super().__init__()\n" + "".join(f"        {x}\n" for x in init) + "\n"
                 if init else "")
    forward = f"    def forward(self, {args}):\n" + "".join(f"        {line}\n" for line in body)
    return (HEAD + "\n\nclass Model(nn.Module):\n" + init_text + forward + "\n\n"
            f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n")


def swiglu(rng: random.Random, i: int) -> Spelling:
    k_half, k_gate = rng.randrange(len(HALVES)), rng.randrange(len(GATE))
    m, c, n = rng.choice((16, 33, 64)), rng.choice((32, 64, 96)), rng.choice((16, 48, 64))
    dtype = rng.choice(("float32", "float32", "bfloat16", "float16"))
    fused = "w13" in HALVES[k_half]
    init = ([f"self.w13 = nn.Linear({c}, 2 * {n}, bias=False)"] if fused else
            [f"self.w1 = nn.Linear({c}, {n}, bias=False)", f"self.w3 = nn.Linear({c}, {n}, bias=False)"])
    init.append(f"self.to(torch.{dtype})")
    body = [HALVES[k_half].format(n=n), f"return {GATE[k_gate]}"]
    text = _module_text(init, body, f"torch.randn({m}, {c}).to(torch.{dtype})", "x")
    return Spelling(f"{i:03d}-halves{k_half}-gate{k_gate}-{dtype}", "dual_gemm", text)


def dcn(rng: random.Random, i: int) -> Spelling:
    k = rng.randrange(len(CROSS))
    m, c = rng.choice((16, 33, 64, 100)), rng.choice((32, 64, 96))
    dtype = rng.choice(("float32", "float32", "bfloat16"))
    text = _module_text([f"self.fc = nn.Linear({c}, {c})", f"self.to(torch.{dtype})"], [f"return {CROSS[k]}"],
                        f"torch.randn({m}, {c}).to(torch.{dtype})", "x0")
    return Spelling(f"{i:03d}-cross{k}-{dtype}", "dcn_cross", text, also=("matmul",))


def interaction(rng: random.Random, i: int) -> Spelling:
    b, f, d = rng.choice((4, 17, 33)), rng.choice((3, 5, 8)), rng.choice((8, 16, 32))
    dtype = rng.choice(("float32", "float32", "bfloat16"))
    if rng.random() < 0.4:
        k = rng.randrange(len(FM))
        text = _module_text([], [f"return {FM[k]}"], f"torch.randn({b}, {f}, {d}).to(torch.{dtype})", "v")
        return Spelling(f"{i:03d}-fm{k}-{dtype}", "pairwise_interaction", text)
    k_p, k_pick = rng.randrange(len(PRODUCT)), rng.randrange(len(DLRM))
    cat = rng.choice(("torch.cat([dense.unsqueeze(1), sparse], dim=1)", "torch.cat((dense[:, None, :], sparse), 1)"))
    body = [f"t = {cat}", f"z = {PRODUCT[k_p]}", DLRM[k_pick]]
    inputs = f"torch.randn({b}, {d}).to(torch.{dtype}), torch.randn({b}, {f}, {d}).to(torch.{dtype})"
    return Spelling(f"{i:03d}-dlrm-product{k_p}-pick{k_pick}-{dtype}", "pairwise_interaction",
                    _module_text([], body, inputs, "dense, sparse"))


# --- scans (the ``scan`` family): cumulative sums and products, reversed, masked, along any dimension ----------------
SCAN_CALLS = ("torch.{op}({x}, dim={d})", "{x}.{op}({d})", "torch.{op}({x}, {d})", "{x}.{op}(dim={d})",
              "torch.Tensor.{op}({x}, {d})")
# a scan reversed along its dimension: {scan} is one of SCAN_CALLS with {x} in place
REVERSED = ("{scan}", "torch.flip({inner}, [{d}])", "{inner}.flip({d})", "{inner}.flip(dims=({d},))")
FLIP_IN = ("torch.flip(x, [{d}])", "x.flip({d})", "x.flip(dims=({d},))")
PROLOGUES = ("x", "x * mask", "torch.where(mask, x, 0.0)", "x.masked_fill(~mask, 0)", "x * mask.to(x.dtype)",
             "torch.relu(x)", "x * self.scale", "(x - 0.5) * 2.0")


def scan(rng: random.Random, i: int) -> Spelling:
    """A cumulative sum or product along any dimension of a rank-2 or rank-3 tensor, of an input or of pointwise ops
    of it, forward or reversed by flips on both sides."""
    op = rng.choice(("cumsum", "cumsum", "cumprod"))
    rank = rng.choice((2, 3))
    sizes = [rng.choice((1, 3, 7, 33, 100, 257, 700)) for _ in range(rank)]
    while sizes[0] * sizes[-1] * (sizes[1] if rank == 3 else 1) > 40000:  # small enough for the interpreter
        sizes[sizes.index(max(sizes))] = rng.choice((1, 3, 7, 33))
    d = rng.randrange(rank)
    dim = rng.choice((d, d - rank))
    k_call, k_rev, k_pro = rng.randrange(len(SCAN_CALLS)), rng.randrange(len(REVERSED)), rng.randrange(len(PROLOGUES))
    dtype = "float32" if op == "cumprod" else rng.choice(DTYPES)
    body = [f"x = {PROLOGUES[k_pro]}"]
    if k_rev:  # flipped in, scanned, flipped back
        inner = SCAN_CALLS[k_call].format(op=op, x=FLIP_IN[k_rev - 1].format(d=dim), d=dim)
        body.append("return " + REVERSED[k_rev].format(inner=inner, d=dim))
    else:
        body.append("return " + SCAN_CALLS[k_call].format(op=op, x="x", d=dim))
    # a product of values near one stays in range over rows of hundreds
    make = (f"(torch.rand({tuple(sizes)}) * 0.2 + 0.9)" if op == "cumprod" else f"torch.randn({tuple(sizes)})")
    inputs = f"{make}.to(torch.{dtype}), torch.rand({tuple(sizes)}) > 0.5"
    init = [f"self.scale = nn.Parameter(torch.randn({sizes[-1]}).to(torch.{dtype}))"] if "scale" in body[0] else []
    text = _module_text(init, body, inputs, "x, mask")
    return Spelling(f"{i:03d}-{op}-call{k_call}-rev{k_rev}-pro{k_pro}-rank{rank}-{dtype}", "scan", text)


# --- pools (the ``pool`` family): average and max pooling over 1, 2 and 3 dims, called or as modules -------------------
POOL_PROLOGUES = ("x", "torch.relu(x)", "x * 2.0", "F.gelu(x)", "torch.sigmoid(x) * x")


def _pool_args(rng: random.Random, kind: str, nd: int) -> tuple[str, str]:
    """The window's arguments, each omitted, one int or a tuple; and a tag naming the choices."""
    kernel = [rng.choice((2, 3) if nd == 3 else (2, 3, 5)) for _ in range(nd)]
    one = rng.random() < 0.5 or nd == 1  # one int for every dim
    if one:
        kernel = [kernel[0]] * nd
    form = (lambda v: str(v[0])) if one else (lambda v: "(" + ", ".join(map(str, v)) + ")")  # noqa: E731
    args, tag = [f"kernel_size={form(kernel)}"], []
    if rng.random() < 0.6:
        args.append(f"stride={form([rng.choice((1, 2)) for _ in range(nd)] if not one else [rng.choice((1, 2))] * nd)}")
        tag.append("stride")
    if rng.random() < 0.5:
        args.append(f"padding={form([k // 2 for k in kernel])}")
        tag.append("pad")
    if kind == "max" and rng.random() < 0.3:
        args.append("dilation=2")
        tag.append("dil")
    if rng.random() < 0.3:
        args.append("ceil_mode=True")
        tag.append("ceil")
    if kind == "avg" and rng.random() < 0.3:
        args.append("count_include_pad=False")
        tag.append("nopad")
    if kind == "avg" and nd > 1 and rng.random() < 0.2:
        args.append("divisor_override=3")
        tag.append("div")
    return ", ".join(args), "-".join(tag) or "plain"


def pool(rng: random.Random, i: int) -> Spelling:
    """An average or max pool over 1, 2 or 3 dims, as a functional call, a module or a torch call, of the input or of
    an activation or scale of it."""
    kind, nd = rng.choice(("avg", "max")), rng.choice((1, 2, 2, 3))
    args, tag = _pool_args(rng, kind, nd)
    k_call = rng.randrange(3)
    k_pro = rng.randrange(len(POOL_PROLOGUES))
    cls = {"avg": "AvgPool", "max": "MaxPool"}[kind]
    init = []
    if k_call == 0:
        call = f"F.{kind}_pool{nd}d(x, {args})"
    elif k_call == 1:
        init, call = [f"self.pool = nn.{cls}{nd}d({args})"], "self.pool(x)"
    else:  # the indices asked for and dropped (max), or torch's own namespace (avg: torch.nn.functional)
        call = (f"F.max_pool{nd}d(x, {args}, return_indices=True)[0]" if kind == "max"
                else f"torch.nn.functional.avg_pool{nd}d(x, {args})")
    spatial = [rng.choice((9, 13, 20) if nd == 3 else (9, 17, 33, 64)) for _ in range(nd)]
    dtype = "float32" if (kind, nd) == ("avg", 3) else rng.choice(DTYPES)  # the CPU's avg_pool3d takes no 16-bit
    shape = tuple([rng.choice((1, 2)), rng.choice((3, 4))] + spatial)
    text = _module_text(init, [f"x = {POOL_PROLOGUES[k_pro]}", f"return {call}"],
                        f"torch.randn({shape}).to(torch.{dtype})", "x")
    return Spelling(f"{i:03d}-{kind}{nd}d-call{k_call}-pro{k_pro}-{tag}-{dtype}", "pool", text)


FAMILIES = {"segment": segment, "row": row, "gemm": gemm, "attention": attention, "swiglu": swiglu, "dcn": dcn,
            "interaction": interaction, "scan": scan, "pool": pool}


def spellings(count: int, seed: int, family: str = "segment") -> list[Spelling]:
    rng = random.Random(seed)
    make = FAMILIES[family]
    return [make(rng, i) for i in range(count)]
