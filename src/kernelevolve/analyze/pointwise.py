"""Elementwise ATen ops as Triton expressions.

``emit`` turns a chain (any DAG) of elementwise nodes into Triton statements, given the Triton names of the values
they read. Values are computed in fp32 (or in their integer/bool type) and cast only where the graph casts; templates
cast to the output dtype at the store, as Inductor does.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx as fx

from kernelevolve.analyze.nodes import dtype, op_name

TL_DTYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
             torch.float64: "tl.float64", torch.int32: "tl.int32", torch.int64: "tl.int64", torch.int16: "tl.int16",
             torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}


class CodegenError(Exception):
    pass


def compute_dtype(dt: torch.dtype | None) -> str:
    """The type a value is held in inside a kernel: fp32 for every float narrower than 64 bits."""
    if dt is None or dt in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return TL_DTYPES.get(dt, "tl.float32")


def float_literal(v: float) -> str:
    """Python source for a float, NaN and infinities included (valid in Triton and in plain Python)."""
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


def _lit(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return float_literal(v)
    raise CodegenError(f"unsupported constant {v!r}")


def _gelu(x: str, approximate: str = "none") -> str:
    if approximate == "tanh":
        return (f"0.5 * {x} * (1.0 + _tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))")
    return f"0.5 * {x} * (1.0 + _erf({x} * 0.7071067811865476))"


UNARY: dict[str, Callable[..., str]] = {
    "neg": lambda x: f"-{x}", "abs": lambda x: f"tl.abs({x})", "exp": lambda x: f"tl.exp({x})",
    "exp2": lambda x: f"tl.exp2({x})", "log": lambda x: f"tl.log({x})", "log2": lambda x: f"tl.log2({x})",
    "sqrt": lambda x: f"tl.sqrt({x})", "rsqrt": lambda x: f"tl.rsqrt({x})", "sin": lambda x: f"tl.sin({x})",
    "cos": lambda x: f"tl.cos({x})", "tanh": lambda x: f"_tanh({x})", "erf": lambda x: f"_erf({x})",
    "sigmoid": lambda x: f"tl.sigmoid({x})", "relu": lambda x: f"tl.maximum({x}, 0.0)",
    "reciprocal": lambda x: f"1.0 / {x}", "log1p": lambda x: f"tl.log(1.0 + {x})",
    "expm1": lambda x: f"(tl.exp({x}) - 1.0)", "floor": lambda x: f"tl.floor({x})", "ceil": lambda x: f"tl.ceil({x})",
    "logical_not": lambda x: f"({x} == 0)", "bitwise_not": lambda x: f"(~{x})", "sign": lambda x:
    f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))", "isnan": lambda x: f"({x} != {x})",
    "silu": lambda x: f"{x} * tl.sigmoid({x})", "square": lambda x: f"{x} * {x}",
}
BINARY: dict[str, Callable[[str, str], str]] = {
    "add": lambda a, b: f"{a} + {b}", "sub": lambda a, b: f"{a} - {b}", "mul": lambda a, b: f"{a} * {b}",
    "div": lambda a, b: f"{a} / {b}", "maximum": lambda a, b: f"tl.maximum({a}, {b})",
    "minimum": lambda a, b: f"tl.minimum({a}, {b})", "pow": lambda a, b: _pow(a, b),
    "eq": lambda a, b: f"{a} == {b}", "ne": lambda a, b: f"{a} != {b}", "lt": lambda a, b: f"{a} < {b}",
    "le": lambda a, b: f"{a} <= {b}", "gt": lambda a, b: f"{a} > {b}", "ge": lambda a, b: f"{a} >= {b}",
    "logical_and": lambda a, b: f"({a} != 0) & ({b} != 0)", "logical_or": lambda a, b: f"({a} != 0) | ({b} != 0)",
    "bitwise_and": lambda a, b: f"{a} & {b}", "bitwise_or": lambda a, b: f"{a} | {b}",
    "atan2": lambda a, b: f"_atan2({a}, {b})", "fmod": lambda a, b: f"_fmod({a}, {b})",
}
# ops that only change how a value is labelled, not its elements, once the template has broadcast every operand
IDENTITY = {"clone", "alias", "_to_copy", "convert_element_type", "lift_fresh_copy", "detach", "contiguous"}
POINTWISE = set(UNARY) | set(BINARY) | IDENTITY | {"gelu", "where", "clamp", "clamp_min", "clamp_max", "scalar_tensor",
                                                   "leaky_relu", "hardtanh", "elu", "softplus", "masked_fill",
                                                   "sigmoid_backward", "lerp", "full_like", "zeros_like",
                                                   "ones_like", "bitwise_xor", "round", "trunc"}


def _pow(a: str, b: str) -> str:
    try:
        e = float(b)
    except ValueError:
        return f"tl.exp({b} * tl.log({a}))"
    if e == 2.0:
        return f"({a} * {a})"
    if e == 0.5:
        return f"tl.sqrt({a})"
    if e == -0.5:
        return f"tl.rsqrt({a})"
    if e == 1.0:
        return a
    if e == 3.0:
        return f"({a} * {a} * {a})"
    if e == -1.0:
        return f"(1.0 / {a})"
    return f"_powf({a}, {b})"


# Helpers every kernel file that uses pointwise code carries; written out once per candidate file.
PRELUDE = '''
@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _erf(x):
    return tl.erf(x)


@triton.jit
def _powf(a, b):
    return tl.exp2(b * tl.log2(a))


@triton.jit
def _fmod(a, b):
    return libdevice.fmod(a, b)


@triton.jit
def _atan2(a, b):
    return libdevice.atan2(a, b)


def _cdiv(a, b):
    return -(-a // b)  # launch grids in plain integers (triton.cdiv is a constexpr function in recent Triton)
'''
# The import the prelude needs, placed with the candidate file's imports.
PRELUDE_IMPORTS = "from triton.language.extra import libdevice"


def is_pointwise(node: fx.Node) -> bool:
    return node.op == "call_function" and op_name(node) in POINTWISE


def _arg(env: dict[fx.Node, str], a: Any) -> str:
    if isinstance(a, fx.Node):
        if a not in env:
            raise CodegenError(f"value {a.name} is not available to the kernel")
        return env[a]
    return _lit(a)


def expression(node: fx.Node, env: dict[fx.Node, str]) -> str:
    """One Triton expression for ``node`` from the names in ``env``; raises CodegenError for what it cannot express."""
    name = op_name(node)
    args = list(node.args)
    arg = lambda i: _arg(env, args[i])  # noqa: E731
    if name in UNARY:
        return UNARY[name](arg(0))
    if name in BINARY:
        alpha = node.kwargs.get("alpha")
        b = arg(1) if alpha is None else f"({arg(1)} * {_lit(alpha)})"
        if name == "div" and node.kwargs.get("rounding_mode") is not None:
            mode = node.kwargs["rounding_mode"]
            q = f"({arg(0)} / {b})"
            return f"tl.floor({q})" if mode == "floor" else f"{q}.to(tl.int64).to(tl.float32)"
        return f"({BINARY[name](arg(0), b)})"
    if name in IDENTITY:
        target = dtype(node)
        src = arg(0)
        if target is not None and compute_dtype(target) != compute_dtype(dtype(args[0])):
            return f"{src}.to({compute_dtype(target)})"
        if target in (torch.float16, torch.bfloat16) and dtype(args[0]) == torch.float32:
            return f"{src}.to({TL_DTYPES[target]}).to(tl.float32)"  # the rounding the graph asks for
        return src
    if name == "gelu":
        return _gelu(arg(0), node.kwargs.get("approximate", "none"))
    if name == "where":
        return f"tl.where({arg(0)} != 0, {arg(1)}, {arg(2)})"
    if name == "masked_fill":
        return f"tl.where({arg(1)} != 0, {arg(2)}, {arg(0)})"
    if name in ("clamp", "clamp_min", "clamp_max", "hardtanh"):
        lo, hi = _bounds(name, args)
        x = arg(0)
        if lo is not None:
            x = f"tl.maximum({x}, {_arg(env, lo)})"
        if hi is not None:
            x = f"tl.minimum({x}, {_arg(env, hi)})"
        return x
    if name == "leaky_relu":
        slope = args[1] if len(args) > 1 else 0.01
        return f"tl.where({arg(0)} > 0, {arg(0)}, {arg(0)} * {_lit(slope)})"
    if name == "scalar_tensor":
        return _lit(args[0])
    if name in ("full_like", "zeros_like", "ones_like"):
        fill = args[1] if name == "full_like" else (0.0 if name == "zeros_like" else 1.0)
        return f"tl.zeros_like({arg(0)}) + {_lit(fill)}"
    if name == "lerp":
        return f"({arg(0)} + {_arg(env, args[2])} * ({arg(1)} - {arg(0)}))"
    if name == "softplus":
        beta = args[1] if len(args) > 1 else 1.0
        thr = args[2] if len(args) > 2 else 20.0
        x = arg(0)
        return (f"tl.where({x} * {_lit(beta)} > {_lit(thr)}, {x}, "
                f"tl.log(1.0 + tl.exp({x} * {_lit(beta)})) / {_lit(beta)})")
    if name == "elu":
        alpha = args[1] if len(args) > 1 else 1.0
        return f"tl.where({arg(0)} > 0, {arg(0)}, {_lit(alpha)} * (tl.exp({arg(0)}) - 1.0))"
    if name in ("round", "trunc"):
        fn = "rint" if name == "round" else "trunc"
        return f"libdevice.{fn}({arg(0)})"
    raise CodegenError(f"no Triton expression for aten.{name}")


def _bounds(name: str, args: list[Any]) -> tuple[Any, Any]:
    if name == "clamp_min":
        return args[1], None
    if name == "clamp_max":
        return None, args[1]
    if name == "hardtanh":
        return (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
    return (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else None)


def emit(nodes: list[fx.Node], env: dict[fx.Node, str], lines: list[str], prefix: str = "t") -> dict[fx.Node, str]:
    """Append one statement per node (in order) to ``lines``; ``env`` maps already available values to names.

    Returns the extended map. Boolean results stay boolean; every float result is fp32."""
    env = dict(env)
    for i, node in enumerate(nodes):
        if node in env:
            continue
        var = f"{prefix}{i}"
        lines.append(f"{var} = {expression(node, env)}")
        env[node] = var
    return env


def can_emit(node: fx.Node) -> bool:
    if not is_pointwise(node):
        return False
    probe = {a: "x" for a in node.all_input_nodes}
    try:
        expression(node, probe)
    except CodegenError:
        return False
    return True
