"""Assemble a candidate file from a captured graph and rendered matches.

The file holds the problem's source verbatim (so ``ModelNew`` subclasses ``Model`` and shares its constructor and
state_dict), the pointwise prelude, every rendered kernel and a generated ``forward``: matched regions call their
launchers, every other node runs as the ATen op it was traced as. Inputs whose shapes or dtypes differ from the traced
ones take the reference path, so the kernels only ever see the shapes they were generated for.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS, float_literal
from kernelevolve.frames import fill
from kernelevolve.templates.base import FILE_HEADER, Match, TemplateError

MAX_EMBEDDED_CONST = 65536  # elements; larger traced constants make the graph unfit for a self-contained file


def _const(v: Any) -> str:
    if isinstance(v, fx.Node):
        raise TemplateError("node passed as a constant")
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        return float_literal(v)
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return "_dev"
    if isinstance(v, torch.layout):
        return str(v)
    if isinstance(v, torch.memory_format):
        return str(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_const(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    raise TemplateError(f"cannot write the constant {v!r} into a candidate")


class Namer:
    def __init__(self) -> None:
        self.names: dict[fx.Node, str] = {}

    def __call__(self, node: fx.Node) -> str:
        return self.names[node]

    def value(self, a: Any) -> str:
        if isinstance(a, fx.Node):
            return self.names[a]
        if isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
            inner = ", ".join(self.value(x) for x in a)
            return f"[{inner}]"
        return _const(a)


def _units(graph: CapturedGraph, matches: list[Match]) -> list[Any]:
    """Matches and loose nodes in an order that respects every dependency (Kahn's algorithm over units)."""
    owner: dict[fx.Node, Match] = {}
    for m in matches:
        for n in m.nodes:
            if n in owner:
                raise TemplateError(f"node {n.name} claimed twice")
            owner[n] = m
    order = list(graph.graph.nodes)
    unit_of = {n: owner.get(n, n) for n in order}
    deps: dict[Any, set[Any]] = {}
    for n in order:
        u = unit_of[n]
        deps.setdefault(u, set())
        for a in n.all_input_nodes:
            if unit_of[a] is not u:
                deps[u].add(unit_of[a])
    done: set[int] = set()
    out: list[Any] = []
    pending = list(dict.fromkeys(unit_of[n] for n in order))
    while pending:
        ready = next((u for u in pending if all(id(d) in done for d in deps[u])), None)
        if ready is None:
            raise TemplateError("the matches form a cycle")
        pending.remove(ready)
        done.add(id(ready))
        out.append(ready)
    return out


_COPIES = (torch.ops.aten.copy_.default, torch.ops.aten.copy.default)


def _tensor_const(t: torch.Tensor) -> str:
    if t.numel() > MAX_EMBEDDED_CONST:
        raise TemplateError(f"a traced constant of {t.numel()} elements is too large to embed")
    return f"torch.tensor({t.tolist()!r}, dtype={t.dtype}, device=_dev)"


def node_line(gm: fx.GraphModule, n: fx.Node, name: "Namer") -> str:
    """One statement that computes ``n`` as the ATen op it was traced as, into ``name(n)``, reading its arguments by
    ``name``; a traced constant is embedded."""
    var = name(n)
    if n.op == "get_attr":
        t = getattr(gm, n.target)
        if n.users and all(u.target in _COPIES and u.args[0] is n for u in n.users):
            # only ever copied into (a model's plain tensor attribute it overwrites, as a stateful RNN does): its
            # values are never read, so any tensor of its shape and dtype will do, however large
            return f"{var} = torch.empty({list(t.shape)!r}, dtype={t.dtype}, device=_dev)"
        return f"{var} = {_tensor_const(t)}"
    if n.target is operator.getitem:
        return f"{var} = {name.value(n.args[0])}[{n.args[1]}]"
    if isinstance(n.target, torch._ops.OpOverload):
        args = [name.value(a) for a in n.args]
        args += [f"{k}={name.value(v)}" for k, v in n.kwargs.items()]
        return (f"{var} = torch.ops.{n.target.namespace}.{n.target._schema.name.split('::')[-1]}"
                f".{n.target._overloadname}({', '.join(args)})")
    raise TemplateError(f"cannot write the call {n.target}")


def forward_body(graph: CapturedGraph, matches: list[Match], launchers: dict[str, str],
                 calls: dict[str, str] | None = None) -> list[str]:
    """Statements of the generated forward; ``launchers`` maps a match key to its launcher name, ``calls`` a match
    key to a callable of one output (a module of the model's own, which returns its tensor rather than a tuple)."""
    name = Namer()
    lines: list[str] = []
    placeholders = graph.placeholders()
    n_state = len(graph.state_names)
    for i, p in enumerate(placeholders):
        name.names[p] = f"_s[{i}]" if i < n_state else f"args[{i - n_state}]"
    for unit in _units(graph, matches):
        if isinstance(unit, Match):
            outs = [f"v_{n.name}" for n in unit.outputs]
            for n, o in zip(unit.outputs, outs):
                name.names[n] = o
            ins = ", ".join(name(n) for n in unit.inputs)
            if calls and unit.key in calls:
                lines.append(f"{outs[0]} = {calls[unit.key]}({ins})")
                continue
            lines.append(f"{', '.join(outs)}, = {launchers[unit.key]}({ins})")
            continue
        n = unit
        if n.op in ("placeholder", "output"):
            continue
        name.names[n] = f"v_{n.name}"
        lines.append(node_line(graph.gm, n, name))
    outs = [name.value(o) for o in graph.outputs()]
    spec = getattr(graph.gm, "_out_spec", None)
    single = spec is not None and spec.num_leaves == 1 and spec.is_leaf()
    lines.append(f"return {outs[0]}" if single else f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return lines


def guard_source(graph: CapturedGraph, dynamic: dict[int, set[int]]) -> list[str]:
    checks = []
    for i, m in enumerate(graph.input_meta):
        if isinstance(m, tuple) and len(m) == 2 and isinstance(m[1], torch.dtype):
            free = dynamic.get(i, set())
            if free:  # sizes the kernels read at run time are left free
                fixed = [d for d in range(len(m[0])) if d not in free]
                checks.append(f"args[{i}].dim() == {len(m[0])} and args[{i}].dtype == {m[1]}")
                if fixed:
                    checks.append(f"tuple(args[{i}].shape[d] for d in {tuple(fixed)!r}) == "
                                  f"{tuple(m[0][d] for d in fixed)!r}")
                continue
            checks.append(f"tuple(args[{i}].shape) == {tuple(m[0])!r} and args[{i}].dtype == {m[1]}")
        else:
            checks.append(f"args[{i}] == {_const(m)}")
    return checks or ["True"]


# The forward's first lines, each written only where the body reads what it defines: every line runs on every call,
# and a call's Python is part of its time.
STATE_LINE = "_s = [_kernelevolve_state(self, *path) for path in {state_paths!r}]"
DEVICE_LINE = ("_dev = next((a.device for a in list(args) + {state} if isinstance(a, torch.Tensor)), "
               "torch.device(\"cpu\"))")


def model_new(doc: str, graph: CapturedGraph, prologue: list[str], body: list[str], dynamic: dict[int, set[int]]) -> str:
    """The ModelNew class of a candidate file (frames/candidate_class.py.tmpl): ``body`` under the shape guard, the
    reference's forward where the guard fails."""
    return fill("candidate_class.py.tmpl", doc=doc.splitlines()[0], n_inputs=graph.n_inputs,
                prologue="".join(f"        {line}\n" for line in prologue),
                body="\n".join("        " + line for line in body),
                guards="\n            and ".join(guard_source(graph, dynamic)))


def assemble(problem_source: str, graph: CapturedGraph, matches: list[Match], kernels: list[tuple[Match, str, str]],
             doc: str, dynamic: dict[int, set[int]] | None = None) -> str:
    """The candidate file. ``kernels`` holds (match, launcher name, rendered source) for every match; ``dynamic``
    names input dims the guard leaves free (the caller vouches that the code does not depend on them)."""
    launchers = {m.key: launcher for m, launcher, _ in kernels}
    body = forward_body(graph, matches, launchers)
    parts = [f'"""{doc}"""', FILE_HEADER + PRELUDE_IMPORTS, PRELUDE.strip("\n")]
    parts += [src.strip("\n") for _, _, src in kernels]
    parts.append("# ---- the reference, verbatim from the problem file " + "-" * 60)
    parts.append(problem_source.rstrip())
    parts.append("# ---- end of reference " + "-" * 89)
    paths = [tuple(k.split(".")) for k in graph.state_names]  # split once here, not on every call
    text = "\n".join(body)
    prologue = [STATE_LINE.format(state_paths=paths)] if paths else []
    if "_dev" in text:
        prologue.append(DEVICE_LINE.format(state="_s" if paths else "[]"))
    cls = model_new(doc, graph, prologue, body, dynamic or {})
    return "\n\n\n".join(parts) + "\n" + cls
