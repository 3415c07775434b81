"""Problems whose input shapes change from draw to draw (jagged totals): the re-call and the timed input sets need
draws of one shape, and a genuine candidate must pass."""
import textwrap

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig, fresh_seed
from kernelevolve.problem import load_problem

PROBLEM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(50, 8, mode="sum")
    def forward(self, idx, offsets):
        return self.emb(idx, offsets)
def get_inputs():
    # every bag holds at least one index: a draw of empty bags has an all-zero output, which a cache cannot get wrong
    lengths = torch.randint(1, 4, (4,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return [torch.randint(0, 50, (int(lengths.sum()),)), offsets]
def get_init_inputs(): return []
"""
GENUINE = """
import torch, torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(50, 8, mode="sum")
    def forward(self, idx, offsets):
        return torch.nn.functional.embedding_bag(idx, self.emb.weight, offsets, mode="sum")
"""
CACHED = GENUINE.replace("    def forward(self, idx, offsets):\n", """    def forward(self, idx, offsets):
        key = idx.data_ptr()
        if getattr(self, "_key", None) == key:
            return self._out
        self._key = key
        self._out = self._forward(idx, offsets)
        return self._out

    def _forward(self, idx, offsets):
""")


def _evaluator(tmp_path):
    path = tmp_path / "jagged.py"
    path.write_text(textwrap.dedent(PROBLEM))
    cfg = EvalConfig(device="cpu", timeout_s=120, timing=TimingConfig(budget_ms=10, warmup_ms=2, max_reps=5))
    return Evaluator(load_problem(path), cfg, tmp_path / "work")


def test_a_genuine_candidate_passes_when_shapes_vary(tmp_path):
    r = _evaluator(tmp_path).evaluate(Candidate(textwrap.dedent(GENUINE)))
    assert r.ok and r.timed, f"{r.status.value}: {r.reason}\n{r.error[-1500:]}"


def test_caching_by_pointer_is_still_caught_when_shapes_vary(tmp_path):
    r = _evaluator(tmp_path).evaluate(Candidate(textwrap.dedent(CACHED)))
    assert r.status.value == "incorrect", f"{r.status.value}: {r.reason}"


def test_a_few_equal_draws_do_not_make_the_shapes_fixed(tmp_path, monkeypatch):
    """Jagged totals from a small range repeat by chance. Here the first three draws share their total and the fourth
    does not: the re-call seed must still have the first draw's shapes (refilling buffers of other sizes fails, or
    broadcasts into them), so three equal draws must not make the shapes count as fixed."""
    from kernelevolve.evaluate import evaluator as evaluator_module

    ev = _evaluator(tmp_path)
    totals: dict[int, list] = {}
    for seed in range(1, 400):
        totals.setdefault(str(ev._input_shapes(seed, 0, None)), []).append(seed)
    same = next(seeds for seeds in totals.values() if len(seeds) >= 3)[:3]
    other = next(seeds[0] for key, seeds in totals.items() if seeds[0] not in same and key != str(
        ev._input_shapes(same[0], 0, None)))
    planned = iter(same[1:] + [other])
    monkeypatch.setattr(evaluator_module, "fresh_seed", lambda: next(planned, None) or fresh_seed())
    again = ev._same_shapes_seed(same[0], 0, None)
    assert again is None or ev._input_shapes(again, 0, None) == ev._input_shapes(same[0], 0, None)
