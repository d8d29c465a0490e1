"""Depthwise causal convolution over time, continuing from a window of past inputs.

For channel c and output time t, with K taps and the K-1 inputs before the chunk in ``state``:

    y[t, c] = sum_{j<K} w[c, j] * u[t - (K-1) + j, c]

where u is the concatenation (state, x) along time. The new state is the last K-1 rows of u.
Layout is time-major, ``[B, T, C]`` for inputs and ``[B, K-1, C]`` for the state, so that one
time step of all channels is contiguous.
"""

from __future__ import annotations

import torch


def causal_conv_ref(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, T, C]; weight: [C, K]; state: [B, K-1, C] or None (zeros).

    Returns (y [B, T, C] in float32, new_state [B, K-1, C] in the state's dtype, or x's).
    """
    B, T, C = x.shape
    K = weight.shape[1]
    if state is None:
        state = x.new_zeros(B, K - 1, C)
    u = torch.cat((state.to(x.dtype), x), dim=1).float()  # [B, T+K-1, C]
    y = torch.zeros(B, T, C, dtype=torch.float32, device=x.device)
    w = weight.float()
    for j in range(K):
        y += u[:, j : j + T] * w[:, j]
    new_state = u[:, T:].to(state.dtype) if K > 1 else state
    return y, new_state
