"""The whole model with its regions' verified kernels put back: ``best_model.py``, a candidate file (``ModelNew``).

The file holds the model's source verbatim (``ModelNew`` subclasses its ``Model``, so it takes the same constructor
arguments and state), each chosen region's ``best.py`` as text, loaded once into a module of its own, and a
generated ``forward``: the model's graph op by op as it was traced, where every instance of a chosen region calls
that region's kernel with the instance's own weights and activations. Inputs of other shapes or dtypes than the
traced ones take the model's own forward. The file needs torch and triton only.

Two hosts: ``eager`` calls each region's kernel from the generated forward as it stands; ``compile`` registers each
instance as a ``torch.library`` custom op (its outputs described to the compiler from the traced shapes, so the
kernels stay opaque to Inductor) and runs the generated forward under ``torch.compile``: Inductor fuses the glue
between the regions, the regions keep their kernels. Input sizes that vary by draw (jagged totals) stay free in both
hosts where two draws write the same file.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, is_convex
from kernelevolve.model.partition import Region
from kernelevolve.model.regionfile import region_parts
from kernelevolve.templates.base import Match
from kernelevolve.templates.program import DEVICE_LINE, STATE_LINE, forward_body, model_new

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chosen:
    """A problem whose kernel goes into the model: its name, its best.py and where that came from."""
    name: str
    regions: list[Region]
    source: str  # the problem's best.py
    provenance: str  # one line


# How a file carries other files' text as modules of its own (region kernels here, parts' files in parts.py)
EXEC = '''

def _kernelevolve_exec(name, source):
    """Another file's text run as a module of its own, named as this file's module: the kernels it defines are this
    file's own (whoever counts a file's kernels by their module, as the judge does, counts these)."""
    import linecache
    import types

    filename = f"<kernelevolve {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # Triton reads the source
    module = types.ModuleType(__name__)
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    return module
'''

LOADER = EXEC + '''

def _kernelevolve_region(name, source, weights):
    """A region's kernel file as a module of its own, its weights read as stand-ins (the file's Model reads them
    from the model beside it; each call here passes the real ones)."""
    module = _kernelevolve_exec(f"region {name}", source)
    module._source_state = lambda: {k: torch.zeros(shape, dtype=dt, device="meta") for k, (shape, dt) in
                                    weights.items()}
    return module


def _kernelevolve_instance(module):
    """One instance of a region's ModelNew for each place it runs (a compiled kernel keeps its weights' identity)."""
    return module.ModelNew()


def _kernelevolve_call(module, params, buffers, xs):
    """One instance of a region: its weights set on the shared module, its kernel called, the outputs a tuple."""
    for k, w in params:
        module._parameters[k] = w
    for k, w in buffers:
        module._buffers[k] = w
    out = module(*xs)
    return out if isinstance(out, tuple) else (out,)
'''


OPS = '''

_KE_TAG = __import__("uuid").uuid4().hex[:12]  # op names of their own for each load of this file
_KE_LIB = torch.library.Library("kernelevolve_model", "FRAGMENT")  # held by the module: its ops live as long


def _kernelevolve_op(name, instance, params, buffers, outputs):
    """One instance of a region as a custom op: opaque to torch.compile, its outputs fresh contiguous tensors of the
    traced shapes and dtypes (``outputs``). Its weights come as one list: ``params``' names, then ``buffers``'."""
    opname = f"{name}_{_KE_TAG}"
    _KE_LIB.define(f"{opname}(Tensor[] ws, Tensor[] xs) -> Tensor[]")

    def op(ws, xs):
        outs = _kernelevolve_call(instance, list(zip(params, ws)), list(zip(buffers, ws[len(params):])), xs)
        seen = {t.untyped_storage().data_ptr() for t in [*ws, *xs]}
        fresh = []
        for o in outs:  # no output may alias an input or another output
            o = o.contiguous()
            fresh.append(o.clone() if o.untyped_storage().data_ptr() in seen else o)
            seen.add(o.untyped_storage().data_ptr())
        return fresh

    def fake(ws, xs):
        device = (xs or ws)[0].device
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in outputs]

    # an operator of the library's own, not torch.library.custom_op: the same opaque op to torch.compile, with less
    # Python around each call (custom_op's wrappers cost a call about 10 us more on a CPU core)
    _KE_LIB.impl(opname, op, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kernelevolve_model::{opname}", fake, lib=_KE_LIB)
    return getattr(torch.ops.kernelevolve_model, opname).default
'''

COMPILED = '''

_KE_EAGER_FORWARD = ModelNew.forward


def _kernelevolve_compiled_forward(self, *args):
    """The generated forward under torch.compile (compiled on the first call), the region kernels custom ops."""
    if len(args) != {n_inputs} or not _kernelevolve_shapes_match(args):
        return Model.forward(self, *args)
    compiled = self.__dict__.get("_ke_compiled")
    if compiled is None:
        compiled = self.__dict__["_ke_compiled"] = torch.compile(_KE_EAGER_FORWARD.__get__(self))
    return compiled(*args)


ModelNew.forward = _kernelevolve_compiled_forward
'''

HOSTS = ("eager", "compile")


def source_literal(source: str) -> str:
    """A file's text as a literal a reader can read: a raw triple-quoted string where it can be one."""
    body = source if source.endswith("\n") else source + "\n"
    if "'''" not in body and not body.rstrip("\n").endswith("\\"):
        return "r'''" + body + "'''"
    return repr(source)


