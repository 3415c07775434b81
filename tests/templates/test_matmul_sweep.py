"""The matrix-multiply template over odd sizes (1, 17, 1023 in each of M, N and K), each dtype, each epilogue kind
and each schedule: every rendered kernel reproduces the ATen values under the interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelevolve.templates.matmul import MatmulTemplate, has_tma  # noqa: E402
from tests.templates.test_matmul import TOL, capture_problem, check, find_all  # noqa: E402

# (forward, module init, whether the right operand is a parameter ``w`` [K, N] rather than nn.Linear)
EPILOGUES = {
    "bias_gelu": ("return F.gelu(self.fc(args[0]))", "linear"),
    "relu_residual": ("return torch.relu(args[0] @ self.w) + args[1]", "weight"),
    "sigmoid_scale": ("return torch.sigmoid(self.fc(args[0])) * 0.5", "linear"),
    "clamp_cast": ("return torch.clamp(self.fc(args[0]), -0.5, 0.5).to(torch.float32)", "linear"),
    "tanh_plain": ("return torch.tanh(args[0] @ self.w)", "weight"),
}
SHAPES = [(1, 1023, 17), (17, 17, 1023), (1023, 64, 17)]  # (M, K, N)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SCHEDULES = [{"SCHEDULE": "tiles", "SPLIT_K": 1}, {"SCHEDULE": "tiles", "SPLIT_K": 2}]
if has_tma():
    SCHEDULES.append({"SCHEDULE": "tma", "SPLIT_K": 1})
# every epilogue with every dtype, the shapes and schedules in turn (each pair of shape and schedule is met)
CASES = [(e, d, SHAPES[i % len(SHAPES)], SCHEDULES[(i // len(SHAPES)) % len(SCHEDULES)])
         for i, (e, d) in enumerate(itertools.product(EPILOGUES, DTYPES))]


@pytest.mark.parametrize("epilogue, dtype, shape, schedule", CASES,
                         ids=[f"{e}-{str(d)[6:]}-{'x'.join(map(str, s))}-{c['SCHEDULE']}{c['SPLIT_K']}"
                              for e, d, s, c in CASES])
def test_odd_sizes_each_dtype_each_epilogue(tmp_path, epilogue, dtype, shape, schedule):
    m, k, n = shape
    forward, kind = EPILOGUES[epilogue]
    init = f"self.fc = nn.Linear({k}, {n})" if kind == "linear" else f"self.w = nn.Parameter(torch.randn({k}, {n}) / {k ** 0.5})"
    inputs = f"[torch.randn({m}, {k}), torch.randn({m}, {n})]" if "args[1]" in forward else f"[torch.randn({m}, {k})]"
    g = capture_problem(tmp_path, forward, inputs, init, dtype)
    matches = [mt for mt in find_all(g) if mt.family == "matmul"]
    assert len(matches) == 1, [mt.family for mt in find_all(g)]
    # a half GEMM's output cast to fp32 is compared at the half tolerance: the kernel keeps the fp32 accumulator
    # where ATen rounds the product to the half dtype first
    tol = TOL.get(dtype, 2e-2)
    check(MatmulTemplate(), matches[0], g, [{**schedule, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}], tol=tol)
