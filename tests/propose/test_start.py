"""The start proposer: what of a user's kernel file is tunable, the variants it writes, and the search from it."""
from __future__ import annotations

import ast

import pytest

from kernelevolve.evaluate.result import Result, Status, Timing
from kernelevolve.propose.base import ProposalContext
from kernelevolve.propose.start import StartProposer, diff_text, read_start
from tests.factories import make_node

AUTOTUNED = '''import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64, "ROWS": 2}, num_warps=4),
                          triton.Config({"BLOCK": 256, "ROWS": 1}, num_warps=8, num_stages=3)], key=["n"])
@triton.jit
def _kernel(x_ptr, n, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    pass
'''
LAUNCHED = '''import torch
import triton
import triton.language as tl

BLOCK_SIZE = 1024
SCALE = 3


@triton.jit
def _k(x_ptr, n, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    pass


class ModelNew(torch.nn.Module):
    def forward(self, x):
        _k[(1,)](x, x.numel(), BLOCK=BLOCK_SIZE, SPLIT=4, num_warps=4, num_stages=2)
        _k[(2,)](x, SCALE, BLOCK=BLOCK_SIZE, SPLIT=SCALE)
        return x
'''


def test_an_autotune_list_becomes_knobs_and_one_seed_per_configuration():
    space = read_start(AUTOTUNED)
    knobs = {k.key: k.values for k in space.knobs}
    assert knobs["_kernel.BLOCK"][:2] == (64, 256) and 128 in knobs["_kernel.BLOCK"]
    assert knobs["_kernel.ROWS"][:2] == (2, 1)
    assert knobs["_kernel.num_warps"][:2] == (4, 8) and knobs["_kernel.num_stages"][0] == 3
    seeds = space.seeds()
    assert [label for label, _ in seeds] == ["_kernel autotune config 0", "_kernel autotune config 1"]
    second = space.render(seeds[1][1])
    ast.parse(second)
    assert "configs=[triton.Config({'BLOCK': 256, 'ROWS': 1}, num_warps=8, num_stages=3)]" in second
    assert second.replace(second[second.index("configs="):second.index(", key=")], "") == \
        AUTOTUNED.replace(AUTOTUNED[AUTOTUNED.index("configs="):AUTOTUNED.index(", key=")], "")  # nothing else


def test_launch_literals_and_the_module_constants_a_launch_passes_are_knobs():
    space = read_start(LAUNCHED)
    keys = [k.key for k in space.knobs]
    assert "BLOCK_SIZE" in keys and "SCALE" not in keys  # 3 is not a power of two: a value, not a setting
    assert any(k.endswith(".SPLIT") for k in keys) and any(k.endswith(".num_warps") for k in keys)
    assert any(k.endswith(".num_stages") for k in keys)
    genome = dict(space.default(), BLOCK_SIZE=256)
    genome[next(k for k in keys if k.endswith(".num_warps"))] = 8
    variant = space.render(genome)
    assert "BLOCK_SIZE = 256\n" in variant and "num_warps=8" in variant
    diff = diff_text(LAUNCHED, variant, "mine.py")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == 4  # two lines changed, the rest is the user's file
    assert space.render(space.default()) == LAUNCHED


def test_a_file_with_nothing_tunable_has_no_knobs():
    assert read_start("import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n").knobs == ()


def _root(source: str, ms: float | None = None):
    result = Result(Status.OK, "verified", timing=Timing.from_samples([ms], "cuda-events") if ms else None,
                    timed=ms is not None)
    return make_node(1, result, None, "start", meta={"label": "start: mine.py", "start": "mine.py"}, source=source)


def test_the_proposer_seeds_the_configurations_then_tunes_around_the_fastest(tmp_path):
    from tests.propose.test_llm import EXAMPLE
    from kernelevolve.problem import load_problem

    problem = load_problem(EXAMPLE, "cpu")
    p = StartProposer("cuda", seed=0)
    root = _root(AUTOTUNED, 2.0)
    first = p.propose(ProposalContext(problem, "cuda", None, [root]), 3)
    assert first[0].meta["label"] == "mine.py: _kernel autotune config 1"  # config 0 is the start's own default
    assert all(c.parent == 1 and c.meta["root"] == 1 and c.proposer == "start" for c in first)
    assert len({c.sha for c in first}) == 3
    # the first variants are nodes now: the second judged fastest, the others still pending
    timed = Result(Status.OK, "verified", timing=Timing.from_samples([1.0], "cuda-events"), timed=True)
    nodes = [make_node(2 + i, timed if i == 1 else None, 1, "start", meta=dict(c.meta), source=c.source)
             for i, c in enumerate(first)]
    more = p.propose(ProposalContext(problem, "cuda", None, [root, *nodes]), 4)
    assert more and all(c.sha not in {x.sha for x in first} for c in more)
    assert any(c.parent == 3 for c in more)  # the fastest is the one tuned around
    # a failed start, or none, gives nothing
    assert StartProposer("cuda").propose(ProposalContext(problem, "cuda", None, []), 3) == []


