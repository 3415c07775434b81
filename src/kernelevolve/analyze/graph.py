"""Capture a problem's reference as an ATen graph, in a normal form that templates match against.

The graph is traced with ``make_fx`` through ``functional_call``: the module's parameters and buffers become the first
placeholders (in ``named_parameters`` then ``named_buffers`` order), the forward inputs the rest. Decompositions bring
the many spellings of one computation to one form: layer norm, softmax and log-softmax become reductions and
pointwise ops, ``mean``/``var`` become ``sum`` and arithmetic. Matching then works on the graph, not on the source.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pathlib import Path

import torch
import torch.fx as fx

from kernelevolve.analyze.nodes import dtype, op_name, shape
from kernelevolve.analyze.pointwise import POINTWISE
from kernelevolve.problem import Problem, build_model, import_module_from_path, input_specs, make_inputs, meta_inputs

log = logging.getLogger(__name__)
aten = torch.ops.aten


class CaptureError(Exception):
    """A model that cannot be traced; ``where`` names the line of the model's file the trace stopped at, if known."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.where = where


def _where(e: BaseException, path: str) -> str:
    """The last line of ``path`` in the traceback of ``e``: 'file line N: the source line'."""
    import traceback

    want = Path(path).resolve()
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == want]
    if not frames:
        return ""
    f = frames[-1]
    return f"{want.name} line {f.lineno}: {(f.line or '').strip()[:120]}"


