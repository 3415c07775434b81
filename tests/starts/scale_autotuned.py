import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=2)],
                 key=["n"])
@triton.jit
def _scale_bias_relu(x_ptr, s_ptr, b_ptr, y_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    col = offs % dim
    y = tl.load(x_ptr + offs, mask=mask) * tl.load(s_ptr + col, mask=mask) + tl.load(b_ptr + col, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _scale_bias_relu[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, self.scale, self.bias, y, n, x.shape[-1])
        return y
