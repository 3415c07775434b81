"""load_problem: a good problem's fields, and one test per bad problem file (the CLI tests reuse BAD)."""
import hashlib
import textwrap
from pathlib import Path

import pytest

from kernelevolve.problem import ProblemError, load_problem

GOOD = '''
import torch
import torch.nn as nn

ATOL = 1e-3
RTOL = "0.01"
ALLOW_TF32 = True


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        y = self.fc(x)
        return y, y.argmax(dim=-1)


def get_inputs():
    return [torch.randn(4, 8)]


def get_extra_inputs():
    return [[torch.randn(1, 8)], [torch.randn(7, 8)]]


def get_init_inputs():
    return [8]
'''

INPLACE = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
'''

# Inputs with NaN that the reference does not touch: NaN != NaN must not read as an in-place mutation.
NAN_INPUT = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.nan_to_num(x)


def get_inputs():
    return [torch.tensor([1.0, float("nan"), 3.0])]


def get_init_inputs():
    return []
'''


def _variant(model: str = "", inputs: str = "", init: str = "", head: str = "") -> str:
    model = model or '''
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2
'''
    inputs = inputs or "def get_inputs():\n    return [torch.randn(4)]\n"
    init = init or "def get_init_inputs():\n    return []\n"
    return f"import torch\n{head}\n{model}\n\n{inputs}\n\n{init}\n"


_NO_INPUTS = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n"

# case id -> (source or None for a missing file, a fragment the one-line error must contain)
BAD: dict[str, tuple[str | None, str]] = {
    "missing_file": (None, "no such file"),
    "syntax_error": ("import torch\nclass Model(torch.nn.Module)\n    pass\n", "syntax error"),
    "import_raises": (_variant(head="raise RuntimeError('boom at import')"), "boom at import"),
    "no_model": (_variant(model="class Other(torch.nn.Module):\n    pass\n"), "Model"),
    "model_not_module": (_variant(model="class Model:\n    def forward(self, x):\n        return x\n"),
                         "not a subclass of torch.nn.Module"),
    "no_get_inputs": (_NO_INPUTS + "def get_init_inputs():\n    return []\n", "get_inputs"),
    "no_get_init_inputs": (_NO_INPUTS + "def get_inputs():\n    return [torch.randn(4)]\n", "get_init_inputs"),
    "get_inputs_raises": (_variant(inputs="def get_inputs():\n    raise ValueError('no inputs today')\n"),
                          "no inputs today"),
    "get_init_inputs_raises": (_variant(init="def get_init_inputs():\n    raise KeyError('init broke')\n"),
                               "init broke"),
    "forward_raises": (_variant(model="class Model(torch.nn.Module):\n    def forward(self, x):\n"
                                      "        raise RuntimeError('forward exploded')\n"), "forward exploded"),
    "returns_float": (_variant(model="class Model(torch.nn.Module):\n    def forward(self, x):\n"
                                     "        return float(x.sum())\n"), "non-tensor output (float)"),
    "returns_list_with_str": (_variant(model="class Model(torch.nn.Module):\n    def forward(self, x):\n"
                                             "        return [x, 'done']\n"), "non-tensor output (str)"),
    "atol_not_a_number": (_variant(head="ATOL = 'tight'"), "ATOL must be a number"),
}


def write_bad(tmp_path: Path, case: str) -> Path:
    source, _ = BAD[case]
    path = tmp_path / f"bad_{case}.py"
    if source is not None:
        path.write_text(source)
    return path


def test_good_problem(tmp_path):
    path = tmp_path / "good_linear.py"
    path.write_text(GOOD)
    p = load_problem(path)
    assert p.sha == hashlib.sha256(GOOD.encode()).hexdigest()
    assert p.short_sha == p.sha[:12]
    assert p.name == "good_linear"
    assert p.path == str(path.resolve())
    assert p.source == GOOD
    assert p.n_shapes == 3
    assert p.atol == 1e-3 and p.rtol == 0.01
    assert p.allow_tf32 is True
    assert p.mutates_inputs is False
    assert p.output_dtypes == ("float32", "int64")


def test_defaults_without_extensions(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(_variant())
    p = load_problem(path)
    assert (p.atol, p.rtol, p.allow_tf32, p.n_shapes, p.mutates_inputs) == (None, None, False, 1, False)
    assert p.output_dtypes == ("float32",)


def test_inplace_reference_is_detected(tmp_path):
    path = tmp_path / "inplace.py"
    path.write_text(INPLACE)
    assert load_problem(path).mutates_inputs is True


def test_nan_input_is_not_a_mutation(tmp_path):
    path = tmp_path / "nan_input.py"
    path.write_text(NAN_INPUT)
    assert load_problem(path).mutates_inputs is False


def test_example_problem_loads():
    p = load_problem(Path(__file__).parents[1] / "examples" / "gelu_mlp.py")
    assert p.name == "gelu_mlp" and p.output_dtypes == ("float32",) and p.n_shapes == 1


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_problem_raises_one_line(tmp_path, case):
    path = write_bad(tmp_path, case)
    with pytest.raises(ProblemError) as info:
        load_problem(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert BAD[case][1] in msg
    assert info.value.path == str(path)


def test_bad_cases_are_otherwise_valid(tmp_path):
    """Each bad file is the one-fault variant of a valid file: the template itself loads."""
    path = tmp_path / "template.py"
    path.write_text(textwrap.dedent(_variant()))
    assert load_problem(path).name == "template"


ROUNDED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4).to(torch.bfloat16))

    def forward(self, idx, x):
        gathered = self.table[idx].float() * 2 + 1  # a gather then a cast up: nothing rounded to bfloat16
        summed = (x.to(torch.bfloat16) * 3).sum(-1).float()  # bfloat16 arithmetic, read as float32
        return gathered, summed, x.sum(-1), (x.half() * 2).half()


def get_inputs():
    return [torch.randint(0, 10, (5,)), torch.randn(5, 7)]


def get_init_inputs():
    return []
'''


def test_each_output_knows_the_least_precise_dtype_the_reference_rounded_it_in(tmp_path):
    path = tmp_path / "rounded.py"
    path.write_text(ROUNDED)
    p = load_problem(path)
    assert p.output_dtypes == ("float32", "float32", "float32", "float16")
    # only where an op rounded to a dtype less precise than the output's own; a half output is judged as half anyway
    assert p.rounded_in == ("", "bfloat16", "", "")
