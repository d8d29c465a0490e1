"""Prefill, then decode token by token, with timings a reader can trust."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import torch

from .cache import CacheFullError, HybridCache
from .decode.protocol import Decoder
from .decode.registry import BACKENDS, leased_decoder, make_decoder
from .model import HybridLM
from .config import is_int
from .sampling import SamplingParams, sample

if TYPE_CHECKING:
    from .prefix_cache import PrefixCache


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # [B, new] generated ids (after a stop token: the pad id)
    prompt_len: int
    # wall time to get the decoder ready, device synchronised: the cache (made, or reset), the
    # decoder (made, or fetched) and, when made, compiling and capturing its graphs. Near zero when
    # generate reuses a pooled decoder.
    setup_s: float
    # time to first token: wall time from the prompt to the first generated token, device
    # synchronised: the prefill and the first token's sampling (set-up not included). The prefill
    # checks the decoder against the weights (with a prefix cache, also the snapshots', sampled values
    # included; under fused+graph while a captured graph runs) and, when they changed, rebuilds and
    # recaptures: that is in this time too
    ttft_s: float
    decode_s: float  # wall time of the decode steps after the first token
    steps: int  # decode steps timed in decode_s
    finished: torch.Tensor  # [B] bool: the sequence produced a stop token
    # prompt tokens restored from a PrefixCache instead of prefilled (the same for every row); 0
    # without one, or on a miss
    prefix_hit: int = 0

    @property
    def prefill_s(self) -> float:
        """The prefill as timed: the same wall time as :attr:`ttft_s` (prefill and the first token)."""
        return self.ttft_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens per second, all sequences counted, over the timed decode steps."""
        return self.tokens.shape[0] * self.steps / self.decode_s if self.decode_s > 0 else float("nan")

    @property
    def wall_s(self) -> float:
        """The whole call as a caller waits for it: set-up, prefill and decode."""
        return self.setup_s + self.ttft_s + self.decode_s

    @property
    def wall_tokens_per_s(self) -> float:
        """Generated tokens per second, all sequences counted, over :attr:`wall_s` (set-up included:
        what a single call really delivers, where ``decode_tokens_per_s`` is the steady state)."""
        return self.tokens.numel() / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def new_tokens(self) -> int:
        return self.tokens.shape[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_arguments(model: HybridLM, input_ids: torch.Tensor, max_new_tokens: int, backend: str,
                     temperature: float, top_k: int | None, top_p: float | None, seed: int | None,
                     stop_tokens: Iterable[int], cache: HybridCache | None, pad_token_id: int | None,
                     progress: bool | None, prefix_cache: "PrefixCache | None") -> tuple[list[int], torch.Tensor | None]:
    """Every argument of :func:`generate` checked before anything changes (a given cache is reset
    only after this): type, range and shape, each refusal naming the argument, the value and the
    fix. Returns the stop tokens as a list of ints (an iterator is read here, once) and, with a
    ``prefix_cache``, the prompt on the host as [batch, T] (else None).

    The prompt's id range is checked here for every length (the model checks only prompts of two
    tokens or more: a one-token prompt out of the vocabulary is a device-side assert on a GPU), by
    one min/max reduction and one read to the host, before any timing starts. With a prefix cache
    the read is of the whole prompt (its look-up hashes the tokens on the host): the cache is handed
    the copy and does not make its own on the clock."""
    if not isinstance(model, HybridLM):
        raise TypeError(f"model must be a labkit HybridLM (labkit.build or labkit.load), got {type(model).__name__}")
    V = model.cfg.vocab_size
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a tensor of token ids, [T] or [batch, T], got {type(input_ids).__name__}"
                        f"{' (wrap it: torch.tensor(ids))' if isinstance(input_ids, (list, tuple)) else ''}")
    if input_ids.dim() not in (1, 2) or 0 in input_ids.shape:
        raise ValueError(f"input_ids must be a non-empty [T] or [batch, T] tensor, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be int64 or int32 token ids, got {input_ids.dtype}: use input_ids.long()")
    host_ids = None
    if prefix_cache is not None:
        host_ids = input_ids.detach().cpu()
        host_ids = host_ids[None] if host_ids.dim() == 1 else host_ids
        lo, hi = map(int, torch.aminmax(host_ids))
    else:
        lo, hi = torch.stack(torch.aminmax(input_ids)).tolist()
    if lo < 0 or hi >= V:
        raise ValueError(f"input_ids must be token ids in [0, {V}) for {model.cfg.name!r}, got ids in [{lo}, {hi}]")
    B, T = (1, input_ids.shape[0]) if input_ids.dim() == 1 else input_ids.shape
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    SamplingParams(temperature, top_k, top_p)  # raises, naming the parameter
    if seed is not None and not is_int(seed):
        raise TypeError(f"seed must be None or an int, got {seed!r}")
    if isinstance(stop_tokens, torch.Tensor) and not stop_tokens.is_floating_point():
        stop_tokens = stop_tokens.reshape(-1).tolist()  # a tensor of ids, on the host
    if isinstance(stop_tokens, (str, bytes, torch.Tensor)) or not isinstance(stop_tokens, Iterable):
        raise TypeError(f"stop_tokens must be a list (or other iterable) of token ids, e.g. [7], got {stop_tokens!r}")
    # a one-element integer tensor is an id too (int() took it before); a float one, like 10.7, is not
    stops = [t.item() if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.is_floating_point() else t
             for t in stop_tokens]
    bad = [t for t in stops if not is_int(t) or not 0 <= t < V]
    if bad:
        raise ValueError(f"stop tokens must be int token ids in [0, {V}), got {bad!r} among stop_tokens={stops!r}")
    if pad_token_id is not None and not (is_int(pad_token_id) and 0 <= pad_token_id < V):
        raise ValueError(f"pad_token_id must be None (the first stop token) or a token id in [0, {V}), got "
                         f"{pad_token_id!r}: a stopped sequence's pad is fed back into the model")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be None, True or False, got {progress!r}")
    if cache is not None:
        if not isinstance(cache, HybridCache):
            raise TypeError(f"cache must be None or a HybridCache (model.new_cache(...)), got {type(cache).__name__}")
        if cache.cfg != model.cfg or cache.dtype != model.dtype or cache.device != model.device:
            raise ValueError(f"cache is a {cache.cfg.name!r} cache of {cache.dtype} on {cache.device}; the model is "
                             f"{model.cfg.name!r} in {model.dtype} on {model.device}: make it with model.new_cache(...)")
        need = T + max_new_tokens - 1
        if B != cache.batch_size:
            raise ValueError(f"input batch {B} does not match the cache's batch {cache.batch_size}; make a cache "
                             f"with model.new_cache({B}, max_len={need})")
        if need > cache.max_len:
            raise CacheFullError(f"the prompt's {T} tokens and max_new_tokens={max_new_tokens} need {need} positions; "
                                 f"the cache holds max_len={cache.max_len}: make one with model.new_cache({B}, max_len={need})")
    if prefix_cache is not None:
        from .prefix_cache import PrefixCache

        if not isinstance(prefix_cache, PrefixCache):
            raise TypeError(f"prefix_cache must be None or a labkit PrefixCache, got {type(prefix_cache).__name__}")
    return stops, host_ids


