"""SegmentTemplate: embedding bags and segment reductions, in every spelling, against the ATen reference."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.analyze.graph import capture, node_values, op_name  # noqa: E402
from kernelevolve.analyze.pointwise import PRELUDE, PRELUDE_IMPORTS  # noqa: E402
from kernelevolve.problem import load_problem  # noqa: E402
from kernelevolve.templates.base import FILE_HEADER, load_source  # noqa: E402
from kernelevolve.templates.segment import SegmentTemplate  # noqa: E402

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}
HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass Model(nn.Module):\n" \
       "    def __init__(self):\n        super().__init__()\n        self.w = nn.Parameter(torch.randn(50, 33))\n\n"
TAIL = "\n\ndef get_init_inputs():\n    return []\n"

IDX = "torch.randint(0, 50, (21,))"
LENGTHS = "torch.tensor([3, 0, 7, 5, 6, 0])"  # 21 indices, empty bags inside and at the end
OFFSETS = "torch.tensor([0, 3, 3, 10, 15, 21])"
# name: (forward arguments, forward body, inputs, ops the matches must hold, number of matches)
CASES = {
    # two bags of one width (a table computed in the graph, bags of other counts) pooled in one launch, a third of
    # another width alone
    "bags_grouped": ("idx, off, idx2, off2",
                     "a = F.embedding_bag(idx, self.w, off, mode='mean')\n"
                     "b = F.embedding_bag(idx2, self.w * 2.0, off2, mode='mean')\n"
                     "c = F.embedding_bag(idx, self.w[:, :16], off, mode='mean')\n"
                     "return torch.cat([a, b], 0), c",
                     f"{IDX}, {OFFSETS}, torch.randint(0, 50, (9,)), torch.tensor([0, 2, 2, 5])",
                     {"_embedding_bag_forward_only"}, 2),
    # bags of one width whose indices and offsets differ in dtype (one kernel branch a table), one table read through
    # a transposed view (rows not contiguous)
    "bags_grouped_mixed": ("idx, off, idx2, off2",
                           "a = F.embedding_bag(idx, self.w, off, mode='sum')\n"
                           "b = F.embedding_bag(idx2, self.w.t().contiguous().t(), off2, mode='sum')\n"
                           "return a, b",
                           f"{IDX}, {OFFSETS}, torch.randint(0, 50, (9,)).int(), torch.tensor([0, 2, 2, 5]).int()",
                           {"_embedding_bag_forward_only"}, 1),
    "bag_mean_relu": ("idx, off", "return torch.relu(F.embedding_bag(idx, self.w, off, mode='mean'))",
                      f"{IDX}, {OFFSETS}", {"_embedding_bag_forward_only", "relu"}, 1),
    "bag_sum_psw_last": ("idx, off, psw", "return F.embedding_bag(idx, self.w, off, mode='sum', "
                         "per_sample_weights=psw, include_last_offset=True)",
                         f"{IDX}.int(), {OFFSETS}.int(), torch.rand(21)", {"_embedding_bag_forward_only"}, 1),
    "bag_max_2d_padding": ("idx", "return F.embedding_bag(idx, self.w, mode='max', padding_idx=3)",
                           "torch.randint(0, 5, (7, 3))", {"_embedding_bag_forward_only", "arange", "view"}, 1),
    "bag_bf16_mean": ("idx, off", "return F.embedding_bag(idx, self.w.bfloat16(), off, mode='mean')",
                      f"{IDX}, {OFFSETS}", {"_embedding_bag_forward_only"}, 1),
    "index_add_lengths_mean": (
        "idx, lengths",
        "rows = self.w.index_select(0, idx)\n"
        "seg = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)\n"
        "out = torch.zeros(lengths.shape[0], 33).index_add_(0, seg, rows)\n"
        "return out / lengths.clamp(min=1).unsqueeze(1)", f"{IDX}, {LENGTHS}",
        {"index_select", "repeat_interleave", "index_put_", "clamp", "div"}, 1),
    "scatter_add_sorted_ids": (
        "idx, seg", "rows = F.embedding(idx, self.w)\n"
        "return torch.zeros(6, 33).scatter_add(0, seg.unsqueeze(1).expand(-1, 33), rows)",
        f"{IDX}, torch.sort(torch.randint(0, 5, (21,)))[0]", {"embedding", "scatter_add", "expand"}, 1),
    "index_put_unsorted_psw": (
        "idx, seg, psw",
        "return torch.zeros(6, 33).index_put_((seg,), self.w[idx] * psw.unsqueeze(1), accumulate=True)",
        f"{IDX}, torch.randint(0, 6, (21,)), torch.rand(21)", {"index", "mul", "index_put_"}, 1),
    "scatter_reduce_amax_mean": (
        "idx, seg", "z = torch.full((6, 33), 0.5)\n"
        "a = z.scatter_reduce(0, seg[:, None].expand(-1, 33), self.w[idx], 'amax', include_self=False)\n"
        "b = z.scatter_reduce(0, seg[:, None].expand(-1, 33), self.w[idx], 'mean')\n"
        "return a, b", f"{IDX}, torch.randint(0, 5, (21,))", {"scatter_reduce"}, 2),
    "segment_reduce_jagged": (
        "v, lengths, off", "return torch.segment_reduce(v, 'min', lengths=lengths) * 2.0, "
        "torch.segment_reduce(v, 'mean', offsets=off, initial=1.5)",
        f"torch.randn(21, 33), {LENGTHS}, {OFFSETS}", {"segment_reduce", "mul"}, 2),
    "fixed_mean_bf16": ("idx", "return F.embedding(idx, self.w.bfloat16()).mean(dim=1)",
                        "torch.randint(0, 50, (7, 5))", {"embedding", "sum", "div"}, 1),
    "fixed_amax_keepdim": ("idx", "return self.w[idx.view(-1)].view(7, 3, 33).amax(1, keepdim=True)",
                           "torch.randint(0, 50, (7, 3))", {"index", "amax"}, 1),
    "bag_max_epilogue": ("idx, off, bias, z",
                         "return torch.sigmoid(F.embedding_bag(idx, self.w, off, mode='max') + bias) * z",
                         f"{IDX}, {OFFSETS}, torch.randn(33), torch.randn(6, 33)", {"add", "sigmoid", "mul"}, 1),
    "searchsorted_ids_bincount_mean": (
        "indices, offsets", "rows = self.w.index_select(0, indices)\n"
        "positions = torch.arange(indices.numel(), device=indices.device)\n"
        "bag = torch.searchsorted(offsets, positions, right=True) - 1\n"
        "sums = torch.zeros(offsets.numel(), rows.shape[1], dtype=rows.dtype, device=rows.device)\n"
        "sums.index_add_(0, bag, rows)\ncounts = torch.bincount(bag, minlength=offsets.numel()).clamp(min=1)\n"
        "return sums / counts.unsqueeze(1).to(sums.dtype)", f"{IDX}, {OFFSETS}",
        {"index_select", "arange", "searchsorted", "index_put_", "bincount", "div"}, 1),
    "jagged_searchsorted_lengths_bf16": (
        "values, offsets", "positions = torch.arange(values.shape[0], device=values.device)\n"
        "segment = torch.searchsorted(offsets, positions, right=True) - 1\n"
        "sums = torch.zeros(offsets.numel() - 1, values.shape[1], dtype=torch.float32, device=values.device)\n"
        "sums.index_add_(0, segment, values.float())\nlengths = (offsets[1:] - offsets[:-1]).clamp(min=1)\n"
        "return (sums / lengths.unsqueeze(1)).to(values.dtype)",
        f"torch.randn(21, 33).bfloat16(), {OFFSETS}", {"searchsorted", "index_put_", "slice", "sub", "div"}, 1),
    "bucketize_diff_scatter": (
        "v, off", "seg = torch.bucketize(torch.arange(v.shape[0]), off, right=True) - 1\n"
        "s = torch.zeros(off.numel() - 1, 33).scatter_add(0, seg[:, None].expand(-1, 33), v)\n"
        "return s / torch.diff(off).clamp(min=1)[:, None]",
        f"torch.randn(21, 33), {OFFSETS}.int()", {"bucketize", "scatter_add", "slice", "div"}, 1),
}
WHOLE = {"searchsorted_ids_bincount_mean", "jagged_searchsorted_lengths_bf16", "bucketize_diff_scatter"}
NEGATIVE = {
    "gather_only": ("idx", "return torch.relu(F.embedding(idx, self.w))", "torch.randint(0, 50, (4, 7))"),
    "index_put_no_accumulate": ("idx, seg", "return torch.zeros(5, 33).index_put_((seg,), self.w[idx])",
                                "torch.randint(0, 50, (5,)), torch.randperm(5)"),
    "dense_sum": ("v", "return v.sum(1)", "torch.randn(4, 5, 33)"),
    "integer_counts": ("v, seg", "return torch.zeros(5, 4, dtype=torch.long).index_put_((seg,), v, accumulate=True)",
                       "torch.randint(0, 9, (6, 4)), torch.randint(0, 5, (6,))"),
}


def make(tmp_path, name: str, args: str, forward: str, inputs: str):
    body = textwrap.indent(forward, " " * 8)
    source = HEAD + f"    def forward(self, {args}):\n{body}\n\n\ndef get_inputs():\n    return [{inputs}]\n" + TAIL
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return capture(load_problem(path))


def configs(template, match):
    space = template.space(match, "cpu")
    picks = [{k: v[0] for k, v in space.items()}, {k: v[-1] for k, v in space.items()},
             {k: v[min(1, len(v) - 1)] for k, v in space.items()}]
    return [dict(c) for c in {tuple(sorted(c.items())) for c in picks}]


def run(match, config, args):
    source = FILE_HEADER + PRELUDE_IMPORTS + "\n" + PRELUDE + SegmentTemplate().render(match, config, "seg0")
    return load_source(source).seg0(*args)


def check(outs, refs):
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        atol, rtol = TOL[ref.dtype]
        torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_finds_and_matches_reference(tmp_path, name):
    args, forward, inputs, ops, count = CASES[name]
    g = make(tmp_path, name, args, forward, inputs)
    template = SegmentTemplate()
    matches = template.find(g, set())
    assert len(matches) == count
    assert ops <= {op_name(n) for m in matches for n in m.nodes}
    assert name not in WHOLE or {n for m in matches for n in m.nodes} == set(g.calls())
    values = node_values(g)
    for m in matches:
        assert m.kind == "segment_reduction"
        for config in configs(template, m):
            check(run(m, config, [values[n] for n in m.inputs]), [values[n] for n in m.outputs])


def test_bags_of_one_kind_are_pooled_in_one_launch(tmp_path):
    g = make(tmp_path, "grouped", *CASES["bags_grouped"][:3])
    matches = SegmentTemplate().find(g, set())
    group = next(m for m in matches if "group" in m.spec)
    assert len(group.spec["group"]) == 2 and len(group.outputs) == 2
    assert [len(m.spec.get("group", [m])) for m in matches] == [2, 1]
    source = SegmentTemplate().render(group, {}, "seg0")
    assert source.count("seg0_kernel[") == 1 and "tl.program_id(2)" in source


def test_a_group_reads_its_tables_from_a_layout_kept_per_set_of_tensors(tmp_path):
    g = make(tmp_path, "mixed", *CASES["bags_grouped_mixed"][:3])
    (group,) = SegmentTemplate().find(g, set())
    source = FILE_HEADER + PRELUDE_IMPORTS + "\n" + PRELUDE + SegmentTemplate().render(group, {}, "seg0")
    assert "elif t == 1:" in source and "tl.pointer_type(tl.int32)" in source  # a branch a table: dtypes differ
    mod = load_source(source)
    values = node_values(g)
    args = [values[n] for n in group.inputs]
    refs = [values[n] for n in group.outputs]
    check(mod.seg0(*args), refs)
    check(mod.seg0(*args), refs)
    assert len(mod.seg0_layouts) == 1  # the same tensors again: the same layout
    (meta, unit_d, aligned, kept, _), = mod.seg0_layouts.values()
    assert not unit_d and not aligned and not kept  # the transposed table's rows are strided, 33 wide
    fresh = [a.clone() for a in args]
    check(mod.seg0(*fresh), refs)
    assert len(mod.seg0_layouts) == 2
    alive = [[a.clone() for a in args] for _ in range(70)]  # 70 sets of tensors at addresses of their own
    for xs in alive:
        check(mod.seg0(*xs), refs)
    assert len(mod.seg0_layouts) == 64  # at most 64 layouts are kept


def test_a_bag_whose_table_is_another_bags_output_pools_after_it(tmp_path):
    g = make(tmp_path, "chained", "idx, off, idx2, off2",
             "a = F.embedding_bag(idx, self.w, off, mode='sum')\nreturn a, F.embedding_bag(idx2, a, off2, mode='sum')",
             f"{IDX}, {OFFSETS}, torch.randint(0, 6, (9,)), torch.tensor([0, 2, 2, 5])")
    matches = SegmentTemplate().find(g, set())
    assert len(matches) == 2 and not any("group" in m.spec for m in matches)
    values = node_values(g)
    for m in matches:
        check(run(m, {}, [values[n] for n in m.inputs]), [values[n] for n in m.outputs])


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_ignores_other_graphs(tmp_path, name):
    g = make(tmp_path, name, *NEGATIVE[name])
    assert SegmentTemplate().find(g, set()) == []


def test_skips_taken_nodes(tmp_path):
    g = make(tmp_path, "taken", *CASES["bag_mean_relu"][:3])
    assert SegmentTemplate().find(g, set(g.calls())) == []


def test_unsorted_ids_at_run_time(tmp_path):
    """Ids traced sorted, run in any order: the launcher sorts, it assumes no order."""
    g = make(tmp_path, "ids", *CASES["scatter_add_sorted_ids"][:3])
    (m,) = SegmentTemplate().find(g, set())
    table, idx = g.example[0][0], g.example[1]
    seg = torch.tensor([4, 0, 2, 2, 5, 0, 1, 3, 3, 4, 0, 1, 2, 5, 5, 3, 1, 0, 4, 2, 1])
    by_placeholder = dict(zip(g.placeholders(), [table, idx, seg]))
    ref = torch.zeros(6, 33).index_add_(0, seg, table[idx])
    check(run(m, {}, [by_placeholder[n] for n in m.inputs]), [ref])


@pytest.mark.parametrize("offsets", [[0, 3, 3, 10, 15, 21], [0, 0, 0, 4, 9, 9], [0, 5, 21, 21, 21, 21],
                                     [0, 2, 4, 6, 8, 10], [0, 0, 0, 0, 0, 0]])
def test_offset_built_ids_at_run_time(tmp_path, offsets):
    """Ids built from offsets are the offsets: empty bags anywhere, the last bag running to the end of the indices,
    means that divide by the bag's count (clamped to 1) as bincount gives it."""
    g = make(tmp_path, "offsets", *CASES["searchsorted_ids_bincount_mean"][:3])
    (m,) = SegmentTemplate().find(g, set())
    assert m.spec["bags"] == "offsets" and not m.spec["include_last"]
    table, idx, off = g.example[0][0], g.example[1], torch.tensor(offsets)
    by_placeholder = dict(zip(g.placeholders(), [table, idx, off]))
    bag = torch.searchsorted(off, torch.arange(21), right=True) - 1
    counts = torch.bincount(bag, minlength=6).clamp(min=1)
    ref = torch.zeros(6, 33).index_add_(0, bag, table[idx]) / counts.unsqueeze(1).float()
    check(run(m, {}, [by_placeholder[n] for n in m.inputs]), [ref])


