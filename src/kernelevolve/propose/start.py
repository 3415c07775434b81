"""The ``start`` proposer: variants of the kernels a user started the run from (``optimize --start FILE``).

A start file's tunable settings are read from its source, never run: the configurations of each
``@triton.autotune(configs=[triton.Config(...), ...])`` list, and the literal launch settings of its own Triton
kernels (``kernel[grid](..., BLOCK=256, num_warps=4)``, or a module-level ``BLOCK = 256`` that a launch passes). Each
becomes a knob whose values are the start's own first, then the other values its autotune list names, then powers of
two around them; num_warps and num_stages take their usual ranges. A variant is the start file with those literals
rewritten (an autotune list becomes the one configuration chosen), so it stays self-contained and reads as the
user's file: its diff against the start is the tuning. The search is the template proposer's: each autotune
configuration on its own first, then one knob at a time around the fastest, then mutations.
"""
from __future__ import annotations

import ast
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from kernelevolve.candidate import Candidate, Meta, diff_text
from kernelevolve.propose.base import ProposalContext
from kernelevolve.rows import Node

log = logging.getLogger(__name__)

NAME = "start"
WARPS = [1, 2, 4, 8, 16]
STAGES = [1, 2, 3, 4, 5]
MAX_POW2 = 1 << 14
NEIGHBOURS = 8  # one-knob variants of the fastest node per ask, at most, before mutations


class StartFileError(Exception):
    """A start file that is no candidate at all (it does not parse)."""


@dataclass(frozen=True)
class Knob:
    key: str  # "<kernel or site>.<name>": what the label shows
    values: tuple[Any, ...]  # the start's own value first
    span: tuple[int, int] | None  # where its literal sits in the source (None: inside an autotune list)


@dataclass(frozen=True)
class Autotune:
    kernel: str
    span: tuple[int, int]  # the configs list's text (byte offsets)
    names: tuple[str, ...]  # the keyword arguments of its triton.Config dicts, then num_warps and num_stages
    configs: tuple[dict[str, Any], ...]  # each configuration, by those names
    keys: tuple[str, ...] = ()  # the arguments the autotuner keys on (shapes: never tuned)


@dataclass(frozen=True)
class StartSpace:
    """What of a start file can be tuned, and how to write a variant of it."""

    source: str
    knobs: tuple[Knob, ...]
    autotunes: tuple[Autotune, ...] = field(default_factory=tuple)

    def default(self) -> dict[str, Any]:
        return {k.key: k.values[0] for k in self.knobs}

    def seeds(self) -> list[tuple[str, dict[str, Any]]]:
        """Each autotune configuration on its own (the start runs the best of them at its first call)."""
        out = []
        for at in self.autotunes:
            for i, cfg in enumerate(at.configs):
                genome = dict(self.default(), **{f"{at.kernel}.{n}": v for n, v in cfg.items()})
                out.append((f"{at.kernel} autotune config {i}", genome))
        return out

    def describe(self) -> str:
        """What is tunable, in a few words (or that nothing is)."""
        if not self.knobs:
            return ("nothing to tune: no literal @triton.autotune list, and no power-of-two constexpr or "
                    "num_warps/num_stages literal in a launch of its own kernels")
        return f"{len(self.knobs)} knob(s): " + ", ".join(k.key for k in self.knobs)

    def render(self, genome: dict[str, Any]) -> str:
        edits = [(k.span, repr(genome.get(k.key, k.values[0]))) for k in self.knobs if k.span is not None]
        for at in self.autotunes:
            values = {n: genome.get(f"{at.kernel}.{n}") for n in at.names}
            meta = ", ".join(f"{n!r}: {v!r}" for n, v in values.items() if n not in ("num_warps", "num_stages"))
            extra = "".join(f", {n}={values[n]!r}" for n in ("num_warps", "num_stages") if values.get(n) is not None)
            edits.append((at.span, f"[triton.Config({{{meta}}}{extra})]"))
        # ast's columns count UTF-8 bytes: the edits are made on the encoded text
        text = self.source.encode()
        for (start, end), new in sorted(edits, key=lambda e: -e[0][0]):
            text = text[:start] + new.encode() + text[end:]
        return text.decode()


def _line_offsets(source: str) -> list[int]:
    """The byte offset each line starts at, lines as ast counts them (only \\n, \\r and \\r\\n end one)."""
    out, at = [0], 0
    for line in source.encode().splitlines(keepends=True):
        at += len(line)
        out.append(at)
    return out


