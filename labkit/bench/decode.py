"""Decode and prefill, for labkit's backends and for peers measured in the same run.

Steady state (:func:`time_decode`, :func:`time_prefill`): warm up first (compilation, autotuning,
graph capture, allocator), then time whole runs with :func:`labkit.lab.timing.measure` (CUDA events
around the calls as the host issues them; a host clock on a CPU), median of several runs. Decode
feeds each step the greedy token of the previous one, so every step depends on the last as in real
generation. Achieved bandwidth is the bytes a step must move (``labkit.lab.roofline``) over the
measured step time; "% of roofline" compares tokens/s with bytes / measured copy bandwidth.

As a user sees it (:func:`wall_clock_generate`): ``labkit.generate`` called 1 or N times in a row,
timed by the host clock from the call to the synchronised result, so each call's set-up (cache,
decoder, CUDA-graph capture: in the first call, later ones reuse them) and prefill count. Triton's
compilation does not: the steady-state runs before it have compiled every kernel.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import tuning
from ..decode.registry import make_decoder, release_pooled
from ..lab.hw import DeviceFacts
from ..model import HybridLM
from ..lab.roofline import step_cost
from ..lab.timing import measure

PEERS = ("transformers", "transformers+fla", "transformers+compile")


# -- runners: one interface for labkit backends and peers -----------------------------------------
@dataclass
class Runner:
    """``reset()`` forgets all sequences; ``prefill(ids) -> last logits``; ``step(tokens) -> logits``;
    ``greedy(tokens) -> next tokens``, by the implementation's fastest greedy path."""

    reset: Callable[[], None]
    prefill: Callable[[torch.Tensor], torch.Tensor]
    step: Callable[[torch.Tensor], torch.Tensor]
    greedy: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.greedy is None:
            self.greedy = lambda tokens: self.step(tokens).argmax(-1)


def labkit_runner(model: HybridLM, backend: str, batch: int, max_len: int) -> Runner:
    cache = model.new_cache(batch, max_len)
    decoder = make_decoder(backend, model, cache)
    # backends that can pick the next token without writing logits (the fused ones) do so here
    return Runner(cache.reset, decoder.prefill, decoder.step, decoder.step_greedy)