def _instance_match(graph: CapturedGraph, region: Region, taken: set[fx.Node]) -> tuple[Match, int] | None:
    """The instance as a unit of the generated forward (inputs: weights then activations), or None where it
    cannot stand alone: a weight-only node it would compute is shared with another part of the graph."""
    nodes, weights, acts = region_parts(graph, region)
    inside = set(nodes)
    extra = inside - set(region.nodes)
    if inside & taken or any(u not in inside for n in extra for u in n.users):
        return None
    m = Match(family=f"region_{region.name}", nodes=nodes, inputs=weights + acts, outputs=list(region.outputs),
              spec={}, kind=region.kind)
    return m, len(weights)


def module_calls(graph: CapturedGraph, taken: set[fx.Node]) -> list[tuple[Match, str]]:
    """The calls of the model's own modules that no kernel replaced, each as one unit of the generated forward that
    calls the module itself (an expression on ``self``): the graph holds their ops in the normal form (a LayerNorm as
    its primitives), which run slower one by one than the module's own op. A call qualifies where its ops are all of
    one call of a module with no ops of a submodule under it, take one activation (its weights are the module's
    own), give one tensor that anything outside reads, write nothing in place and leave no path out and back in."""
    groups: dict[tuple[str, int], list[fx.Node]] = {}
    for n in graph.calls():
        tag = n.meta.get("custom") or {}
        if tag.get("module") and tag.get("call"):
            groups.setdefault((tag["module"], tag["call"]), []).append(n)
    parents = {path.rsplit(".", k)[0] for path, _ in groups for k in range(1, path.count(".") + 1)}
    every = len(graph.calls())
    state = set(graph.placeholders()[:len(graph.state_names)])
    out = []
    for (path, _), nodes in groups.items():
        inside = set(nodes)
        # a module that is the whole graph is the model (or a part, whose forward this file's becomes): never itself
        if path in parents or len(nodes) == every or inside & taken or not is_convex(nodes):
            continue
        if any((n.meta.get("custom") or {}).get("inplace") or not _pure(n) for n in nodes):
            continue
        ins = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes
                                 if a not in inside and a not in state and a.op != "get_attr"))
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        if len(ins) != 1 or len(outs) != 1 or not isinstance(outs[0].meta.get("val"), torch.Tensor):
            continue
        expr = "self" + "".join(f"._modules[{part!r}]" for part in path.split("."))
        out.append((Match(family="module", nodes=nodes, inputs=ins, outputs=outs, spec={"module": path}), expr))
    return out


def _pure(n: fx.Node) -> bool:
    """An op that writes none of its arguments."""
    if n.target is operator.getitem:
        return True
    schema = getattr(n.target, "_schema", None)
    return schema is not None and not schema.is_mutable


def compose(model_source: str, graph: CapturedGraph, chosen: list[Chosen], doc: str,
            dynamic: dict[int, set[int]] | None = None,
            alt: tuple[CapturedGraph, list[Region]] | None = None, host: str = "eager") -> tuple[str, list[str]]:
    """best_model.py's text, and a line for each instance left to the model's own ops (and why).

    ``dynamic`` names input dims whose sizes vary by draw (jagged totals) and ``alt`` the graph and regions of a draw
    where they differ: the guard leaves those dims free only where both draws write the same forward. The compile
    host describes each kernel's outputs by their traced shapes, which are written into the file: both draws write
    the same file only where those shapes do not move with the free dims (bags of any total, pooled to a fixed
    batch), so the same rule holds for it."""
    if host not in HOSTS:
        raise ValueError(f"host {host!r}: one of {', '.join(HOSTS)}")
    compiled = host == "compile"
    if not dynamic or alt is None:
        return _compose(model_source, graph, chosen, doc, {}, compiled)
    text, skipped = _compose(model_source, graph, chosen, doc, dynamic, compiled)
    alt_graph, alt_regions = alt
    by_index = {r.index: r for r in alt_regions}
    try:
        moved = [Chosen(c.name, [by_index[r.index] for r in c.regions], c.source, c.provenance) for c in chosen]
        other, _ = _compose(model_source, alt_graph, moved, doc, dynamic, compiled)
    except Exception as e:  # another draw's graph that cannot be written alike: the strict guard
        log.info("the second draw's graph does not compose alike: %s: %s", type(e).__name__, e)
        other = None
    if other == text:
        return text, skipped
    text, skipped = _compose(model_source, graph, chosen, doc, {}, compiled)
    skipped.append("input sizes vary by draw and the traced ops depend on them: the kernels run only at the "
                   "traced sizes, other sizes take the model's own forward")
    return text, skipped