@torch.no_grad()
def generate(
    model: HybridLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    backend: str = "reference",
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens: Iterable[int] = (),
    cache: HybridCache | None = None,
    pad_token_id: int | None = None,
    progress: bool | None = None,
    prefix_cache: "PrefixCache | None" = None,
) -> GenerationResult:
    """Generate ``max_new_tokens`` after ``input_ids`` ([B, T] or [T]).

    Greedy by default; with ``temperature > 0`` samples, optionally restricted to the ``top_k``
    tokens or the ``top_p`` nucleus, reproducibly for a given ``seed``. Generation stops early
    when every sequence has produced one of ``stop_tokens``; later positions of a stopped
    sequence hold ``pad_token_id`` (the first stop token by default). ``progress`` shows a bar
    (default: on for runs of 256 tokens or more).

    Without a ``cache``, the backends that are slow to set up (the fused ones: kernels, graphs)
    keep their decoder and a cache on the model and reuse them in later calls with the same batch
    and cache bucket (:func:`labkit.decode.registry.leased_decoder`: lent to one call at a time, so
    concurrent calls from threads each get their own); others get a fresh cache, just large enough.
    A given cache is reset first (its lengths and states; its keys and values are overwritten by the
    prefill before they are read), and a decoder attached to it is reused.
    """
    stop_tokens, host_ids = _check_arguments(model, input_ids, max_new_tokens, backend, temperature, top_k, top_p,
                                             seed, stop_tokens, cache, pad_token_id, progress, prefix_cache)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    input_ids = input_ids.to(model.device)
    B, T = input_ids.shape
    params = SamplingParams(temperature, top_k, top_p)
    stop_tokens = [int(t) for t in stop_tokens]  # an iterator is read once; the first one given pads
    pad = pad_token_id if pad_token_id is not None else (stop_tokens[0] if stop_tokens else 0)

    _sync(model.device)  # the caller's queued work is not this call's set-up
    t_setup = time.perf_counter()
    # a prefix cache's prefill resets the cache itself (zeroing it on a miss; a hit overwrites every
    # state it reads), so zeroing it here too would be launches for nothing
    zero = prefix_cache is None
    with ExitStack() as lease:  # a pooled decoder and its cache are this call's until it returns
        # what a decoder keeps (pooled caches, plans, graphs' inputs) stays usable outside inference
        # mode when this call runs inside it (inference tensors cannot be written outside it)
        lease.enter_context(torch.inference_mode(False))
        if cache is None:
            decoder, cache = lease.enter_context(leased_decoder(backend, model, B, T + max_new_tokens, zero=zero))
        else:
            cache.reset(zero=zero, keys_values=False)  # the prefill writes the keys and values it reads
            cache.check_room(B, T + max_new_tokens - 1)  # fail now rather than halfway through
            decoder = make_decoder(backend, model, cache)
        # the one sync between set-up and prefill: set-up's device work (a made cache's fill, a reused
        # one's reset) is set-up's time, and the prompt's clock starts on an idle device
        _sync(model.device)
        setup_s = time.perf_counter() - t_setup
        return _decode(decoder, input_ids, max_new_tokens, backend, params, seed, stop_tokens, pad, progress,
                       prefix_cache, setup_s, host_ids)


