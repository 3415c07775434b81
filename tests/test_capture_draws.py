"""Capture reads the inputs' shapes: a problem whose graph needs no values is traced without drawing its inputs (at
KernelBench sizes a draw on the CPU costs tens of seconds and gigabytes); they are drawn when asked for."""
import sys

import torch

from kernelevolve.analyze.graph import capture, dynamic_dims, node_values
from kernelevolve.problem import import_module_from_path, load_problem, make_inputs

DENSE = '''import torch
import torch.nn as nn

DRAWS = []


class Model(nn.Module):
    def forward(self, x, scale):
        return torch.sigmoid(x) * scale


def get_inputs():
    x = torch.randn(6, 40)
    DRAWS.append(x.device.type)
    return [x, 2.0]


def get_init_inputs():
    return []
'''

JAGGED = '''import torch
import torch.nn as nn

DRAWS = []


class Model(nn.Module):
    def forward(self, v, lengths):
        return torch.segment_reduce(v, "sum", lengths=lengths)


def get_inputs():
    lengths = torch.randint(0, 4, (5,))
    DRAWS.append(lengths.device.type)
    return [torch.randn(int(lengths.sum()), 3), lengths]


def get_init_inputs():
    return []
'''


def _draws(problem) -> list[str]:
    return [m for name, m in sys.modules.items() if name.startswith("_kernelevolve_capture_")
            and getattr(m, "__file__", None) == problem.path][0].DRAWS


def test_a_dense_problem_is_traced_from_shapes_and_drawn_when_asked(tmp_path):
    path = tmp_path / "dense.py"
    path.write_text(DENSE)
    problem = load_problem(path)
    g = capture(problem)
    assert g.mode == "fake" and g.input_meta == [((6, 40), torch.float32), 2.0]
    assert _draws(problem) == ["meta"]  # traced from the shapes: nothing drawn on the CPU
    values = node_values(g)  # draws the inputs, with the seed capture traced
    assert _draws(problem) == ["meta", "cpu"]
    ref = torch.sigmoid(make_inputs(import_module_from_path(path, "_dense_again"), 1)[0]) * 2.0
    assert torch.equal(values[g.outputs()[0]], ref)
    assert g.example[1].shape == (6, 40) and _draws(problem) == ["meta", "cpu"]  # drawn once


def test_a_problem_whose_sizes_need_values_is_drawn_for_real(tmp_path):
    path = tmp_path / "jagged.py"
    path.write_text(JAGGED)
    problem = load_problem(path)
    g = capture(problem)
    assert g.draw is None and len(g.example) == 3  # the meta device cannot draw it: drawn at capture
    assert _draws(problem) == ["meta", "cpu"]  # the meta draw stopped at int(lengths.sum())
    dims, seed = dynamic_dims(problem)
    assert dims == {0: {0}} and seed is not None
