"""RMSNorm, in the two weight conventions the families use.

    y = x / sqrt(mean(x**2) + eps) * w          (LFM2; w starts at 1)
    y = x / sqrt(mean(x**2) + eps) * (1 + w)    (Qwen3.5, "zero-centred"; w starts at 0)

The statistics are taken in float32 whatever the input dtype; the result has the input dtype.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if unit_offset else weight.float()
    return (xf * w).to(x.dtype)


def gated_rms_norm_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated DeltaNet's output norm: ``rms_norm(x) * w * silu(gate)``, per head (last dim)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float() * torch.nn.functional.silu(gate.float())).to(x.dtype)


def l2_norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x**2) + eps)`` over the last dim, in float32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)
