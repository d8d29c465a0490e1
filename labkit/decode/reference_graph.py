"""The plain reference model's decode step, captured once in a CUDA graph: backend ``"reference+graph"``.

This is the diagnosis's decisive experiment (notebook 01). The step runs exactly the reference
model's ops, kernel for kernel, so whatever it gains over ``"reference"`` is what the host cost
(Python, PyTorch's dispatcher, one launch call per kernel), and nothing else: no op is fused and
no kernel changes. What remains is the kernels' own time plus about a microsecond per kernel for
the graph to launch it. The gap from there to the fused backends is what fusion buys.

One change makes the step capturable. The reference attention reads the cache up to the longest
sequence (``cache.seq_len``, a host integer), so each token would need a new graph. Here the
captured step sees the cache through :class:`WholeCacheView`, whose attention reads all ``max_len``
positions; the attention core masks every key past each query's position (``attend_ref``), so the
result is the same function, at the cost of reading the unused part of the KV cache (up to
``max_len / length`` times the attention's cache bytes). Positions come from ``cache.lengths`` on
the device, which the captured step advances, as the fused graph backends do.

Prefill is the reference's own, eager. Graphs are captured at the first step after a prefill and
recaptured if the model's tensors changed (:func:`labkit.weights.weights_key`). Capture goes through
:func:`labkit.decode.graphs.capture`, whose ``GRAPHS`` is the seam the CPU tests replace with a recording
stand-in.
"""

from __future__ import annotations

from typing import Any

import torch

from . import graphs
from .protocol import Decoder
from ..cache import HybridCache
from ..model import HybridLM
from ..weights import WeightsKey, weights_key


class WholeCacheView:
    """A cache as the captured step sees it: every position of the KV buffers, device-side lengths only.

    ``seq_len`` is ``max_len - 1``, so the reference attention slices the whole buffer (its mask
    hides what is past each query); ``advance`` moves only the device ``lengths`` (the decoder
    advances the host copy after each replay); ``check_room`` asks the real cache. Everything else
    is the real cache's.
    """

    def __init__(self, cache: HybridCache) -> None:
        self._cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    @property
    def seq_len(self) -> int:
        return self._cache.max_len - 1

    def check_room(self, batch_size: int, num_tokens: int) -> None:
        self._cache.check_room(batch_size, num_tokens)

    def advance(self, num_tokens: int) -> None:
        self._cache.lengths.add_(num_tokens)


class ReferenceGraphDecoder(Decoder):
    """The reference decode step replayed from a CUDA graph (one per output: logits, greedy tokens)."""

    def __init__(self, model: HybridLM, cache: HybridCache) -> None:
        if not graphs.GRAPHS.available(model.device):
            raise RuntimeError(
                f"backend 'reference+graph' captures the reference decode step in a CUDA graph, which needs a "
                f"CUDA GPU; the model is on {model.device}. Use backend='reference' to run the same ops eagerly"
            )
        if cache.cfg != model.cfg or cache.device != model.device or cache.dtype != model.dtype:
            raise ValueError("the cache was made for another model, device or dtype")
        super().__init__(model, cache)
        self.tokens = torch.zeros(cache.batch_size, dtype=torch.long, device=model.device)
        self._graphs: dict[bool, Any] = {}
        self._outputs: dict[bool, torch.Tensor] = {}
        self._weights: WeightsKey | None = None
        self.captures = 0

    def refresh(self) -> None:
        """Forget the graphs if the model's tensors changed since they were captured (they would read
        stale tensors). Called by every prefill, never per token: the check costs ~0.3 ms."""
        key = weights_key(self.model, values=False)
        if not key.same_tensors(self._weights):
            self._graphs, self._outputs, self._weights = {}, {}, key

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.refresh()
        return self.model(input_ids, cache=self.cache, last_only=True)[:, -1]

    def _capture(self, greedy: bool) -> Any:
        """Capture one step. Kernels load on a warm-up run outside the capture; it writes the conv and
        recurrent states and advances ``lengths``, so those are saved and put back (the k/v it wrote
        at position ``lengths`` are overwritten by the next real step)."""
        cache, view, device = self.cache, WholeCacheView(self.cache), self.model.device

        def step() -> None:
            logits = self.model(self.tokens[:, None], cache=view)[:, -1]
            self._outputs[greedy] = logits.argmax(-1) if greedy else logits

        return graphs.capture(step, [*cache.conv_states.values(), *cache.recurrent_states.values(), cache.lengths],
                              device)

    def _run(self, tokens: torch.Tensor, greedy: bool) -> torch.Tensor:
        B = self.cache.batch_size
        if not isinstance(tokens, torch.Tensor) or tokens.shape != (B,):
            raise ValueError(f"tokens must be a [{B}] tensor (one per sequence), got {getattr(tokens, 'shape', tokens)!r}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be int64 or int32, got {tokens.dtype}")
        self.cache.check_room(B, 1)
        if self._weights is None:  # a step before any prefill
            self.refresh()
        if greedy not in self._graphs:
            self._graphs[greedy] = self._capture(greedy)
            self.captures += 1
        self.tokens.copy_(tokens)
        self._graphs[greedy].replay()
        self.cache.advance_host(1)  # the graph advanced the device lengths
        return self._outputs[greedy]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] after ``tokens`` [B]; the buffer is overwritten by the next step."""
        return self._run(tokens, greedy=False)

    @torch.no_grad()
    def step_greedy(self, tokens: torch.Tensor) -> torch.Tensor:
        """The argmax tokens [B] after ``tokens`` [B]; overwritten by the next step."""
        return self._run(tokens, greedy=True)

