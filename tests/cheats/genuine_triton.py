import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale_bias_relu_kernel(x_ptr, s_ptr, b_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    s = tl.load(s_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(y_ptr + row * n_cols + cols, tl.maximum(x * s + b, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n_rows, n_cols = x.shape
        _scale_bias_relu_kernel[(n_rows,)](x, self.scale, self.bias, y, n_rows, n_cols,
                                           BLOCK=triton.next_power_of_2(n_cols))
        return y
