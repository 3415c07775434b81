"""The ``inductor`` proposer: a search over torch.compile / Inductor configurations of the reference.

Each configuration becomes a self-contained candidate file: the problem's source, verbatim, and a ``ModelNew`` that
subclasses ``Model`` (same constructor, same state_dict) and runs its forward through ``torch.compile`` with the
chosen Inductor options. It is the floor that every other proposer has to beat.
"""
from __future__ import annotations

import random
from typing import Any

from kernelevolve.candidate import Candidate, Meta
from kernelevolve.candidate import compiled_source as render
from kernelevolve.candidate import options_key as config_key
from kernelevolve.evaluate.headtohead import COMPILE_OPTIONS
from kernelevolve.propose.base import ProposalContext

# Knobs and their values, as plain data. The first value of each is Inductor's default.
KNOBS: dict[str, list[Any]] = {
    "max_autotune": [False, True],
    "coordinate_descent_tuning": [False, True],
    "epilogue_fusion": [True, False],
    "aggressive_fusion": [False, True],
    "max_fusion_size": [64, 16, 128],
    "split_reductions": [True, False],
    "shape_padding": [True, False],
    "freezing": [False, True],
    "loop_ordering_after_fusion": [True, False],
}
CUDA_KNOBS: dict[str, list[Any]] = {
    "triton.cudagraphs": [False, True],
    "triton.max_tiles": [None, 2, 3],
    "triton.persistent_reductions": [True, False],
    "triton.prefer_nd_tiling": [False, True],
    "triton.tile_reductions": [False, True],
    "benchmark_fusion": [False, True],
    "max_autotune_pointwise": [False, True],
}
CPU_KNOBS: dict[str, list[Any]] = {
    "cpp.min_chunk_size": [512, 128, 4096],
    "cpp.dynamic_threads": [False, True],
}
# Tried first, in order: the stock modes of torch.compile expressed as options, then single strong knobs.
SEEDS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("max-autotune-no-cudagraphs", COMPILE_OPTIONS["max_autotune"]),
    ("reduce-overhead", {"triton.cudagraphs": True}),
    ("max-autotune", {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": True}),
    ("freezing", {"freezing": True}),
    ("coordinate-descent", {"coordinate_descent_tuning": True}),
    ("aggressive-fusion", {"aggressive_fusion": True, "max_fusion_size": 128}),
]


def _available(name: str) -> bool:
    try:
        import torch._inductor.config as cfg
    except ImportError:
        return False
    return name in cfg.get_config_copy()


class InductorProposer:
    name = "inductor"

    def __init__(self, device: str, seed: int | None = None):
        self.device = device
        space = dict(KNOBS, **(CUDA_KNOBS if device == "cuda" else CPU_KNOBS))
        self.space = {k: v for k, v in space.items() if _available(k)}
        self.rng = random.Random(seed)

    def _valid(self, options: dict[str, Any]) -> bool:
        return all(k in self.space for k in options)

    def _normalize(self, options: dict[str, Any]) -> dict[str, Any]:
        """Drop knobs set to Inductor's default, so equal configurations render to equal sources."""
        return {k: v for k, v in options.items() if v != self.space[k][0]}

    def _candidates(self, ctx: ProposalContext) -> list[tuple[str, dict[str, Any], int | None]]:
        learned = [("experience", e.meta["options"], None) for e in ctx.experience[:3]
                   if isinstance(e.meta.get("options"), dict) and self._valid(e.meta["options"])]
        seeds = learned + [(label, opts, None) for label, opts in SEEDS if self._valid(opts)]
        mutations: list[tuple[str, dict[str, Any], int | None]] = []
        for parent in ctx.parents:
            base = dict(parent.meta.get("options", {}))
            if parent.proposer != self.name:
                continue
            for knob, values in self.space.items():
                for value in values:
                    if base.get(knob, values[0]) != value:
                        mutations.append((f"{knob}={value}", dict(base, **{knob: value}), parent.id))
        self.rng.shuffle(mutations)
        return seeds + mutations

    def fallbacks(self, problem: Any) -> list[Candidate]:
        """torch.compile's own kernel (default options), which the run's baseline timed: a search that stops with
        its best slower than that time judges this candidate before it ends (the search loop's closing round)."""
        return [Candidate(render(problem.source, {}, "default"), proposer=self.name, language="inductor",
                          meta=Meta(label="default", options={}, baseline="compiled"))]

    def _random(self) -> dict[str, Any]:
        return {k: self.rng.choice(v) for k, v in self.space.items() if self.rng.random() < 0.3}

    def propose(self, ctx: ProposalContext, n: int) -> list[Candidate]:
        tried = {config_key(node.meta.get("options", {})) for node in ctx.history if node.proposer == self.name}
        out: list[Candidate] = []
        pool = self._candidates(ctx) + [("random", self._random(), None) for _ in range(4 * n)]
        for label, options, parent in pool:
            options = self._normalize(options)
            key = config_key(options)
            if key in tried:
                continue
            tried.add(key)
            source = render(ctx.problem.source, options, label)
            out.append(Candidate(source, proposer=self.name, language="inductor", parent=parent,
                                 meta=Meta(label=label, options=options)))
            if len(out) >= n:
                break
        return out