def transformers_runner(model: HybridLM, compiled: bool = False) -> Runner:
    from ..lab.peers import transformers_twin

    twin = transformers_twin(model)
    call = torch.compile(twin) if compiled else twin
    state: dict = {}

    def reset() -> None:
        state.clear()

    @torch.no_grad()
    def prefill(ids: torch.Tensor) -> torch.Tensor:
        out = call(input_ids=ids, use_cache=True, logits_to_keep=1)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    @torch.no_grad()
    def step(tokens: torch.Tensor) -> torch.Tensor:
        out = call(input_ids=tokens[:, None], past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    return Runner(reset, prefill, step)


def fla_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("fla") is not None


def check_fla_peer(model: HybridLM, name: str) -> None:
    """transformers picks flash-linear-attention's kernels for Qwen3.5's Gated DeltaNet when fla can be
    imported (decided when its modeling module is imported), so the peer's name must say which it
    runs: "transformers+fla" needs fla importable; plain "transformers" of a model with GDN layers
    needs it absent (run that peer in a process without fla on the path)."""
    has_gdn = "gdn" in model.cfg.layer_types
    if name == "transformers+fla" and not fla_importable():
        raise RuntimeError("the transformers+fla peer needs flash-linear-attention importable "
                           "(on the GPU machine: PYTHONPATH=/tmp/fla:$PYTHONPATH)")
    if name == "transformers" and has_gdn and fla_importable():
        raise RuntimeError("fla is importable here, so transformers' Gated DeltaNet would run fla's kernels: "
                           "ask for the transformers+fla peer, or time plain transformers without fla on the path")


def make_runner(model: HybridLM, name: str, batch: int, max_len: int) -> Runner:
    if name in ("transformers", "transformers+fla"):
        check_fla_peer(model, name)
        return transformers_runner(model)
    if name == "transformers+compile":
        return transformers_runner(model, compiled=True)
    return labkit_runner(model, name, batch, max_len)


# -- measurements --------------------------------------------------------------------------------
@dataclass
class DecodeResult:
    model: str
    impl: str
    batch: int
    prompt: int
    new_tokens: int
    tokens_per_s: float | None = None
    step_ms: float | None = None
    runs_tokens_per_s: list[float] = field(default_factory=list)
    bytes_per_step: int | None = None
    achieved_bytes_per_s: float | None = None
    roofline_tokens_per_s: float | None = None
    pct_of_roofline: float | None = None
    # labkit.generate as a user calls it, set-up included: one row per run of N calls in a row
    wall_clock: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class PrefillResult:
    model: str
    impl: str
    batch: int
    tokens: int
    ms: float | None = None
    runs_ms: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    # labkit backends: the first prefill of this length by a new decoder (kernels already compiled),
    # host clock (fused+graph runs a length's first prefill eagerly and captures it the second time,
    # the tuning setting fused_prefill.capture_at: the steady state ``ms`` is the replay)
    first_call_ms: float | None = None
    error: str | None = None


def _prompt(model: HybridLM, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=gen).to(model.device)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


@torch.no_grad()
def time_decode(
    model: HybridLM,
    impl: str,
    batch: int,
    prompt: int = 128,
    new_tokens: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    facts: DeviceFacts | None = None,
    wall_calls: tuple[int, ...] = (),
) -> DecodeResult:
    """Median tokens/s of ``new_tokens`` greedy decode steps after a ``prompt``-token prefill; for
    a labkit backend also the wall-clock rate of ``labkit.generate`` called N times in a row, for
    each N in ``wall_calls``."""
    res = DecodeResult(model.cfg.name, impl, batch, prompt, new_tokens)
    try:
        runner = make_runner(model, impl, batch, prompt + new_tokens + 1)
        ids = _prompt(model, batch, prompt)
        last: dict[str, torch.Tensor] = {}

        def prefill() -> None:
            runner.reset()
            last["token"] = runner.prefill(ids).argmax(-1)

        def steps() -> None:
            token = last["token"]
            for _ in range(new_tokens):
                token = runner.greedy(token)
            last["token"] = token

        timing = measure(steps, device=model.device, graph=False, warmup=warmup, repeats=repeats, setup=prefill)
        res.runs_tokens_per_s = [batch * new_tokens / (ms * 1e-3) for ms in timing.runs_ms]
        if impl not in PEERS:
            res.wall_clock = [wall_clock_generate(model, impl, ids, new_tokens, n) for n in wall_calls]
    except Exception as exc:  # recorded in the results: a peer that fails is a finding, not a crash
        res.error = _error(exc)
        return res
    res.tokens_per_s = statistics.median(res.runs_tokens_per_s)
    res.step_ms = batch / res.tokens_per_s * 1e3
    cost = step_cost(model.cfg, batch, context=prompt + new_tokens // 2, dtype_bytes=model.dtype.itemsize)
    res.bytes_per_step = cost.bytes
    res.achieved_bytes_per_s = cost.bytes / (res.step_ms * 1e-3)
    if facts is not None and facts.copy_bytes_per_s:
        res.roofline_tokens_per_s = cost.tokens_per_s_limit(facts.copy_bytes_per_s)
        res.pct_of_roofline = 100 * res.tokens_per_s / res.roofline_tokens_per_s
    return res


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def wall_clock_generate(model: HybridLM, backend: str, ids: torch.Tensor, new_tokens: int, calls: int = 1) -> dict:
    """``labkit.generate(model, ids, new_tokens, backend=backend)`` called ``calls`` times in a row,
    timed as a user sees it: host clock, each call's set-up and prefill included (the fused backends
    make their cache, decoder and CUDA graphs in the first call and reuse them in the next ones, see
    ``labkit.decode.registry.pooled_decoder``; the first call starts without them, as in a fresh process).
    ``setup_s`` is the median set-up time ``generate`` reports."""
    from ..generate import generate

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    release_pooled(model)
    setups = []
    _sync(model.device)
    t0 = time.perf_counter()
    for _ in range(calls):
        setups.append(generate(model, ids, new_tokens, backend=backend, progress=False).setup_s)
    _sync(model.device)
    seconds = time.perf_counter() - t0
    tokens = calls * ids.shape[0] * new_tokens
    return {"calls": calls, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "setup_s": statistics.median(setups)}


def default_warmup(backend: str, device: torch.device) -> int:
    """Prefill calls before timing: a graph backend runs a length eagerly until its ``capture_at``-th
    call, captures it then; one replay more. Other backends: one call (compiles the kernels)."""
    if "graph" in backend:
        return tuning.settings("fused_prefill", device)["capture_at"] + 1
    return 1


@torch.no_grad()
def time_prefill(
    model: HybridLM, impl: str, tokens: int, batch: int = 1, repeats: int = 5, warmup: int | None = None
) -> PrefillResult:
    """Median milliseconds to prefill ``tokens`` tokens into an empty cache (last logits only), after
    ``warmup`` calls (default :func:`default_warmup`: a graph backend's capture is not a timed run;
    the first call of a new decoder, compiles and capture included, is ``first_call_ms``)."""
    res = PrefillResult(model.cfg.name, impl, batch, tokens)
    warmup = default_warmup(impl, model.device) if warmup is None else warmup
    try:
        runner = make_runner(model, impl, batch, tokens + 1)
        ids = _prompt(model, batch, tokens)
        timing = measure(lambda: runner.prefill(ids), device=model.device, graph=False, warmup=warmup,
                         repeats=repeats, setup=runner.reset)
        if impl not in PEERS:
            del runner
            fresh = make_runner(model, impl, batch, tokens + 1)
            _sync(model.device)
            t0 = time.perf_counter()
            fresh.prefill(ids)
            _sync(model.device)
            res.first_call_ms = (time.perf_counter() - t0) * 1e3
    except Exception as exc:
        res.error = _error(exc)
        return res
    res.runs_ms = timing.runs_ms
    res.ms = timing.ms
    res.tokens_per_s = batch * tokens / (res.ms * 1e-3)
    return res
