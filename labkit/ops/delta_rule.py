"""The gated delta rule (Gated DeltaNet's token mixer), recurrent and chunked, in plain torch.

Per head, with a state S of shape [K, V] (keys index rows), at each step t:

    S'  = exp(g_t) * S                                (decay; g_t <= 0)
    u_t = beta_t * (v_t - S'^T k_t)                   (the delta: what S' mispredicts for k_t)
    S_t = S' + k_t u_t^T                              (write the correction)
    o_t = S_t^T (q_t / sqrt(K))

q and k arrive L2-normalised, so k_t k_t^T is a projection and beta_t in (0, 1) is the fraction
of the old value at k_t that is overwritten.

The chunked form computes the same thing C steps at a time. Inside a chunk that starts from state
S0, write G_t = g_1 + ... + g_t (so exp(G_t) is the decay from the chunk start to step t).
Unrolling the recurrence gives

    S_t = exp(G_t) S0 + sum_{s<=t} exp(G_t - G_s) k_s u_s^T
    u_s = beta_s (v_s - exp(G_s) S0^T k_s - sum_{r<s} exp(G_s - G_r) (k_s . k_r) u_r)

The second line is a unit lower-triangular system (I + diag(beta) L) U = diag(beta)(V - diag(e^G) K S0)
with L[s, r] = exp(G_s - G_r) (k_s . k_r) for r < s. Solving it once per chunk turns C sequential
rank-1 updates into a handful of matrix products:

    U   = A V - (A diag(e^G) K) S0,    A = (I + diag(beta) L)^-1 diag(beta)
    O   = diag(e^G) Q S0 + (M * Q K^T) U,          M[t, s] = exp(G_t - G_s) for s <= t, else 0
    S_C = exp(G_C) S0 + (diag(e^{G_C - G}) K)^T U

All arithmetic is float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """Share each q/k head with num_v_heads / num_k_heads consecutive value heads."""
    groups = num_v_heads // x.shape[2]
    return x if groups == 1 else x.repeat_interleave(groups, dim=2)


def delta_rule_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step by step. q, k: [B, T, Hk, K] (L2-normalised); v: [B, T, Hv, V]; g, beta: [B, T, Hv];
    state: [B, Hv, K, V] or None. Returns (o [B, T, Hv, V] float32, final state [B, Hv, K, V] float32).
    """
    B, T, Hv, Vd = v.shape
    Kd = k.shape[-1]
    q = _expand_heads(q, Hv).float() * Kd**-0.5
    k = _expand_heads(k, Hv).float()
    v, g, beta = v.float(), g.float(), beta.float()
    S = q.new_zeros(B, Hv, Kd, Vd) if state is None else state.float().clone()
    out = q.new_empty(B, T, Hv, Vd)
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        pred = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        u = beta[:, t, :, None] * (v[:, t] - pred)
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return out, S


def delta_rule_chunked_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    chunk_size: int = 64,
    checkpoints: torch.Tensor | None = None,
    checkpoint_every: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`delta_rule_recurrent_ref`, computed a chunk at a time.

    With ``checkpoints`` [B, T // checkpoint_every, Hv, K, V] (float32, ``checkpoint_every`` a
    multiple of ``chunk_size``), the state after every ``checkpoint_every`` tokens is also written
    there, as the chunk kernel's ``checkpoints=`` does (the walk passes those states anyway)."""
    if checkpoints is not None and (not checkpoint_every or checkpoint_every % chunk_size):
        raise ValueError(f"checkpoint_every must be a multiple of chunk_size={chunk_size}, got {checkpoint_every}")
    B, T, Hv, Vd = v.shape
    Kd = k.shape[-1]
    C = chunk_size
    # heads first: [B, H, T, D]
    q = (_expand_heads(q, Hv).float() * Kd**-0.5).transpose(1, 2)
    k = _expand_heads(k, Hv).float().transpose(1, 2)
    v = v.float().transpose(1, 2)
    g = g.float().transpose(1, 2)
    beta = beta.float().transpose(1, 2)

    # Pad T up to a multiple of C. Padded steps have k = 0 and beta = 0 (they write nothing) and
    # g = 0 (they decay nothing), so they leave the state as it was.
    pad = (-T) % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (T + pad) // C
    q, k, v = (x.reshape(B, Hv, n, C, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(B, Hv, n, C) for x in (g, beta))

    G = g.cumsum(-1)  # [B, H, n, C]
    diff = G[..., :, None] - G[..., None, :]  # G_t - G_s
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = causal.clone().fill_diagonal_(False)
    # Mask before exp: above the diagonal G_t - G_s > 0 and could overflow.
    decay_incl = diff.masked_fill(~causal, float("-inf")).exp()
    decay_strict = diff.masked_fill(~strict, float("-inf")).exp()

    kk = k @ k.transpose(-1, -2)
    system = torch.eye(C, device=q.device) + beta[..., :, None] * kk * decay_strict
    rhs_v = beta[..., None] * v
    rhs_k = (beta * G.exp())[..., None] * k
    U0 = torch.linalg.solve_triangular(system, rhs_v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(system, rhs_k, upper=False, unitriangular=True)

    attn = (q @ k.transpose(-1, -2)) * decay_incl  # [B, H, n, C, C]
    q_decayed = q * G.exp()[..., None]
    k_to_end = k * (G[..., -1:] - G).exp()[..., None]
    chunk_decay = G[..., -1].exp()  # [B, H, n]

    S = q.new_zeros(B, Hv, Kd, Vd) if state is None else state.float().clone()
    out = q.new_empty(B, Hv, n, C, Vd)
    saved: list[torch.Tensor] = []
    for i in range(n):
        U = U0[:, :, i] - W[:, :, i] @ S
        out[:, :, i] = q_decayed[:, :, i] @ S + attn[:, :, i] @ U
        S = chunk_decay[:, :, i, None, None] * S + k_to_end[:, :, i].transpose(-1, -2) @ U
        if checkpoints is not None and ((i + 1) * C) % checkpoint_every == 0 and (i + 1) * C <= T:
            saved.append(S)  # S is a new tensor at every chunk: kept, not copied
    if checkpoints is not None and saved:
        torch.stack(saved, dim=1, out=checkpoints)
    out = out.reshape(B, Hv, n * C, Vd)[:, :, :T].transpose(1, 2)
    return out, S


def delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference the model runs: one token steps the recurrence, longer inputs take the chunked
    form (same contract as :func:`delta_rule_recurrent_ref`; ``state`` is not modified)."""
    rule = delta_rule_recurrent_ref if q.shape[1] == 1 else delta_rule_chunked_ref
    return rule(q, k, v, g, beta, state)
