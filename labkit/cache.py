"""A static cache for hybrid decoders: every buffer is allocated once and never moves.

What a layer must remember between tokens depends on its mixer:

- attention: keys and values of every past token, ``[B, kv_heads, max_len, head_dim]`` each;
  this is the only part that grows with the context;
- LFM2 short conv: the last ``K-1`` inputs of its causal conv, ``[B, K-1, hidden]``;
- Gated DeltaNet: the last ``K-1`` inputs of its conv, ``[B, K-1, conv_dim]``, and the recurrent
  state, ``[B, v_heads, k_head_dim, v_head_dim]`` in float32, a fixed size however long the context.

Because nothing is reallocated, a decode step that reads positions from ``lengths`` (a device
tensor) can be captured once in a CUDA graph and replayed for every token.
"""

from __future__ import annotations

import torch

from .config import ModelConfig


class Attachments(dict):
    """Objects built around an owner's tensors (decoders, captured graphs), kept for reuse while the
    owner lives. A copy or a pickle of the owner starts without them: they point at the original."""

    def __copy__(self) -> "Attachments":
        return Attachments()

    def __deepcopy__(self, memo: dict) -> "Attachments":
        return Attachments()

    def __reduce__(self) -> tuple:
        return (Attachments, ())


class CacheFullError(RuntimeError):
    """Raised before a forward pass that would write past ``max_len``; the cache is left intact."""


class HybridCache:
    def __init__(
        self,
        cfg: ModelConfig,
        batch_size: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.cfg = cfg
        self.batch_size = batch_size
        self.max_len = max_len
        self.dtype = dtype
        self.device = torch.device(device)
        B = batch_size
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.conv_states: dict[int, torch.Tensor] = {}
        self.recurrent_states: dict[int, torch.Tensor] = {}
        for i, kind in enumerate(cfg.layer_types):
            if kind == "attention":
                shape = (B, cfg.num_kv_heads, max_len, cfg.head_dim)
                self.keys[i] = torch.zeros(shape, dtype=dtype, device=self.device)
                self.values[i] = torch.zeros(shape, dtype=dtype, device=self.device)
            elif kind == "conv":
                shape = (B, cfg.conv_kernel - 1, cfg.hidden_size)
                self.conv_states[i] = torch.zeros(shape, dtype=dtype, device=self.device)
            elif kind == "gdn":
                shape = (B, cfg.gdn_conv_kernel - 1, cfg.gdn_conv_dim)
                self.conv_states[i] = torch.zeros(shape, dtype=dtype, device=self.device)
                shape = (B, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
                self.recurrent_states[i] = torch.zeros(shape, dtype=torch.float32, device=self.device)
        # Tokens already in the cache, per sequence: on the device for kernels and graphs, and a
        # host copy so that bounds are checked without a device sync.
        self.lengths = torch.zeros(B, dtype=torch.int32, device=self.device)
        self._host_lengths = [0] * B
        # Objects other modules build around these buffers and want to reuse for as long as the
        # cache lives (e.g. captured CUDA graphs of a decode step), keyed by their owner.
        self.attachments = Attachments()

    # -- bookkeeping -----------------------------------------------------------------------------
    @property
    def host_lengths(self) -> tuple[int, ...]:
        return tuple(self._host_lengths)

    @property
    def seq_len(self) -> int:
        """The longest sequence in the cache (all sequences advance together in labkit's API)."""
        return max(self._host_lengths)

    def check_room(self, batch_size: int, num_tokens: int) -> None:
        """Raise before anything is written if ``num_tokens`` more would not fit."""
        if batch_size != self.batch_size:
            raise ValueError(
                f"input batch {batch_size} does not match the cache's batch {self.batch_size}; "
                "make a cache with model.new_cache(batch_size=...)"
            )
        if self.seq_len + num_tokens > self.max_len:
            raise CacheFullError(
                f"cache is full: it holds {self.seq_len} of max_len={self.max_len} tokens and "
                f"{num_tokens} more were asked for; make a larger cache with "
                "model.new_cache(batch_size, max_len=...) or call cache.reset()"
            )

    def advance(self, num_tokens: int) -> None:
        """Record that every sequence grew by ``num_tokens`` (in place: graph-safe)."""
        self.lengths.add_(num_tokens)
        self.advance_host(num_tokens)

    def advance_host(self, num_tokens: int) -> None:
        """Advance only the host mirror of ``lengths``: for a captured step whose graph already
        increments the device tensor."""
        self._host_lengths = [n + num_tokens for n in self._host_lengths]

    def reset(self, zero: bool = True, *, keys_values: bool = True) -> None:
        """Empty the cache for a new batch of prompts, reusing every buffer. ``zero=False`` only sets
        the lengths to 0, for a caller that overwrites every conv and recurrent state next (a prefix
        restore): stale keys and values past the lengths are never read, and are overwritten first.
        ``keys_values=False`` zeroes the conv windows and recurrent states (what a prefill from
        position 0 reads as its initial state) but not the keys and values, which that prefill
        writes before attention reads them: a prefix-cache miss, where they are most of the bytes."""
        if not zero:
            buffers = [self.lengths]
        elif keys_values:
            buffers = self.buffers()
        else:
            buffers = [*self.conv_states.values(), *self.recurrent_states.values(), self.lengths]
        # one multi-tensor launch per dtype rather than one per buffer: a miss's reset is on its clock,
        # where 20 to 40 launches cost more host time than the zeroing itself. Grouped here: given
        # tensors of several dtypes, torch's multi-tensor zero falls back to one launch per tensor
        # (13 launches, ~0.14 ms of host, for byte-qwen3.5-6m's float32 states and int32 lengths on an H100)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        for group in by_dtype.values():
            torch._foreach_zero_(group)
        self._host_lengths = [0] * self.batch_size

    def buffers(self) -> list[torch.Tensor]:
        return [
            *self.keys.values(),
            *self.values.values(),
            *self.conv_states.values(),
            *self.recurrent_states.values(),
            self.lengths,
        ]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def __repr__(self) -> str:
        return (
            f"HybridCache(batch={self.batch_size}, max_len={self.max_len}, lengths={self.host_lengths}, "
            f"attention={len(self.keys)}, conv={len(self.conv_states) - len(self.recurrent_states)}, "
            f"gdn={len(self.recurrent_states)}, {self.nbytes() / 2**20:.1f} MiB)"
        )


LAYER_KINDS = ("attention KV", "conv window", "GDN conv window", "GDN state")


def bytes_by_kind(cfg: ModelConfig, batch_size: int, context: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Bytes of a :class:`HybridCache` of ``context`` tokens for ``batch_size`` sequences, by what holds
    them (counted from the cache's own buffers, allocated on the meta device: nothing is allocated).

    attention KV grows with context and batch; the conv windows (LFM2's and Gated DeltaNet's) and
    the Gated DeltaNet state (float32 whatever ``dtype``) grow with the batch only."""
    cache = HybridCache(cfg, batch_size, context, dtype, "meta")
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    gdn = set(cache.recurrent_states)
    return {
        "attention KV": size([*cache.keys.values(), *cache.values.values()]),
        "conv window": size([s for i, s in cache.conv_states.items() if i not in gdn]),
        "GDN conv window": size([s for i, s in cache.conv_states.items() if i in gdn]),
        "GDN state": size(cache.recurrent_states.values()),
    }
