"""Rotary position embedding on the first ``rotary_dim`` channels of each head.

For channel pair (i, i + r/2), i < r/2, with angle a = pos * theta**(-2i/r):

    y_i       = x_i cos a - x_{i+r/2} sin a
    y_{i+r/2} = x_{i+r/2} cos a + x_i sin a

Channels from ``rotary_dim`` on pass through (Qwen3.5 rotates a quarter of each head).
"""

from __future__ import annotations

import torch


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def rope_ref(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; positions: [B, T] integer; inv_freq: [r/2] float32."""
    half = inv_freq.numel()
    angle = positions.float()[..., None] * inv_freq  # [B, T, r/2]
    cos, sin = angle.cos()[:, :, None, :], angle.sin()[:, :, None, :]
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
    return out.to(x.dtype)