def test_jagged_offsets_at_run_time(tmp_path):
    g = make(tmp_path, "jagged", *CASES["jagged_searchsorted_lengths_bf16"][:3])
    (m,) = SegmentTemplate().find(g, set())
    assert m.spec["bags"] == "offsets" and m.spec["include_last"] and m.spec["counts"]
    values, off = g.example[1], torch.tensor([0, 0, 7, 7, 20, 21])
    seg = torch.searchsorted(off, torch.arange(21), right=True) - 1
    sums = torch.zeros(5, 33).index_add_(0, seg, values.float())
    ref = (sums / (off[1:] - off[:-1]).clamp(min=1).unsqueeze(1)).to(values.dtype)
    by_placeholder = dict(zip(g.placeholders(), [g.example[0][0], values, off]))
    check(run(m, {"BLOCK_L": 8}, [by_placeholder[n] for n in m.inputs]), [ref])


def test_counts_used_elsewhere_stay_outside(tmp_path):
    """The bag counts are also a result: the pooling is still claimed, the counts stay with ATen."""
    g = make(tmp_path, "counts_out", "v, off", "seg = torch.searchsorted(off, torch.arange(21), right=True) - 1\n"
             "n = torch.bincount(seg, minlength=6)\nreturn torch.zeros(6, 33).index_add_(0, seg, v) / n[:, None], n",
             f"torch.randn(21, 33), {OFFSETS}")
    (m,) = SegmentTemplate().find(g, set())
    assert "bincount" not in {op_name(n) for n in m.nodes}
    values = node_values(g)
    check(run(m, {}, [values[n] for n in m.inputs]), [values[n] for n in m.outputs])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_matches_reference(tmp_path, name):
    g = make(tmp_path, name, *CASES[name][:3])
    template = SegmentTemplate()
    values = node_values(g)
    for m in template.find(g, set()):
        args = [values[n].cuda() for n in m.inputs]
        for config in configs(template, m):
            check([o.cpu() for o in run(m, config, args)], [values[n] for n in m.outputs])