def _compose(model_source: str, graph: CapturedGraph, chosen: list[Chosen], doc: str,
             dynamic: dict[int, set[int]], compiled: bool = False) -> tuple[str, list[str]]:
    state = dict(zip(graph.placeholders(), graph.state_names))
    matches: list[Match] = []
    launchers: dict[str, str] = {}
    taken: set[fx.Node] = set()
    skipped: list[str] = []
    modules: list[str] = []
    for c in chosen:
        _, first_weights, _ = region_parts(graph, c.regions[0])
        stand_in = {state[w]: (tuple(w.meta["val"].shape), dtype(w)) for w in first_weights}
        var, text_var = f"_KE_MODULE_{c.name.upper()}", f"_KE_SOURCE_{c.name.upper()}"
        modules.append(f"# ---- {c.name}: {c.provenance}\n{text_var} = {source_literal(c.source)}\n"
                       f"{var} = _kernelevolve_region({c.name!r}, {text_var}, {{"
                       + ", ".join(f"{k!r}: ({s!r}, {d})" for k, (s, d) in stand_in.items()) + "})")
        for k, region in enumerate(c.regions):
            found = _instance_match(graph, region, taken)
            if found is None:
                skipped.append(f"{region.name} at {region.where}: shares a weight-only op with another part")
                continue
            m, n_w = found
            taken |= set(m.nodes)
            params = [f"('w{i}', __w{i})" for i in range(n_w) if m.inputs[i].meta["val"].is_floating_point()]
            buffers = [f"('w{i}', __w{i})" for i in range(n_w) if not m.inputs[i].meta["val"].is_floating_point()]
            fn = f"_ke_{region.name}"
            modules.append(f"{fn.upper()} = _kernelevolve_instance({var})")
            n_x = len(m.inputs) - n_w
            args = ", ".join([f"__w{i}" for i in range(n_w)] + [f"__x{i}" for i in range(n_x)])
            xs = f"[{', '.join(f'__x{i}' for i in range(n_x))}]"
            head = f"def {fn}({args}):  # {region.where}: {', '.join(state[w] for w in m.inputs[:n_w])}\n"
            if compiled:
                floats = [i for i in range(n_w) if m.inputs[i].meta["val"].is_floating_point()]
                ws = floats + [i for i in range(n_w) if i not in floats]
                outs = [(tuple(o.meta["val"].shape), dtype(o)) for o in m.outputs]
                names = [f"w{i}" for i in ws]
                modules.append(f"{fn.upper()}_OP = _kernelevolve_op({region.name!r}, {fn.upper()}, "
                               f"{names[:len(floats)]!r}, {names[len(floats):]!r}, ["
                               + ", ".join(f"({s!r}, {d})" for s, d in outs) + "])")
                modules.append(head + f"    return tuple({fn.upper()}_OP([{', '.join(f'__w{i}' for i in ws)}], {xs}))")
            else:
                modules.append(head + f"    return _kernelevolve_call({fn.upper()}, [{', '.join(params)}], "
                               f"[{', '.join(buffers)}], {xs})")
            matches.append(m)
            launchers[m.key] = fn
    calls: dict[str, str] = {}
    if not compiled:  # under torch.compile the primitives fuse again; in eager they run one by one
        for m, expr in module_calls(graph, taken):
            matches.append(m)
            calls[m.key] = expr
    body = forward_body(graph, matches, launchers, calls)
    paths = [tuple(k.split(".")) for k in graph.state_names]
    text = "\n".join(body)
    prologue = [STATE_LINE.format(state_paths=paths)] if paths else []
    if "_dev" in text:
        prologue.append(DEVICE_LINE.format(state="_s" if paths else "[]"))
    cls = model_new(doc, graph, prologue, body, dynamic)
    loader = LOADER.strip("\n") + (OPS.rstrip("\n") if compiled else "")
    parts = [f'"""{doc}"""', "import torch\nimport torch.nn as nn",
             "# ---- the model, verbatim " + "-" * 86, model_source.rstrip(),
             "# ---- end of the model " + "-" * 89, loader, *modules]
    if compiled:
        cls += COMPILED.format(n_inputs=graph.n_inputs)
    return "\n\n\n".join(parts) + "\n" + cls, skipped