def _span(node: ast.AST, offsets: list[int]) -> tuple[int, int]:
    return (offsets[node.lineno - 1] + node.col_offset, offsets[node.end_lineno - 1] + node.end_col_offset)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _pow2_values(v: int) -> tuple[int, ...]:
    around = [v * 2, v // 2, v * 4, v // 4]
    return (v, *(x for x in around if 1 <= x <= MAX_POW2))


def _is_pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def _values(name: str, own: Any, named: list[Any]) -> tuple[Any, ...]:
    pool = list(named)
    if name == "num_warps":
        pool += WARPS
    elif name == "num_stages":
        pool += STAGES
    elif _is_pow2(own):
        pool += list(_pow2_values(own))
    return tuple(dict.fromkeys([own, *pool]))


def read_start(source: str) -> StartSpace:
    """The tunable settings of a start file (see the module's doc); raises StartFileError if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise StartFileError(f"does not parse: line {e.lineno}: {e.msg}") from None
    offsets = _line_offsets(source)
    constexprs: dict[str, set[str]] = {}  # kernel name -> its tl.constexpr parameters
    autotunes, knobs = [], []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        decos = {_dotted(d.func if isinstance(d, ast.Call) else d): d for d in fn.decorator_list}
        if not {"triton.jit", "jit"} & set(decos):
            continue
        constexprs[fn.name] = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                               if a.annotation is not None and _dotted(a.annotation).endswith("constexpr")}
        deco = decos.get("triton.autotune") or decos.get("autotune")
        at = _autotune(fn.name, deco, offsets) if isinstance(deco, ast.Call) else None
        if at is not None:
            autotunes.append(at)
            for i, name in enumerate(at.names):
                named = [c[name] for c in at.configs if c.get(name) is not None]
                if named:
                    knobs.append(Knob(f"{fn.name}.{name}", _values(name, named[0], named[1:]), None))
    module_ints = {}  # NAME = 256 (or NAME: int = 256) at module level: a constant a launch may pass
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if isinstance(getattr(node, "value", None), ast.Constant) and _is_pow2(node.value.value):
            module_ints.update({t.id: node.value for t in targets if isinstance(t, ast.Name)})
    seen_consts: set[str] = set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        if not (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in constexprs):
            continue
        kernel = func.value.id
        at = next((a for a in autotunes if a.kernel == kernel), None)
        # tunable: a constexpr the autotuner does not set and does not key on, and the launch's warps and stages
        settable = (constexprs[kernel] | ({"num_warps", "num_stages"} if at is None else set())) - set(
            at.names + at.keys if at is not None else ())
        for kw in call.keywords:
            if kw.arg not in settable:
                continue
            if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, int) and \
                    not isinstance(kw.value.value, bool) and (_is_pow2(kw.value.value) or kw.arg == "num_stages"):
                knobs.append(Knob(f"{kernel}@{call.lineno}.{kw.arg}", _values(kw.arg, kw.value.value, []),
                                  _span(kw.value, offsets)))
            elif isinstance(kw.value, ast.Name) and kw.value.id in module_ints and kw.value.id not in seen_consts:
                seen_consts.add(kw.value.id)
                const = module_ints[kw.value.id]
                knobs.append(Knob(kw.value.id, _values(kw.arg, const.value, []), _span(const, offsets)))
    return StartSpace(source, tuple(knobs), tuple(autotunes))


def _autotune(kernel: str, deco: ast.Call, offsets: list[int]) -> Autotune | None:
    """The literal configs list of ``@triton.autotune(configs=[triton.Config({...}, num_warps=.., ...), ...])``."""
    arg = next((kw.value for kw in deco.keywords if kw.arg == "configs"), deco.args[0] if deco.args else None)
    key = next((kw.value for kw in deco.keywords if kw.arg == "key"), deco.args[1] if len(deco.args) > 1 else None)
    if not isinstance(arg, ast.List) or not arg.elts:
        return None  # built by code (a comprehension, a helper): not rewritten
    configs: list[dict[str, Any]] = []
    for c in arg.elts:
        if not (isinstance(c, ast.Call) and _dotted(c.func) in ("triton.Config", "Config")):
            return None
        try:
            cfg = dict(ast.literal_eval(c.args[0])) if c.args else {}
            if len(c.args) > 3:
                return None  # num_ctas or maxnreg given: a setting this rewrite would drop
            cfg.update(zip(("num_warps", "num_stages"), (ast.literal_eval(a) for a in c.args[1:])))
            for kw in c.keywords:
                if kw.arg == "kwargs":
                    cfg.update(ast.literal_eval(kw.value))
                elif kw.arg in ("num_warps", "num_stages"):
                    cfg[kw.arg] = ast.literal_eval(kw.value)
                else:
                    return None  # a pre_hook or another setting this rewrite would drop
        except (ValueError, TypeError, SyntaxError):
            return None
        configs.append(cfg)
    names = tuple(dict.fromkeys(n for c in configs for n in c if n not in ("num_warps", "num_stages")))
    names += tuple(n for n in ("num_warps", "num_stages") if any(n in c for c in configs))
    try:
        keys = tuple(str(k) for k in ast.literal_eval(key)) if key is not None else ()
    except (ValueError, TypeError, SyntaxError):
        keys = ()
    return Autotune(kernel, _span(arg, offsets), names, tuple(configs), keys)


def _key(genome: dict[str, Any]) -> str:
    return json.dumps(genome, sort_keys=True, default=str)


class StartProposer:
    """Tunes each verified start kernel of the run (its nodes of proposer ``start`` with ``meta['start']``), the
    starts taking turns, so that every start file gets its share of each ask."""

    name = NAME
    weight = 3  # like a template family: a variant compiles in seconds

    def __init__(self, device: str, seed: int | None = None):
        self.device = device
        self.rng = random.Random(seed)
        self._spaces: dict[str, StartSpace] = {}

    def space(self, root: Node) -> StartSpace:
        if root.sha not in self._spaces:
            try:
                space = read_start(root.source)
            except StartFileError as e:  # the judge verified it, so this is our reader's limit: nothing to tune
                space = StartSpace(root.source, ())
                log.warning("start kernel %s: %s", root.meta.get("start"), e)
            log.warning("start kernel %s: %s", root.meta.get("start"), space.describe())
            self._spaces[root.sha] = space
        return self._spaces[root.sha]

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        roots = [node for node in ctx.history if node.proposer == NAME and node.meta.get("start") and node.ok
                 and not node.meta.get("reused")]
        pools = [self._pool(root, ctx.history, n) for root in roots]
        out: list[Candidate] = []
        while len(out) < n and any(pools):  # the starts take turns
            for pool in pools:
                if pool and len(out) < n:
                    out.append(pool.pop(0))
        return out

    def _pool(self, root: Node, history: list[Node], n: int) -> list[Candidate]:
        """Up to ``n`` new variants of one start: its configurations, then the fastest variant's neighbours, then
        mutations; values whose one-knob variant failed the screen or the judge are not tried again."""
        space = self.space(root)
        if not space.knobs:
            return []
        mine = [node for node in history if node.proposer == NAME and node.meta.get("root") == root.id]
        tried = {_key(node.meta["genome"]) for node in mine} | {_key(space.default())}
        banned = _failed_values(space, mine)
        pool = [(label, g, root.id) for label, g in space.seeds()]
        best = _fastest([root, *mine])
        if best is not None:
            base = best.meta.get("genome") or space.default()
            pool += [(lbl, g, best.id) for lbl, g in self._neighbours(space, base, banned)][:NEIGHBOURS]
            pool += [(*self._mutate(space, base, banned), best.id) for _ in range(4 * n)]
        out = []
        for label, genome, parent in pool:
            if len(out) >= n or _key(genome) in tried:
                continue
            tried.add(_key(genome))
            meta = Meta(label=f"{root.meta['start']}: {label}", genome=genome)
            meta["root"] = root.id
            out.append(Candidate(space.render(genome), proposer=NAME, parent=parent, meta=meta))
        return out

    def _neighbours(self, space: StartSpace, genome: dict[str, Any],
                    banned: set[tuple[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        out = [(f"{k.key}={v}", dict(genome, **{k.key: v})) for k in space.knobs for v in k.values
               if v != genome.get(k.key) and (k.key, v) not in banned]
        self.rng.shuffle(out)
        return out

    def _mutate(self, space: StartSpace, genome: dict[str, Any],
                banned: set[tuple[str, Any]]) -> tuple[str, dict[str, Any]]:
        changed = dict(genome)
        picks = self.rng.sample(space.knobs, min(len(space.knobs), self.rng.choice([1, 2])))
        for k in picks:
            allowed = [v for v in k.values if (k.key, v) not in banned] or [k.values[0]]
            changed[k.key] = self.rng.choice(allowed)
        return ", ".join(f"{k.key}={changed[k.key]}" for k in picks), changed


def _failed_values(space: StartSpace, nodes: list[Node]) -> set[tuple[str, Any]]:
    """(knob, value) pairs whose variant, one knob away from the start, failed the screen's check or the judge."""
    default, out = space.default(), set()
    for node in nodes:
        failed = (node.result is not None and not node.result.ok) or (
            node.result is None and node.screen is not None and not node.screen.ok and not node.screen.harness)
        changed = [(k, v) for k, v in (node.meta.get("genome") or {}).items() if default.get(k) != v]
        if failed and len(changed) == 1:
            out.add(changed[0])
    return out


def _fastest(nodes: list[Node]) -> Node | None:
    """The fastest verified node by the judge (or the screen where the judge has not timed), else the first
    verified one (untimed: the CPU interpreter)."""
    def ms(node: Node) -> float | None:
        if node.runtime_ms is not None:
            return node.runtime_ms
        return node.screen.ms if node.result is None and node.screen is not None and node.screen.ok else None

    timed = [node for node in nodes if ms(node) is not None]
    if timed:
        return min(timed, key=ms)
    return next((node for node in nodes if node.ok), None)


__all__ = ["NAME", "StartFileError", "StartProposer", "StartSpace", "diff_text", "read_start"]
