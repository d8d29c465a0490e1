"""The ``settings`` section: per kernel, the launch settings measured on one GPU model.

    "settings": {"attention_decode": {"values": {"min_chunk": 256, "max_chunks": 64, "release_early": true},
                                      "source": "...", "measured": "..."}, ...}

``values`` may name any subset of the kernel's settings (the rest keep the heuristic); every other
key of a kernel's entry is its provenance, kept as written. :data:`HEURISTICS` is what a GPU
without a value gets: today the H200's measured winners, the only measurements there are, which
the H200's own file repeats with their figures (so its behaviour does not depend on this table).
The ops take each setting as a parameter whose default is the value here; the callers that run
the model (the fused decoder, its prefill) pass the value :func:`labkit.tuning.settings` gives.

Kernels and settings (names are the parameters of the function that takes them):

- ``linear``: ``pdl_preload``, ``pdl_release``: :class:`labkit.ops.linear.PdlPlacement`, where a
  PDL launch of the skinny GEMM preloads its first weight tile and releases its dependents;
- ``attention_decode``: ``min_chunk``, ``max_chunks`` (:func:`labkit.ops.attention_decode.attention_chunk`:
  positions per program, ``max(min_chunk, next_pow2(max_len / max_chunks))``) and ``release_early``
  (:func:`~labkit.ops.attention_decode.attention_decode` under PDL);
- ``gated_delta_decode``: ``block_v``, ``narrow_block_v``, ``programs_per_sm``
  (:func:`labkit.ops.gated_delta_decode.gdn_block_v`: ``block_v`` value columns per program where
  that still gives ``programs_per_sm`` programs per SM, else ``narrow_block_v``) and ``release_early``;
- ``norm_rope``: ``rotated_only``, ``num_warps`` (:func:`labkit.ops.prefill_fusions.norm_rope_rows`);
- ``gdn_inputs``: ``block_t``, ``num_warps``, ``heads_first`` (:func:`labkit.ops.prefill_fusions.gdn_inputs`:
  tokens per program, warps, heads next to each other in the grid's launch order);
- ``fused_prefill``: ``capture_at`` (a prompt length's prefill is captured in a CUDA graph when it
  comes this many times) and ``graphs`` (lengths kept) of the fused+graph decoder;
- ``tail_gate_up``: ``max_rows`` (the most rows, a prefix-cache hit's tail, whose MLP gate|up runs
  as one skinny GEMM with SwiGLU in its epilogue; 0: never), ``block_n``, ``block_k``,
  ``num_warps``, ``num_stages`` (its blocking) (:func:`labkit.ops.prefill_fusions.gate_up_swiglu`);
- ``prompt_gate_up``: ``min_rows`` (from how many rows a prompt's MLP gate|up runs as one GEMM with
  SwiGLU in its epilogue; 0: never) and that GEMM's :class:`labkit.ops.gemm_swiglu.GemmConfig`
  (every other setting: its field of that name) (:func:`labkit.ops.prefill_fusions.gate_up_swiglu`);
- ``chunk_delta_rule``: the launch settings of :func:`labkit.ops.chunk_delta_rule.chunk_delta_rule`
  (``block_v``, ``num_warps``, ``num_stages`` of the walk; ``prepare_warps``; ``output_block_v``,
  ``output_warps`` of the deferred outputs; ``single_block_v``, ``single_warps`` of the
  single-chunk kernel; ``walk_programs_per_sm``, ``wide_warps``, ``wide_stages`` of the walk
  whose value blocks widen when sequences x heads give it more programs than the GPU holds, and
  ``walk_blocks_first``, its grid order), each as its keyword argument of that name takes it;
- ``persistent_decode``: ``programs_per_sm`` (the grid: that many resident programs on every SM),
  ``num_warps``, ``max_registers`` (ptxas's cap per thread), ``num_stages`` (the ``tl.dot``
  loop's pipeline past batch 1: its shared memory counts against residency), ``block_k`` (the
  projections' K tile, in elements of a 16-bit model: a float32 model's has as many bytes),
  ``min_block_n`` / ``max_block_n`` (the bounds of each projection's output tile: the largest
  power of two that still deals every program a tile, :func:`labkit.decode.step_program.block_n`;
  ``head_block_n`` bounds the LM head's instead), ``prefetch_tiles`` (how many of its tiles ahead
  each program asks L2 for the weights, Hopper's bulk prefetch; 0: none).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from .files import TuningFileError
from .linear import is_int


def _pow2(v: Any) -> str | None:
    return None if is_int(v) and v >= 1 and v & (v - 1) == 0 else "a power of two >= 1"


def _positive(v: Any) -> str | None:
    return None if is_int(v) and v >= 1 else "a positive integer"


def _non_negative(v: Any) -> str | None:
    return None if is_int(v) and v >= 0 else "an integer >= 0"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _release(v: Any) -> str | None:
    releases = ("end", "early", "after_wait")  # labkit.ops.linear.RELEASES (checked equal by the tests)
    return None if v in releases else f"one of {list(releases)}"


# kernel -> setting -> (heuristic value, check: None if valid, else what it must be)
SPECS: dict[str, dict[str, tuple[Any, Callable[[Any], str | None]]]] = {
    "linear": {"pdl_preload": (True, _boolean), "pdl_release": ("early", _release)},
    "attention_decode": {"min_chunk": (256, _pow2), "max_chunks": (64, _positive), "release_early": (True, _boolean)},
    "gated_delta_decode": {"block_v": (32, _pow2), "narrow_block_v": (16, _pow2), "programs_per_sm": (2, _positive),
                           "release_early": (True, _boolean)},
    "norm_rope": {"rotated_only": (True, _boolean), "num_warps": (4, _pow2)},
    # tokens per program and warps as the kernel had them, heads first; on the H200 the sweep of
    # python -m labkit.bench.prefill_profile --sweep-gdn-inputs found the order no matter (within 1%)
    # and 16 tokens per program 8% faster (data/tuning/nvidia-h200.json)
    "gdn_inputs": {"block_t": (32, _pow2), "num_warps": (4, _pow2), "heads_first": (True, _boolean)},
    "fused_prefill": {"capture_at": (2, _positive), "graphs": (4, _positive)},
    # a tail's gate|up, 64 rows, in a chain over every layer's weights on an H100 (2026-12-06,
    # python -m labkit bench tail-ops --sweep: data/bench/nvidia-h100-80gb-hbm3/tail-ops.json): 9.02 /
    # 10.05 us for Qwen3.5-0.8B / LFM2-350M against cuBLAS + the SwiGLU kernel's 11.25 / 12.31; of
    # the sweep's blockings 32 columns were faster for Qwen3.5 (7.96 us) and slower for LFM2, 64 the
    # fastest for LFM2 (10.03); split K was slower at every width (an exploratory sweep, 1 to 16 splits)
    "tail_gate_up": {"max_rows": (64, _non_negative), "block_n": (64, _pow2), "block_k": (128, _pow2),
                     "num_warps": (4, _pow2), "num_stages": (4, _positive)},
    # a prompt's gate|up (more rows than tail_gate_up's max_rows) as labkit.ops.gemm_swiglu's GEMM
    # with SwiGLU in its epilogue, from min_rows rows on (0: never; cuBLAS, then the SwiGLU kernel).
    # Off until measured on the GPU at hand: python -m labkit bench tail-ops --rows --prompt 4096
    "prompt_gate_up": {"min_rows": (0, _non_negative), "block_m": (128, _pow2), "block_n": (128, _pow2),
                       "block_k": (64, _pow2), "group_m": (8, _pow2), "num_warps": (8, _pow2),
                       "num_stages": (3, _positive), "persistent": (False, _boolean), "flatten": (True, _boolean),
                       "split_store": (False, _boolean)},
    "chunk_delta_rule": {"block_v": (16, _pow2), "num_warps": (4, _pow2), "num_stages": (2, _positive),
                         "prepare_warps": (4, _pow2), "output_block_v": (64, _pow2), "output_warps": (4, _pow2),
                         "single_block_v": (32, _pow2), "single_warps": (4, _pow2),
                         "walk_programs_per_sm": (2, _non_negative), "wide_warps": (4, _pow2),
                         "wide_stages": (2, _positive), "walk_blocks_first": (False, _boolean)},
    # A first guess that compiles clean for sm_90 (python -m labkit compile-check): 2 programs of 8
    # warps per SM, capped at 128 registers so that both fit (the attention tile alone would take
    # 186); 512-wide K tiles divide every reduction of both presets; output tiles of 4 to 8 rows at
    # batch 1 give every program work and keep the GEMV's lanes in registers (16 for the head,
    # where max_block_n=16 measured faster for Qwen3.5 and slower for LFM2); the next tile's
    # weights asked of L2 one turn ahead. On the H200 no other candidate of
    # labkit.bench.tune_persistent beat it on both presets (data/tuning/nvidia-h200.json).
    "persistent_decode": {"programs_per_sm": (2, _positive), "num_warps": (8, _pow2), "max_registers": (128, _positive),
                          "num_stages": (2, _positive),
                          "block_k": (512, _pow2), "min_block_n": (4, _pow2), "max_block_n": (8, _pow2),
                          "head_block_n": (16, _pow2), "prefetch_tiles": (1, _non_negative)},
}
KERNELS = tuple(SPECS)
HEURISTICS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {kernel: MappingProxyType({name: value for name, (value, _) in spec.items()}) for kernel, spec in SPECS.items()})


def check_kernel(kernel: Any) -> str:
    if kernel not in SPECS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    return kernel


def check_section(section: Any, where: str) -> None:
    """Every kernel known, every value one of its settings and valid."""
    if not isinstance(section, dict):
        raise TuningFileError(f"{where}: 'settings' must be an object of kernels, got {type(section).__name__}")
    for kernel, entry in section.items():
        at = f"{where}: settings.{kernel}"
        if kernel not in SPECS:
            raise TuningFileError(f"{at}: no such kernel (kernels: {list(KERNELS)})")
        if not isinstance(entry, dict) or not isinstance(entry.get("values"), dict):
            raise TuningFileError(f"{at}: each kernel needs a 'values' object, got {entry!r}")
        for name, value in entry["values"].items():
            if name not in SPECS[kernel]:
                raise TuningFileError(f"{at}.values.{name}: no such setting (settings: {list(SPECS[kernel])})")
            wrong = SPECS[kernel][name][1](value)
            if wrong:
                raise TuningFileError(f"{at}.values.{name} must be {wrong}, got {value!r}")


def named(kernel: str, doc: dict | None) -> dict[str, Any]:
    """The values a (checked) document names for ``kernel`` (none without a document or an entry)."""
    return dict({} if doc is None else doc.get("settings", {}).get(kernel, {}).get("values", {}))


def merged(kernel: str, doc: dict | None) -> Mapping[str, Any]:
    """``kernel``'s settings: the (checked) document's values over the heuristic's."""
    return MappingProxyType({**HEURISTICS[kernel], **named(kernel, doc)})
