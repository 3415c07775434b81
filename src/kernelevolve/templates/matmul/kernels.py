"""The rendered Triton kernel text: the tiled GEMM, the split-K reduction, the stream-K GEMM and its fixup, the
persistent TMA GEMM and the fused two-layer kernel, each with its pointwise epilogue before the one store."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelevolve.templates.matmul.stage import Stage

# fp32 products as three TF32 tensor-core dots on operands split beforehand, in memory, into a TF32 part and the rest
# (hi*hi + hi*lo + lo*hi): tf32x3's accuracy without splitting every tile in registers inside the K loop. Only the
# tile GEMM renders it; anywhere else it falls back to tf32x3, never to plain TF32.
SPLIT_TF32X3 = "split_tf32x3"
# The same three products, summed by the tensor cores only within one K tile: each tile's sum is added to the
# accumulator by an fp32 add that rounds to nearest. Tensor cores sum their products without rounding to nearest
# (Fasi et al., 2021), and over a long reduction that drifts: at K = 65536 (A and B randn, H200) split_tf32x3 was 0.0057
# off the float64 result where the judge allows 0.0012.
SPLIT_TF32X3_FP32SUM = "split_tf32x3_fp32sum"
SPLIT_MODES = (SPLIT_TF32X3, SPLIT_TF32X3_FP32SUM)


def _split_dots(accs: list[str], split: str = SPLIT_TF32X3) -> list[str]:
    """Each accumulator's three TF32 products of split operands (``x``, ``x_lo``), the small ones first; under
    SPLIT_TF32X3_FP32SUM into a fresh sum that is then added to the accumulator (the first product starts from zero,
    so Triton does not fold the add back into the dot)."""

    pairs = lambda j: (("a_lo", f"b{j}"), ("a", f"b{j}_lo"), ("a", f"b{j}"))  # noqa: E731
    if split != SPLIT_TF32X3_FP32SUM:
        return [f'{acc} = tl.dot({x}, {y}, {acc}, input_precision="tf32")' for j, acc in enumerate(accs)
                for x, y in pairs(j)]
    lines = []
    for j, acc in enumerate(accs):
        (x0, y0), *rest = pairs(j)
        lines.append(f'part = tl.dot({x0}, {y0}, input_precision="tf32")')
        lines += [f'part = tl.dot({x}, {y}, part, input_precision="tf32")' for x, y in rest]
        lines.append(f"{acc} += part")
    return lines


def precision_args(dot: str, mode: str | None) -> str:
    if mode in SPLIT_MODES:
        mode = "tf32x3"
    return f', input_precision="{mode}"' if dot == "tl.float32" and mode else ""


def _dot(out: str, x: str, y: str, acc: str | None, dot: str, prec: str) -> list[str]:
    """``out = x @ y (+ acc)``. The interpreter multiplies bf16 bit patterns in tl.dot (triton#11584), so there, and
    only there (UPCAST is a constexpr), bf16 operands are widened first."""
    tail = f", {acc}{prec})" if acc else f"{prec})"
    line = f"{out} = tl.dot({x}, {y}{tail}"
    if dot != "tl.bfloat16":
        return [line]
    return ["if UPCAST:", f"    {out} = tl.dot({x}.to(tl.float32), {y}.to(tl.float32){tail}", "else:", f"    {line}"]


def upcast_flag(name: str, kernel: str) -> str:
    return f'{name}_UPCAST = type({kernel}).__name__ == "InterpretedFunction"'


def _epi_ptrs(st: Stage, stores: bool = True) -> list[str]:
    ptrs = [f"{e.var}_ptr" for e in st.extras]
    return ptrs + ([f"{st.tag}_o{j}_ptr" for j in range(len(st.stores))] if stores else [])


def _epi_strides(st: Stage) -> list[str]:
    return [f"{e.var}_s{d}" for e in st.extras for d in e.dims]


def _load_extra(e: dict[str, str], rn: str, mask_n: str, mask: str) -> str:
    v, dims = e.var, e.dims
    off = [f"{v}_ptr"] + ([f"rb64 * {v}_sb"] if "b" in dims else [])
    if "m" in dims and "n" in dims:
        off, m, tail = off + [f"rm64[:, None] * {v}_sm", f"{rn}[None, :] * {v}_sn"], mask, ""
    elif "m" in dims:
        off, m, tail = off + [f"rm64 * {v}_sm"], "mask_m", "[:, None]"
    elif "n" in dims:
        off, m, tail = off + [f"{rn} * {v}_sn"], mask_n, "[None, :]"
    else:
        m, tail = None, ""
    load = f"tl.load({' + '.join(off)}" + (f", mask={m}, other=0)" if m else ")")
    return f"{v} = {load}{tail}.to({e.type})"


def epilogue_lines(st: Stage, rn: str = "rn", mask_n: str = "mask_n", mask: str = "mask", n: str = "N",
              stores: bool = True) -> list[str]:
    # 64-bit row offsets: an lm-head output (16384 x 128256) passes 2**31 elements
    out = ["rm64 = rm.to(tl.int64)"] + [_load_extra(e, rn, mask_n, mask) for e in st.extras] + list(st.lines)
    if stores and st.stores:
        out.append(f"out_off = rb64 * M * {n} + rm64[:, None] * {n} + {rn}[None, :]")
        for j, s in enumerate(st.stores):
            p = f"{st.tag}_o{j}_ptr"
            out.append(f"tl.store({p} + out_off, {s.var}.to({p}.dtype.element_ty), mask={mask})")
    return out


def indent(lines: list[str], depth: int) -> list[str]:
    return [" " * (4 * depth) + line for line in lines]


def _k_loop(loads: list[tuple[str, str, str, str, str]], dots: list[str], step: str) -> list[str]:
    """The K loop body; a load is (var, pointer, mask when K divides evenly, mask otherwise, cast)."""
    def load(v: str, p: str, m: str, c: str) -> str:
        return f"{v} = tl.load({p}, mask={m}, other=0.0){c}" if m else f"{v} = tl.load({p}){c}"

    full = [load(v, p, m, c) for v, p, m, _, c in loads]
    masked = [load(v, p, m, c) for v, p, _, m, c in loads]
    return ["if EVEN_K:"] + indent(full, 1) + ["else:", f"    k_left = K - k * {step}"] + indent(masked, 1) + dots


def k_steps(st: Stage, prec: str, step: str, split: str = "") -> list[str]:
    """One K step of the tile kernels: load A and each B (masked past K unless EVEN_K), the dots into each
    accumulator, then every pointer ``step`` K tiles on. ``split``: A and each B come as a TF32 part and the rest
    (``*_lo``), and each accumulator takes the three products, the small ones first (``split`` names the mode)."""
    ac = f".to({st.a.cast})" if st.a.cast else ""
    nb = len(st.bs)
    loads = [("a", "a_ptrs", "", "rk[None, :] < k_left", ac)]
    loads += [(f"b{j}", f"b{j}_ptrs", "", "rk[:, None] < k_left", f".to({b.cast})" if b.cast else "")
              for j, b in enumerate(st.bs)]
    steps = [f"a_ptrs += {step} * s_ak"] + [f"b{j}_ptrs += {step} * s_b{j}k" for j in range(nb)]
    if not split:
        dots = [line for j, acc in enumerate(st.accs) for line in _dot(acc, "a", f"b{j}", acc, st.dot, prec)]
        return _k_loop(loads, dots, step) + steps
    loads += [("a_lo", "a_lo_ptrs", "", "rk[None, :] < k_left", "")]
    loads += [(f"b{j}_lo", f"b{j}_lo_ptrs", "", "rk[:, None] < k_left", "") for j in range(nb)]
    dots = _split_dots(st.accs, split)
    steps += [f"a_lo_ptrs += {step} * s_ak"] + [f"b{j}_lo_ptrs += {step} * s_b{j}k" for j in range(nb)]
    return _k_loop(loads, dots, step) + steps


def split_text(name: str) -> str:
    """``name_split(x)``: x (fp32) as its TF32 part and the rest, two tensors of one layout: x's where x is dense, a
    broadcast dim (stride 0) split once and broadcast again, anything else read through a row-major copy."""
    return "\n".join([
        "@triton.jit",
        f"def {name}_split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):",
        "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "    mask = offs < n",
        "    x = tl.load(x_ptr + offs, mask=mask, other=0.0)",
        "    bits = x.to(tl.int32, bitcast=True)",
        "    # the nearest value with TF32's 10 mantissa bits (rounding the magnitude's bits), truncated instead where",
        "    # rounding would pass the largest finite float; then what is left (none where hi is x: infinities too)",
        "    hi = ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)",
        "    hi = tl.where(tl.abs(hi) > 3.4e38, (bits & -0x2000).to(tl.float32, bitcast=True), hi)",
        "    tl.store(hi_ptr + offs, hi, mask=mask)",
        "    tl.store(lo_ptr + offs, tl.where(hi == x, 0.0, x - hi), mask=mask)",
        "",
        "",
        f"def {name}_split(x):",
        "    if any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape)):",
        "        one = x[tuple(slice(0, 1) if s == 0 else slice(None) for s in x.stride())]",
        f"        hi, lo = {name}_split(one)",
        "        return hi.expand(x.shape), lo.expand(x.shape)",
        "    hi = torch.empty_like(x)",
        "    if hi.stride() != x.stride():  # not dense: split a row-major copy into row-major parts",
        "        x = x.contiguous()",
        "        hi = torch.empty_like(x)",
        "    lo = torch.empty_like(hi)",
        "    n = x.numel()",
        f"    {name}_split_kernel[(_cdiv(n, 4096),)](x, hi, lo, n, BLOCK=4096, num_warps=8)",
        "    return hi, lo"])


def gemm_kernel(name: str, st: Stage, split_k: int, prec: str, split: str = "") -> str:
    nb, tag = len(st.bs), st.tag
    ptrs = ["a_ptr"] + [f"b{j}_ptr" for j in range(nb)]
    if split:  # the rest of each operand after its TF32 part, in the same layout
        ptrs += ["a_lo_ptr"] + [f"b{j}_lo_ptr" for j in range(nb)]
    strides = ["s_ab", "s_am", "s_ak"] + [f"s_b{j}{d}" for j in range(nb) for d in "bkn"]
    if split_k == 1:
        ptrs, strides = ptrs + _epi_ptrs(st), strides + _epi_strides(st)
    else:
        ptrs.append("ws_ptr")
    step = "(BLOCK_K * SPLIT_K)"
    accs = st.accs
    k_loop = k_steps(st, prec, step, split)
    body = ["pid = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)", "grid_m = tl.cdiv(M, BLOCK_M)",
            "grid_n = tl.cdiv(N, BLOCK_N)", "width = GROUP_M * grid_n", "first_m = (pid // width) * GROUP_M",
            "size_m = min(grid_m - first_m, GROUP_M)", "pid_m = first_m + (pid % width) % size_m",
            "pid_n = (pid % width) // size_m", "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", "rk = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)"]
    # rows/columns past the edge read wrapped data (never stored), so the K loop needs no M/N masks; the rest after
    # the TF32 part of a split operand lies in the operand's layout
    for lo in ["", "_lo"] if split else [""]:
        body += [f"a{lo}_ptrs = a{lo}_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak"]
        body += [f"b{j}{lo}_ptrs = b{j}{lo}_ptr + rb64 * s_b{j}b + rk[:, None] * s_b{j}k + (rn % N)[None, :] * s_b{j}n"
                 for j in range(nb)]
    body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    body += ["for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):"] + indent(k_loop, 1)
    body += ["mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]"]
    if split_k == 1:
        body += epilogue_lines(st)
    else:
        body += ["plane = tl.num_programs(1).to(tl.int64) * M * N",
                 "ws_off = rb64 * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]"]
        body += [f"tl.store(ws_ptr + ({j} * SPLIT_K + tl.program_id(2)) * plane + ws_off, {acc}, mask=mask)"
                 for j, acc in enumerate(accs)]
    head = [f"def {name}_{tag}_kernel({', '.join(ptrs + ['M', 'N', 'K'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,",
            "        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def tma_kernel(name: str, st: Stage, prec: str, split: str = "") -> str:
    """The persistent GEMM for Hopper: one program per SM walks the (batch, grouped) tiles; A and each B are read
    through device-side tensor descriptors (TMA), zero-padded past their edges, so the K loop has no masks and no
    address arithmetic. An operand whose rows are contiguous the other way (a transposed weight) is described in that
    order and transposed in registers (``*_T``). The launcher sends here only operands whose layout TMA takes.
    ``split``: each operand also has its rest after the TF32 part (``*_lo``, same layout), and three TF32 products."""
    nb, tag = len(st.bs), st.tag
    lo = ["a_lo_ptr"] + [f"b{j}_lo_ptr" for j in range(nb)] if split else []
    ptrs = ["a_ptr"] + [f"b{j}_ptr" for j in range(nb)] + lo + _epi_ptrs(st)
    strides = ["s_ab", "s_am", "s_ak"] + [f"s_b{j}{d}" for j in range(nb) for d in "bkn"] + _epi_strides(st)
    flags = ["A_T"] + [f"B{j}_T" for j in range(nb)]
    ac = f".to({st.a.cast})" if st.a.cast else ""
    body: list[str] = []
    for v in ["a", "a_lo"] if split else ["a"]:
        body += ["if A_T:",
                 f"    {v}_desc = tl.make_tensor_descriptor({v}_ptr, shape=[Bt, K, M], strides=[s_ab, s_ak, 1],",
                 "        block_shape=[1, BLOCK_K, BLOCK_M])",
                 "else:",
                 f"    {v}_desc = tl.make_tensor_descriptor({v}_ptr, shape=[Bt, M, K], strides=[s_ab, s_am, 1],",
                 "        block_shape=[1, BLOCK_M, BLOCK_K])"]
    for j in range(nb):
        for v in [f"b{j}", f"b{j}_lo"] if split else [f"b{j}"]:
            body += [f"if B{j}_T:",
                     f"    {v}_desc = tl.make_tensor_descriptor({v}_ptr, shape=[Bt, N, K], "
                     f"strides=[s_b{j}b, s_b{j}n, 1],",
                     "        block_shape=[1, BLOCK_N, BLOCK_K])",
                     "else:",
                     f"    {v}_desc = tl.make_tensor_descriptor({v}_ptr, shape=[Bt, K, N], "
                     f"strides=[s_b{j}b, s_b{j}k, 1],",
                     "        block_shape=[1, BLOCK_K, BLOCK_N])"]
    body += ["grid_m = tl.cdiv(M, BLOCK_M)", "grid_n = tl.cdiv(N, BLOCK_N)", "per_batch = grid_m * grid_n",
             "width = GROUP_M * grid_n", "k_tiles = tl.cdiv(K, BLOCK_K)",
             "for tile in range(tl.program_id(0), Bt * per_batch, NUM_SMS):"]
    loop = ["rb = tile // per_batch", "pid = tile % per_batch", "rb64 = rb.to(tl.int64)",
            "first_m = (pid // width) * GROUP_M", "size_m = min(grid_m - first_m, GROUP_M)",
            "pid_m = first_m + (pid % width) % size_m", "pid_n = (pid % width) // size_m",
            "om = pid_m * BLOCK_M", "on = pid_n * BLOCK_N"]
    loop += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in st.accs]
    k_body = ["ok = kk * BLOCK_K"]
    for v in ["a", "a_lo"] if split else ["a"]:
        k_body += ["if A_T:", f"    {v} = tl.trans({v}_desc.load([rb, ok, om]).reshape(BLOCK_K, BLOCK_M)){ac}",
                   "else:", f"    {v} = {v}_desc.load([rb, om, ok]).reshape(BLOCK_M, BLOCK_K){ac}"]
    for j, b in enumerate(st.bs):
        bc = f".to({b.cast})" if b.cast else ""
        for v in [f"b{j}", f"b{j}_lo"] if split else [f"b{j}"]:
            k_body += [f"if B{j}_T:", f"    {v} = tl.trans({v}_desc.load([rb, on, ok]).reshape(BLOCK_N, BLOCK_K)){bc}",
                       "else:", f"    {v} = {v}_desc.load([rb, ok, on]).reshape(BLOCK_K, BLOCK_N){bc}"]
    k_body += _split_dots(st.accs, split) if split else \
        [line for j, acc in enumerate(st.accs) for line in _dot(acc, "a", f"b{j}", acc, st.dot, prec)]
    loop += ["for kk in range(0, k_tiles):"] + indent(k_body, 1)
    loop += ["rm = om + tl.arange(0, BLOCK_M)", "rn = on + tl.arange(0, BLOCK_N)", "mask_m = rm < M",
             "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]"] + epilogue_lines(st)
    body += indent(loop, 1)
    head = [f"def {name}_{tag}_tma({', '.join(ptrs + ['Bt', 'M', 'N', 'K'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,",
            f"        NUM_SMS: tl.constexpr, {', '.join(f + ': tl.constexpr' for f in flags)}, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def tma_helpers(name: str) -> str:
    """Launch-side helpers of the TMA kernels: the layout test, the SM count and the descriptors' scratch memory."""
    return "\n".join([
        f"def {name}_tma_ok(*operands):",
        '    """Whether TMA can describe each [B, R, C] operand: 16-byte aligned base and strides, one unit stride."""',
        '    if not hasattr(tl, "make_tensor_descriptor"):',
        "        return False",
        "    for t in operands:",
        "        size, s = t.element_size(), t.stride()",
        "        inner = 2 if s[2] == 1 else 1 if s[1] == 1 else None",
        "        if inner is None or t.data_ptr() % 16:",
        "            return False",
        "        for d in (0, 1, 2):",
        "            if d != inner and t.shape[d] > 1 and (s[d] <= 0 or s[d] * size % 16):",
        "                return False",
        "    return True",
        "",
        "",
        sms_text(name),
        "",
        "",
        f"def {name}_scratch(size, alignment, stream):",
        "    return torch.empty(size, device=\"cuda\", dtype=torch.int8)"])


def sms_text(prefix: str) -> str:
    """``prefix_sms(device)``: the SM count of a CUDA device (read once), 4 elsewhere; the programs of the
    persistent and stream-K schedules."""
    return "\n".join([
        f"{prefix}_SMS = {{}}", "", "",
        f"def {prefix}_sms(device):",
        f"    if device not in {prefix}_SMS:",
        f"        {prefix}_SMS[device] = (torch.cuda.get_device_properties(device).multi_processor_count",
        f"{' ' * (len(prefix) + 24)}if device.type == \"cuda\" else 4)",
        f"    return {prefix}_SMS[device]"])


def reduce_kernel(name: str, st: Stage) -> str:
    """Second pass of split-K: sum the fp32 partials, then the epilogue."""
    params = ["ws_ptr"] + _epi_ptrs(st) + ["M", "N"] + _epi_strides(st)
    body = ["pid = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)", "grid_n = tl.cdiv(N, BLOCK_N)",
            "rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)",
            "mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]",
            "plane = tl.num_programs(1).to(tl.int64) * M * N",
            "ws_ptrs = ws_ptr + rb64 * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]"]
    for j, acc in enumerate(st.accs):
        body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)", "for s in tl.static_range(SPLIT_K):",
                 f"    {acc} += tl.load(ws_ptrs + ({j} * SPLIT_K + s) * plane, mask=mask, other=0.0)"]
    body += epilogue_lines(st)
    head = [f"def {name}_{st.tag}_reduce({', '.join(params)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def _grid_tile(tile: str) -> list[str]:
    """(batch, row block, column block) of a tile index, row-major over the tiles of each batch."""
    return [f"rb64 = ({tile} // per_batch).to(tl.int64)", f"pid_m = ({tile} % per_batch) // grid_n",
            f"pid_n = ({tile} % per_batch) % grid_n", "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"]


def _sizes() -> list[str]:
    return ["grid_m = tl.cdiv(M, BLOCK_M)", "grid_n = tl.cdiv(N, BLOCK_N)", "per_batch = grid_m * grid_n",
            "k_tiles = tl.cdiv(K, BLOCK_K)", "n_tiles = Bt * per_batch",
            "offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]"]


def _piece(j: int, piece: str) -> str:
    """The fp32 partial-sum slot of a tile's piece in the stream-K workspace [n_b, n_tiles, PIECES, BM, BN]."""
    return f"ws_ptr + (({j} * n_tiles + tile) * PIECES + {piece}).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs"


def streamk_kernel(name: str, st: Stage, prec: str) -> str:
    """Stream-K: the K iterations of every (batch, tile) laid end to end and cut into one run of ITERS per program,
    so that a few tiles with a long K keep every SM busy without a fixed split (no wave left a quarter full). A program
    walks its run one tile piece at a time and writes each piece's fp32 partial sums to a slot of its own; the fixup
    kernel adds a tile's pieces in order (the same sums on every call) and applies the epilogue."""
    nb, tag = len(st.bs), st.tag
    ptrs = ["a_ptr"] + [f"b{j}_ptr" for j in range(nb)] + ["ws_ptr"]
    strides = ["s_ab", "s_am", "s_ak"] + [f"s_b{j}{d}" for j in range(nb) for d in "bkn"]
    accs = st.accs
    body = _sizes() + ["rk = tl.arange(0, BLOCK_K)", "it = tl.program_id(0) * ITERS",
                       "end = tl.minimum(it + ITERS, n_tiles * k_tiles)", "while it < end:"]
    loop = ["tile = it // k_tiles", "k0 = it % k_tiles", "k1 = tl.minimum(k_tiles, k0 + (end - it))"]
    loop += _grid_tile("tile")
    # rows/columns past the edge read wrapped data (never stored), so the K loop needs no M/N masks
    loop += ["a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + (k0 * BLOCK_K + rk)[None, :] * s_ak"]
    loop += [f"b{j}_ptrs = b{j}_ptr + rb64 * s_b{j}b + (k0 * BLOCK_K + rk)[:, None] * s_b{j}k "
             f"+ (rn % N)[None, :] * s_b{j}n" for j in range(nb)]
    loop += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    loop += ["for k in range(k0, k1):"] + indent(k_steps(st, prec, "BLOCK_K"), 1)
    loop += ["piece = tl.program_id(0) - (tile * k_tiles) // ITERS"]
    loop += [f"tl.store({_piece(j, 'piece')}, {acc})" for j, acc in enumerate(accs)]
    loop += ["it += k1 - k0"]
    body += indent(loop, 1)
    head = [f"def {name}_{tag}_sk({', '.join(ptrs + ['Bt', 'M', 'N', 'K', 'ITERS', 'PIECES'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,",
            "        UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def streamk_fixup(name: str, st: Stage) -> str:
    """Second pass of stream-K, one program per tile: the partial sums of the programs whose runs crossed the tile,
    added in program order, then the epilogue."""
    params = ["ws_ptr"] + _epi_ptrs(st) + ["Bt", "M", "N", "K", "ITERS", "PIECES"] + _epi_strides(st)
    body = _sizes() + ["tile = tl.program_id(0)"] + _grid_tile("tile")
    body += ["mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]",
             "first = (tile * k_tiles) // ITERS", "last = ((tile + 1) * k_tiles - 1) // ITERS"]
    body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in st.accs]
    body += ["for piece in range(0, last - first + 1):"]
    body += [f"    {acc} += tl.load({_piece(j, 'piece')})" for j, acc in enumerate(st.accs)]
    body += epilogue_lines(st)
    head = [f"def {name}_{st.tag}_fix({', '.join(params)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def fused_kernel(name: str, s0: Stage, s1: Stage, prec0: str, prec1: str) -> str:
    """Two chained batched layers per (row block, batch): the first layer's whole output row block stays in
    registers (H <= 256) and feeds the second layer's dots, which loop over the output columns."""
    ptrs = ["a_ptr", "b_ptr", "c_ptr"] + _epi_ptrs(s0, stores=False) + _epi_ptrs(s1)
    strides = ["s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn", "s_cb", "s_ck", "s_cn"]
    strides += _epi_strides(s0) + _epi_strides(s1)
    ac = f".to({s0.a.cast})" if s0.a.cast else ""
    bc = f".to({s0.bs[0].cast})" if s0.bs[0].cast else ""
    cc = f".to({s1.bs[0].cast})" if s1.bs[0].cast else ""
    acc0, acc1 = s0.accs[0], s1.accs[0]
    loads = [("a", "a_ptrs", "", "rk[None, :] < k_left", ac),
             ("b", "b_ptrs", "mask_h[None, :]", "(rk[:, None] < k_left) & mask_h[None, :]", bc)]
    body = ["pid_m = tl.program_id(0)", "rb64 = tl.program_id(1).to(tl.int64)",
            "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "rh = tl.arange(0, BLOCK_H)", "rk = tl.arange(0, BLOCK_K)",
            "mask_m = rm < M", "mask_h = rh < H", "mask0 = mask_m[:, None] & mask_h[None, :]",
            "a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak",
            "b_ptrs = b_ptr + rb64 * s_bb + rk[:, None] * s_bk + rh[None, :] * s_bn",
            f"{acc0} = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)", "for k in range(0, tl.cdiv(K, BLOCK_K)):"]
    body += indent(_k_loop(loads, _dot(acc0, "a", "b", acc0, s0.dot, prec0), "BLOCK_K")
                    + ["a_ptrs += BLOCK_K * s_ak", "b_ptrs += BLOCK_K * s_bk"], 1)
    body += epilogue_lines(s0, "rh", "mask_h", "mask0", "H", stores=False)
    # padded columns must be exact zeros: an epilogue such as sigmoid turns the zero padding into 0.5
    body += [f"hv = tl.where(mask_h[None, :], {s0.stores[0].var}, 0.0).to({s1.dot})",
             "c_ptrs = c_ptr + rb64 * s_cb + rh[:, None] * s_ck", "for n0 in range(0, N, BLOCK_N):"]
    loop = ["rn = n0 + tl.arange(0, BLOCK_N)", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]",
            f"c = tl.load(c_ptrs + rn[None, :] * s_cn, mask=mask_h[:, None] & mask_n[None, :], other=0.0){cc}",
            *_dot(acc1, "hv", "c", None, s1.dot, prec1)]
    body += indent(loop + epilogue_lines(s1), 1)
    head = [f"def {name}_kernel({', '.join(ptrs + ['M', 'K', 'H', 'N'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,",
            "        EVEN_K: tl.constexpr, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))