def _decode(decoder: Decoder, input_ids: torch.Tensor, max_new_tokens: int, backend: str, params: SamplingParams,
            seed: int | None, stop_tokens: list[int], pad: int, progress: bool | None,
            prefix_cache: "PrefixCache | None", setup_s: float, host_ids: torch.Tensor | None = None) -> GenerationResult:
    """The timed part of :func:`generate`, once its decoder is ready (and, if pooled, lent to it).

    Host work is arranged around the device's: what the decode loop needs is made while the prompt
    runs (its output and flags), the first token is written into the output inside the time to first
    token, and a call that generates one token has no decode steps to wait for. The device is waited
    for before set-up, after it and at the first token, and after the decode steps when there are
    any (plus, for ids on the GPU, the range check's read before set-up)."""
    model = decoder.model
    B, T = input_ids.shape
    generator = None
    if not params.greedy:
        generator = torch.Generator(device=model.device).manual_seed(0 if seed is None else seed)

    # made before the prompt is launched: its copy from pageable host memory would wait for the prefill
    stops = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=model.device)
    t0 = time.perf_counter()  # set-up ended with a sync: the device is idle
    prefix_hit = 0
    # the ids' range was checked before the timing (not read again: a sync). The weights are checked
    # by the prefill, under fused+graph while a captured prompt's (or a cached prefix's tail's) graph
    # runs (FusedPrefill._replay_then_refresh)
    if prefix_cache is None:
        logits = decoder.prefill_checked(input_ids, ids_checked=True)
    else:
        pre = prefix_cache.prefill(decoder, input_ids, host_ids=host_ids)
        logits, prefix_hit = pre.logits, pre.restored
    token = sample(logits, params, generator)
    # made while the prompt runs on the device
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=model.device)
    finished = torch.zeros(B, dtype=torch.bool, device=model.device)
    out[:, 0] = token  # no sequence has finished before its first token: nothing to pad
    if stop_tokens:
        finished |= torch.isin(token, stops)
    _sync(model.device)
    ttft_s = time.perf_counter() - t0

    bar = None
    if progress or (progress is None and max_new_tokens >= 256):
        from tqdm import tqdm  # text bars: widget bars need a live frontend and can stall batch runs

        bar = tqdm(total=max_new_tokens, desc=f"decode [{backend}]", unit="tok", initial=1)
    n = 1
    t1 = time.perf_counter()
    # One host read per step when stop tokens are in play: the price of stopping early.
    while n < max_new_tokens and not (stop_tokens and bool(finished.all())):
        if params.greedy:
            token = decoder.step_greedy(token)  # a fused rung's argmax does not materialise logits
        else:
            token = sample(decoder.step(token), params, generator)
        if stop_tokens:  # without stop tokens no sequence finishes: nothing to pad
            token = torch.where(finished, pad, token)
            finished |= torch.isin(token, stops)
        out[:, n] = token
        n += 1
        if bar is not None:
            bar.update(1)
    if n > 1:  # the steps' launches, waited for; one token leaves nothing after the first token's sync
        _sync(model.device)
    decode_s = time.perf_counter() - t1
    if bar is not None:
        bar.close()
    return GenerationResult(
        tokens=out[:, :n],
        prompt_len=T,
        setup_s=setup_s,
        ttft_s=ttft_s,
        decode_s=decode_s,
        steps=n - 1,
        finished=finished,
        prefix_hit=prefix_hit,
    )