ENDS_FORWARD = "seg = torch.searchsorted({ends}, torch.arange(21), right=True)\n" \
               "return torch.zeros(6, 33).index_add_(0, seg, v)"


@pytest.mark.parametrize("offsets", [[4, 6, 6, 12, 18, 21, 25], [0, 3, 3, 10, 15, 21, 21], [9, 9, 9, 9, 9, 9, 40]])
def test_search_among_the_ends_starts_the_first_bag_at_row_0(tmp_path, offsets):
    """``searchsorted(offsets[1:], arange(N), right=True)`` puts every row before the first end in bag 0, whatever
    the first offset, and no row past N in any bag."""
    g = make(tmp_path, "ends", "v, off", ENDS_FORWARD.format(ends="off[1:]"),
             "torch.randn(21, 33), torch.tensor([0, 3, 3, 10, 15, 21, 21])")
    (m,) = SegmentTemplate().find(g, set())
    assert m.spec["bags"] == "offsets" and m.spec["from_zero"]
    v, off = g.example[1], torch.tensor(offsets)
    seg = torch.searchsorted(off[1:], torch.arange(21), right=True)
    ref = torch.zeros(6, 33).index_add_(0, seg, v)
    by_placeholder = dict(zip(g.placeholders(), [g.example[0][0], v, off]))
    for config in ({"BLOCK_L": 8}, {}):
        check(run(m, config, [by_placeholder[n] for n in m.inputs]), [ref])


@pytest.mark.parametrize("lengths", [[3, 0, 7, 5, 6, 0], [3, 0, 7, 5, 6, 9], [30, 1, 0, 2, 0, 4]])
def test_search_among_cumulated_lengths_stops_at_row_n(tmp_path, lengths):
    """Bags from ``searchsorted(cumsum(lengths), arange(N), right=True)`` whose lengths run past N end at N."""
    g = make(tmp_path, "cum", "v, lengths", ENDS_FORWARD.format(ends="torch.cumsum(lengths, 0)"),
             f"torch.randn(21, 33), {LENGTHS}")
    (m,) = SegmentTemplate().find(g, set())
    assert m.spec["bags"] == "lengths"
    v, lens = g.example[1], torch.tensor(lengths)
    seg = torch.searchsorted(torch.cumsum(lens, 0), torch.arange(21), right=True)
    ref = torch.zeros(6, 33).index_add_(0, seg, v)
    by_placeholder = dict(zip(g.placeholders(), [g.example[0][0], v, lens]))
    for config in ({"BLOCK_L": 8}, {}):
        check(run(m, config, [by_placeholder[n] for n in m.inputs]), [ref])