@pytest.mark.parametrize("source", [AUTOTUNED, LAUNCHED])
def test_every_variant_parses(source):
    space = read_start(source)
    for k in space.knobs:
        for v in k.values:
            ast.parse(space.render(dict(space.default(), **{k.key: v})))


def test_rewrites_land_on_the_right_bytes_whatever_the_text_around_them():
    """ast counts columns in UTF-8 bytes and ends lines only at \\n and \\r: a non-ASCII string before a literal,
    a form feed and a line separator inside a string must not shift an edit."""
    src = LAUNCHED.replace("class ModelNew", 's = "ééé \\u2028 ⚡"\n\x0c\nclass ModelNew').replace(
        "        _k[(1,)](x, x.numel()", "        t = 'ü'; _k[(1,)](x, x.numel()")
    space = read_start(src)
    warps = next(k for k in space.knobs if k.key.endswith(".num_warps"))
    variant = space.render(dict(space.default(), **{warps.key: 16, "BLOCK_SIZE": 64}))
    ast.parse(variant)
    assert "num_warps=16, num_stages=2)" in variant and "BLOCK_SIZE = 64\n" in variant
    assert variant.replace("num_warps=16", "num_warps=4").replace("BLOCK_SIZE = 64", "BLOCK_SIZE = 1024") == src


def test_configs_with_booleans_none_and_positional_settings_are_rewritten_as_python():
    src = AUTOTUNED.replace('triton.Config({"BLOCK": 64, "ROWS": 2}, num_warps=4)',
                            'triton.Config({"BLOCK": 64, "ROWS": 2, "EVEN": True, "TAIL": None}, 4, 2)')
    space = read_start(src)
    (at,) = space.autotunes
    assert at.configs[0] == {"BLOCK": 64, "ROWS": 2, "EVEN": True, "TAIL": None, "num_warps": 4, "num_stages": 2}
    first = space.render(space.seeds()[0][1])
    assert "'EVEN': True, 'TAIL': None}, num_warps=4, num_stages=2)]" in first
    compile(first, "variant.py", "exec")


def test_only_the_kernels_own_settings_are_tuned():
    src = LAUNCHED.replace("_k[(1,)](x, x.numel(), BLOCK=BLOCK_SIZE", "_k[(1,)](x, n=64, BLOCK=BLOCK_SIZE")
    src = src.replace("def _k(x_ptr, n, BLOCK", "def _k(x_ptr, n, BLOCK")
    keys = [k.key for k in read_start(src).knobs]
    assert not [k for k in keys if k.endswith(".n")]  # a runtime argument, not a setting
    keyed = AUTOTUNED.replace('key=["n"]', 'key=["n", "ROWS"]').replace(
        "    pass\n", "    pass\n\n\ndef run(x):\n    _kernel[(1,)](x, 8, ROWS=2)\n")
    assert not [k for k in read_start(keyed).knobs if "@" in k.key]  # ROWS: the autotuner's to set, and its key


def test_two_starts_take_turns_and_a_value_that_failed_is_not_tried_again():
    from tests.propose.test_llm import EXAMPLE
    from kernelevolve.problem import load_problem

    problem = load_problem(EXAMPLE, "cpu")
    a = _root(AUTOTUNED, 2.0)
    b = make_node(2, a.result, None, "start", meta={"label": "start: other.py", "start": "other.py"}, source=LAUNCHED)
    got = StartProposer("cuda", seed=0).propose(ProposalContext(problem, "cuda", None, [a, b]), 4)
    assert [c.meta["root"] for c in got] == [1, 2, 1, 2]
    space = read_start(LAUNCHED)
    bad = dict(space.default(), BLOCK_SIZE=2048)
    failed = make_node(3, Result(Status.INCORRECT, "wrong"), 2, "start", meta={"genome": bad, "root": 2},
                       source=space.render(bad))
    p = StartProposer("cuda", seed=1)
    for _ in range(5):
        for c in p.propose(ProposalContext(problem, "cuda", None, [b, failed]), 8):
            assert c.meta["genome"]["BLOCK_SIZE"] != 2048, c.meta["label"]