@dataclass
class CapturedGraph:
    gm: fx.GraphModule
    state_names: list[str]  # state_dict names of the first len(state_names) placeholders
    n_inputs: int
    input_meta: list[Any]  # (shape, dtype) per forward input, or the constant for a non-tensor input
    device: str
    mode: str  # "fake" or "real": how it was traced
    # the traced arguments, [state tensors, *inputs]; with ``draw``, only the state: ``example`` draws the inputs
    _example: list[Any] = field(default_factory=list, repr=False)
    draw: Callable[[], list[Any]] | None = field(default=None, repr=False, compare=False)
    # the traced model, its parameters the state tensors: a profile times the model's own forward beside the graph's
    model: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def example(self) -> list[Any]:
        """The traced arguments, [state tensors, *inputs]. A graph traced from the inputs' shapes alone draws their
        values on first use: at the sizes of a large problem that costs seconds and gigabytes the plan never needs."""
        if self.draw is not None:
            self._example, self.draw = [self.state, *self.draw()], None
        return self._example

    @property
    def state(self) -> list[torch.Tensor]:
        return self._example[0] if self._example else []

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def placeholders(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def calls(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function"]

    def outputs(self) -> list[Any]:
        out = next(n for n in self.graph.nodes if n.op == "output")
        return list(torch.utils._pytree.tree_leaves(out.args[0]))

    def ops(self) -> list[str]:
        return [op_name(n) for n in self.calls()]

    def mutated_state(self) -> list[str]:
        """The state_dict names the forward writes in place (running statistics of a norm in training mode)."""
        state = dict(zip(self.placeholders(), self.state_names))
        out = []
        for n in self.calls():
            schema = getattr(n.target, "_schema", None)
            if schema is None or not schema.is_mutable:
                continue
            for k, arg in enumerate(schema.arguments):
                a = n.args[k] if k < len(n.args) else n.kwargs.get(arg.name)
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                for t in a if isinstance(a, (list, tuple)) else [a]:
                    base = _view_base(t)  # a write through a view (buf[0] = v) writes the buffer
                    if base in state and state[base] not in out:
                        out.append(state[base])
        return out


def _view_base(node: Any) -> Any:
    """The tensor a chain of views (select, slice, view, ...) reads, or ``node`` itself."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        schema = getattr(node.target, "_schema", None)
        first = schema.arguments[0] if schema is not None and schema.arguments else None
        if first is None or first.alias_info is None or first.alias_info.is_write or not node.args:
            break
        node = node.args[0]
    return node


def users(node: fx.Node) -> list[fx.Node]:
    return list(node.users)


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """Input nodes of ``node`` in argument order, each once."""
    seen: list[fx.Node] = []
    for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(a, fx.Node) and a not in seen:
            seen.append(a)
    return seen


# ---- decompositions into the normal form -----------------------------------------------------------------------


def _dims(x: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.dim(), 1) for d in dims]


def _count(x: torch.Tensor, dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


def _mean(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    dims = _dims(x, dim)
    if dtype is not None:
        x = x.to(dtype)
    acc = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    out = torch.sum(acc, dims, keepdim=keepdim) / _count(x, dims)
    return out.to(x.dtype)


def _var_mean(x: torch.Tensor, dim: Any = None, *, correction: float | None = None,
              keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    dims = _dims(x, dim)
    n = _count(x, dims)
    c = 1 if correction is None else correction
    acc = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    m = torch.sum(acc, dims, keepdim=True) / n
    d = acc - m
    var = torch.sum(d * d, dims, keepdim=keepdim) / max(n - c, 0)
    if not keepdim:
        m = m.squeeze(dims) if len(dims) else m
    return var.to(x.dtype), m.to(x.dtype)


def _var(x: torch.Tensor, dim: Any = None, *, correction: float | None = None, keepdim: bool = False) -> torch.Tensor:
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.amax(x, [dim], keepdim), torch.argmax(x, dim, keepdim)


def _min_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.amin(x, [dim], keepdim), torch.argmin(x, dim, keepdim)


def _merged(op: Callable) -> Callable:
    """A reduction over several adjacent dims becomes one over a single merged dim (group norm, mean over H and W),
    which the reduction template handles; one over dims apart (a batch norm's N, H and W) becomes one such reduction
    per run of adjacent dims, innermost first; other forms trace unchanged."""

    def reduce(x: torch.Tensor, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
        dims = sorted(_dims(x, dim)) if dim not in (None, []) else []
        if len(dims) < 2 or kwargs:
            return NotImplemented
        if dims != list(range(dims[0], dims[-1] + 1)):
            # dims apart (a batch norm's N, H and W): the innermost run of adjacent dims first, then the next one
            runs: list[list[int]] = []
            for d in dims:
                if runs and d == runs[-1][-1] + 1:
                    runs[-1].append(d)
                else:
                    runs.append([d])
            # half-precision sums run in fp32 between the steps and round once, as one sum over all the dims does
            wide = op is torch.sum and x.dtype in (torch.float16, torch.bfloat16)
            out = x.to(torch.float32) if wide else x
            for run in reversed(runs):
                out = reduce(out, run, True) if len(run) > 1 else op(out, run, True)
            out = out.to(x.dtype) if wide else out
            return out if keepdim else out.view([s for i, s in enumerate(x.shape) if i not in dims])
        flat = x.flatten(dims[0], dims[-1])
        out = op(flat, [dims[0]], keepdim)
        return out.view(list(x.shape[:dims[0]]) + [1] * len(dims) + list(x.shape[dims[-1] + 1:])) if keepdim else out

    return reduce


def _group_norm(default: Callable) -> Callable:
    """GroupNorm over spatial dims as a reduction frame the row-reduction family reads whole: the statistics over
    [N, G, C/G * HW] (the library's decomposition computes them in a [N, G, C/G, HW] view, which splits the reduced
    dim), then one per-channel scale and shift applied to the input, ``x * a[n, c] + b[n, c]``. Without spatial dims
    (HW == 1) the library's form is kept: statistics and affine already share one [N, G, C/G] frame there."""

    def decomposed(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: int, c: int, hw: int,
                   group: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not isinstance(hw, int) or hw == 1 or x.dim() < 3:
            return default(x, weight, bias, n, c, hw, group, eps)
        cg = c // group
        acc = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
        xg = acc.reshape(n, group, cg * hw)
        mean = torch.sum(xg, [2], keepdim=True) / (cg * hw)
        d = xg - mean
        rstd = torch.rsqrt(torch.sum(d * d, [2], keepdim=True) / (cg * hw) + eps)
        scale = rstd * weight.reshape(1, group, cg) if weight is not None else rstd.expand(n, group, cg)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.reshape(1, group, cg)
        per_channel = [n, c] + [1] * (x.dim() - 2)
        out = acc * scale.reshape(per_channel) + shift.reshape(per_channel)
        return out.to(x.dtype), mean.reshape(n, group).to(x.dtype), rstd.reshape(n, group).to(x.dtype)

    return decomposed


def _decompositions() -> dict[Any, Callable]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.softmax.int,
                                     aten.log_softmax.int, aten.layer_norm, aten.rms_norm, aten.linalg_vector_norm,
                                     aten.logsumexp, aten.silu, aten.hardswish, aten.mish, aten.addcmul,
                                     aten.native_group_norm, aten.native_batch_norm,
                                     aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
                                     aten._native_batch_norm_legit_functional]))
    for op in (aten.mean.dim, aten.mean.default):
        table[op] = _mean
    table[aten.var_mean.correction] = _var_mean
    table[aten.native_group_norm.default] = _group_norm(table[aten.native_group_norm.default])
    table[aten.var.correction] = _var
    table[aten.sum.dim_IntList] = _merged(torch.sum)
    table[aten.amax.default] = _merged(torch.amax)
    table[aten.amin.default] = _merged(torch.amin)
    table[aten.max.dim] = _max_dim
    table[aten.min.dim] = _min_dim
    # keep these whole: templates know them, decomposing them loses the structure
    for op in (aten.gelu.default, aten._embedding_bag.default, aten.embedding.default, aten.embedding_bag.default):
        table.pop(op, None)
    return table


# ---- capture ---------------------------------------------------------------------------------------------------


def _trace(model: torch.nn.Module, inputs: list[Any], mode: str,
           origins: bool = False) -> tuple[fx.GraphModule, list[str]]:
    """With ``origins``, every node also carries where it came from: ``node.meta["custom"]["module"]`` (the dotted
    path of the innermost submodule whose forward made it) and ``node.stack_trace`` (see ``origin``)."""
    if origins:
        with _Origins(model):
            return _trace(model, inputs, mode)
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.func import functional_call

    state = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    names = list(state)

    def f(tensors: list[torch.Tensor], *args: Any) -> Any:
        return functional_call(model, dict(zip(names, tensors)), args)

    values = [state[n].detach() for n in names]
    # a trace on real tensors runs the forward: the state it writes (running statistics) is put back after each one
    saved = [v.clone() for v in values] if mode == "real" else []
    with torch.no_grad():
        try:
            gm = make_fx(f, decomposition_table=_decompositions(), tracing_mode=mode,
                         record_stack_traces=_Origins.active)(values, *inputs)
        finally:
            _restore(values, saved)
        try:
            if any(_rewrite(n) is not None for n in gm.graph.nodes):
                # once more through an interpreter that writes the same values in the normal form
                gm = make_fx(lambda tensors, *args: _NormalForm(gm).run(tensors, *args),
                             decomposition_table=_decompositions(), tracing_mode=mode,
                             record_stack_traces=_Origins.active)(values, *inputs)
        except Exception as e:  # a rewrite never costs the capture: the graph as first traced stands
            log.debug("normal-form rewrite skipped: %s: %s", type(e).__name__, e)
        finally:
            _restore(values, saved)
    return gm, names


class _Origins:
    """Forward hooks on every submodule that name, while a trace runs, the innermost module whose forward is running;
    fx copies the name into each node it makes (``meta["custom"]``, kept through the normal-form pass, which an
    interpreter replays node by node under the same preserved metadata)."""
    active = False

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.handles, self.stack = model, [], []
        self.calls: dict[str, int] = {}

    def _enter(self, name: str) -> Callable:
        def hook(module: Any, args: Any) -> None:
            # which call of the module this is, and whether it may write its input (an in-place activation): a
            # composition calls a module whose whole call no kernel replaced as the module itself (compose.py)
            self.calls[name] = self.calls.get(name, 0) + 1
            self.stack.append((name, self.calls[name], getattr(module, "inplace", False) is True))
            self._mark()
        return hook

    def _leave(self, module: Any, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()
        self._mark()

    def _mark(self) -> None:
        import torch.fx.traceback as fx_traceback

        name, call, inplace = self.stack[-1] if self.stack else ("", 0, False)
        fx_traceback.current_meta["custom"] = {"module": name, "call": call, "inplace": inplace}

    def __enter__(self) -> "_Origins":
        import torch.fx.traceback as fx_traceback

        for name, sub in self.model.named_modules():
            self.handles.append(sub.register_forward_pre_hook(self._enter(name)))
            self.handles.append(sub.register_forward_hook(self._leave))
        self.preserve = fx_traceback.preserve_node_meta()
        self.preserve.__enter__()
        _Origins.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        _Origins.active = False
        self.preserve.__exit__(*exc)
        for h in self.handles:
            h.remove()


def origin(node: fx.Node, path: str | None = None) -> tuple[str, int | None]:
    """Where a node of a graph traced with origins came from: the dotted path of its module ("" for the root) and
    the line of ``path`` (the model's file) nearest the op in the node's stack, or None where the stack has none."""
    module = (node.meta.get("custom") or {}).get("module", "")
    line = None
    trace = node.meta.get("stack_trace") or ""
    if path is not None:
        import re

        name = str(path)
        for m in re.finditer(r'File "([^"]+)", line (\d+)', trace):
            if m.group(1) == name:
                line = int(m.group(2))  # the last frame in the model's file is the closest to the op
    return module, line


def _restore(values: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    for v, s in zip(values, saved):
        v.copy_(s)


# ---- rewrites into the normal form: the same values, spelled the way the templates read them ---------------------------
_REDUCTIONS = {"sum": torch.sum, "amax": torch.amax, "amin": torch.amin}


def _ones(node: Any) -> bool:
    return isinstance(node, fx.Node) and op_name(node) == "full" and len(node.args) >= 2 and node.args[1] == 1 \
        and not isinstance(node.args[1], bool)


def _rewrite(node: fx.Node) -> Callable[[dict[fx.Node, Any]], Any] | None:
    """How to compute ``node`` in the normal form from the values of the nodes before it, or None where it already
    is: a reduction over a permuted tensor reduces the tensor itself (``einsum('ij->j')`` is a column sum), and a
    product with a tensor of ones is a sum (``x @ ones(K, 1)``)."""
    if node.op != "call_function":
        return None
    name = op_name(node)
    if name in _REDUCTIONS and len(node.args) >= 2 and not node.kwargs and isinstance(node.args[0], fx.Node) \
            and op_name(node.args[0]) == "permute" and len(node.args[0].users) == 1 \
            and isinstance(node.args[1], (int, list, tuple)) and len(node.args[0].args[1]) > 0:
        src, perm = node.args[0].args[0], [int(d) for d in node.args[0].args[1]]
        rank = len(perm)
        dims = sorted(d % rank for d in ([node.args[1]] if isinstance(node.args[1], int) else node.args[1]))
        keepdim = bool(node.args[2]) if len(node.args) > 2 else False
        if not dims:
            return None
        kept = [perm[d] for d in range(rank) if d not in dims]
        if kept != sorted(kept):  # the remaining dims would come out reordered: leave it be
            return None
        orig = sorted(perm[d] for d in dims)
        out_shape = list(shape(node))
        op = _REDUCTIONS[name]
        return lambda env: op(env[src], orig, False).reshape(out_shape) if keepdim else op(env[src], orig, False)
    if name == "mm" and len(node.args) == 2:
        a, b = node.args
        out_dtype = dtype(node)  # an integer product stays in its dtype where an integer sum would widen
        if _ones(b):
            return lambda env: torch.sum(env[a], [1], keepdim=True).to(out_dtype).expand(shape(node))
        if _ones(a):
            return lambda env: torch.sum(env[b], [0], keepdim=True).to(out_dtype).expand(shape(node))
    return None


class _NormalForm(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)  # a rewrite reads values from before their last use

    def run_node(self, n: fx.Node) -> Any:
        how = _rewrite(n)
        if how is None:
            return super().run_node(n)
        with self._set_current_node(n):  # the ops it writes carry the node's metadata (its module call) too
            return how(self.env)


def capture(problem: Problem, shape_index: int = 0, init_seed: int = 0, input_seed: int | None = None,
            origins: bool = False) -> CapturedGraph:
    """Trace ``problem``'s Model on the CPU (fake tensors first, real ones if the graph depends on data), in the mode
    its constructor leaves it, as the judge runs it: a module in training mode normalizes a batch by its own
    statistics (and updates the running ones), where the same module in eval mode would read the running ones."""
    module = import_module_from_path(problem.path, f"_kernelevolve_capture_{problem.short_sha}")
    model = build_model(module, "Model", init_seed)
    seed = init_seed + 1 if input_seed is None else input_seed

    def draw() -> list[Any]:
        return make_inputs(module, seed=seed, shape_index=shape_index)

    # a fake trace reads shapes only: tensors of the drawn shapes whose memory is never written (nor touched) stand
    # in for the inputs, and their values are drawn only if the real trace or a caller of ``example`` needs them
    shells = meta_inputs(module, seed, shape_index)
    if shells is not None:
        shells = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype) if isinstance(x, torch.Tensor) else x
                  for x in shells]
    errors: list[str] = []
    where = ""
    inputs: list[Any] | None = None
    for mode in ("fake", "real"):
        if mode == "real" or shells is None:
            inputs = draw() if inputs is None else inputs
        args = shells if mode == "fake" and shells is not None else inputs
        try:
            gm, names = _trace(model, args, mode, origins)
        except Exception as e:  # any tracing failure: try the next mode, report all of them
            errors.append(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            where = _where(e, problem.path) or where
            continue
        if mode == "fake" and _sizes_from_data(gm):
            # a size only the values decide (repeat_interleave's output, a jagged total, nonzero): the real trace
            # gives this draw's sizes, and dynamic_dims tells which of them vary
            errors.append("fake: sizes depend on the data")
            continue
        _drop_dead(gm)
        input_meta = [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in args]
        state = [dict(model.named_parameters(), **dict(model.named_buffers()))[n].detach() for n in names]
        own = model if origins else None  # a profile scales the ops to their module calls, which origins name
        if inputs is None:
            return CapturedGraph(gm, names, len(args), input_meta, "cpu", mode, [state], draw=draw, model=own)
        return CapturedGraph(gm, names, len(args), input_meta, "cpu", mode, [state, *inputs], model=own)
    raise CaptureError("; ".join(errors), where)


def dynamic_dims(problem: Problem, seeds: tuple[int, ...] = (1, 2, 3)) -> tuple[dict[int, set[int]], int | None]:
    """Input dims whose size changes from draw to draw (jagged totals, for example), and a seed whose draw differs
    from the first one's: {input index: {dim, ...}}, seed."""
    module = import_module_from_path(problem.path, f"_kernelevolve_draws_{problem.short_sha}")
    draws = [[spec[0] if spec is not None else None for spec in input_specs(module, s)] for s in seeds]
    dims: dict[int, set[int]] = {}
    other = None
    for seed, draw in zip(seeds[1:], draws[1:]):
        for i, (a, b) in enumerate(zip(draws[0], draw)):
            if a is not None and b is not None and len(a) == len(b) and a != b:
                dims.setdefault(i, set()).update(d for d in range(len(a)) if a[d] != b[d])
                other = seed if other is None else other
    return dims, other


def _sizes_from_data(gm: fx.GraphModule) -> bool:
    """Whether a traced value's shape holds a size no input's shape decides (an unbacked symbol)."""
    try:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    except ImportError:
        return False
    for node in gm.graph.nodes:
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor) and free_unbacked_symbols(v):
                return True
    return False


def _drop_dead(gm: fx.GraphModule) -> None:
    _out_of_place(gm.graph)
    _drop_identities(gm.graph)
    _merge_repeats(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _aliases(target: Any) -> bool:
    """An ATen op whose result shares its memory with an argument (a view, or an in-place op's return)."""
    return isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None
                                                             for r in target._schema.returns)


def _out_of_place(graph: fx.Graph) -> None:
    """An in-place pointwise op on a value the forward made itself, through no view (``nn.ReLU(inplace=True)`` after a
    convolution), becomes its out-of-place form, and what reads the value after the write reads the new node: the
    same values, and a graph the families can claim. A write to an input, a parameter, a buffer or a view is a real
    side effect and stays."""
    order = topo_index(graph)
    for node in list(graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not node.args:
            continue
        name = target.overloadpacket.__name__
        written = node.args[0]
        if not (target._schema.is_mutable and name.endswith("_") and name[:-1] in POINTWISE
                and isinstance(written, fx.Node) and written.op == "call_function"):
            continue
        made = written.target
        if not isinstance(made, torch._ops.OpOverload) or made._schema.is_mutable or _aliases(made):
            continue  # a view or an in-place result: the write would reach other memory
        if any(_aliases(u.target) and u is not node for u in written.users):
            continue  # a view of it is read somewhere: the write shows through that view
        pure = getattr(getattr(torch.ops.aten, name[:-1], None), target._overloadname, None)
        if pure is None:
            continue
        later = [u for u in written.users if u is not node and order[u] > order[node]]  # they read the write
        with graph.inserting_before(node):
            fresh = graph.call_function(pure, node.args, node.kwargs)
        fresh.meta = dict(node.meta)
        for user in later:
            user.replace_input_with(written, fresh)
        node.replace_all_uses_with(fresh)
        graph.erase_node(node)
        order[fresh] = order[node]  # its place: every other node keeps its own (an LSTM has thousands of these)


# (op, the constant that leaves the other operand as it is, whether that constant may stand first)
_IDENTITIES = {"mul": (1, True), "div": (1, False), "add": (0, True), "sub": (0, False)}


def _drop_identities(graph: fx.Graph) -> None:
    """``x * 1``, ``x / 1``, ``x + 0`` and ``x - 0`` are ``x`` (``torch.addcmul(a, b, c)`` decomposes to
    ``a + (b * 1) * c``), where the result has ``x``'s shape and dtype."""
    for node in list(graph.nodes):
        name = op_name(node) if node.op == "call_function" else ""
        if name not in _IDENTITIES or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
            continue
        one, either = _IDENTITIES[name]
        a, b = node.args
        x = a if _is_number(b, one) else b if either and _is_number(a, one) else None
        if isinstance(x, fx.Node) and shape(x) == shape(node) and dtype(x) == dtype(node) \
                and not _written_later(node) and not _written_later(x):
            node.replace_all_uses_with(x)
            graph.erase_node(node)


def _is_number(value: Any, number: int) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == number


_REDUCING = {"sum", "amax", "amin", "mean", "prod", "var", "var_mean", "max", "min", "logsumexp"}


def _merge_repeats(graph: fx.Graph) -> None:
    """One node for each value computed twice: the same pure elementwise op or reduction on the same arguments
    (``torch.exp(s - m)`` written in a numerator and again in a denominator). Ops that write, ops that draw random
    numbers, values an in-place op later writes, and gathers, views and factories (each pooling may own its gather)
    stay as they are."""
    mergeable = POINTWISE | _REDUCING
    seen: dict[Any, fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or op_name(node) not in mergeable:
            continue
        schema = node.target._schema
        if schema.is_mutable or torch.Tag.nondeterministic_seeded in node.target.tags or not node.args \
                or not any(isinstance(a, fx.Node) for a in node.all_input_nodes) or _written_later(node) \
                or any(_written_later(a) for a in node.all_input_nodes):  # an input written between two reads
            continue
        try:
            key = (node.target, _frozen(node.args), _frozen(node.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _written_later(node: fx.Node) -> bool:
    """Whether an in-place op writes ``node``'s memory, directly or through views of it."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            target = u.target
            if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
                return True
            if _aliases(target):
                todo.append(u)  # a view: what writes it writes the node
    return False


def topo_index(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def region_io(nodes: Iterable[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]]:
    """External inputs (first-use order) and outputs (values used outside the set, or graph outputs) of a node set."""
    nodes = list(nodes)
    inside = set(nodes)
    inputs: list[fx.Node] = []
    outputs: list[fx.Node] = []
    for n in nodes:
        for a in tensor_args(n):
            if a not in inside and a not in inputs:
                inputs.append(a)
        if any(u not in inside for u in n.users):
            outputs.append(n)
    return inputs, outputs


def is_convex(nodes: Iterable[fx.Node]) -> bool:
    """No path leaves the set and comes back: the set can run as one kernel call."""
    inside = set(nodes)
    frontier = [u for n in inside for u in n.users if u not in inside]
    seen: set[fx.Node] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in inside:
            return False
        frontier.extend(n.users)
    return True


def node_values(graph: CapturedGraph, args: list[Any] | None = None) -> dict[fx.Node, Any]:
    """Every node's value on concrete arguments (``graph.example`` by default): what a match must reproduce."""
    values: dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            values[n] = out = super().run_node(n)
            return out

    with torch.no_grad():
        Recorder(graph.gm).run(*(args if args is not None else graph.example))
    return values


def convex_core(nodes: Iterable[fx.Node]) -> set[fx.Node]:
    """The largest part of ``nodes`` that stays convex by dropping every node that depends on a value which left the
    set and came back (and everything after it in the set)."""
    inside = set(nodes)
    while inside and not is_convex(inside):
        outside: set[fx.Node] = set()
        frontier = [u for n in inside for u in n.users if u not in inside]
        while frontier:
            n = frontier.pop()
            if n in outside or n in inside:
                continue
            outside.add(n)
            frontier.extend(n.users)
        tainted = {n for n in inside if any(a in outside for a in n.all_input_nodes)}
        stack = list(tainted)
        while stack:
            n = stack.pop()
            for u in n.users:
                if u in inside and u not in tainted:
                    tainted.add(u)
                    stack.append(u)
        inside -= tainted
    return inside
