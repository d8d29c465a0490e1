"""Model configurations: one dataclass for both hybrid families, the presets, and HF config parsing.

A hybrid decoder is a stack of blocks; each block is a token mixer followed by a SwiGLU MLP, both
pre-normed and residual. The mixer of layer ``i`` is ``layer_types[i]``:

- ``"attention"``: grouped-query attention with per-head RMSNorm on q and k, rotary embedding on the
  first ``rotary_dim`` channels of each head, and (Qwen3.5) a sigmoid output gate;
- ``"conv"``: LFM2's gated short convolution (a depthwise causal conv of ``conv_kernel`` taps);
- ``"gdn"``: Qwen3.5's Gated DeltaNet (linear attention with a fixed-size state per head).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

LAYER_TYPES = ("attention", "conv", "gdn")
FAMILIES = ("lfm2", "qwen3.5")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes the shapes and the function of a labkit model."""

    family: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    intermediate_size: int
    norm_eps: float
    # RMSNorm weight convention: LFM2 multiplies by w, Qwen3.5 by (1 + w) with w initialised at 0.
    norm_unit_offset: bool
    tie_embeddings: bool
    # attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rotary_dim: int
    attn_output_gate: bool = False
    # LFM2 short convolution
    conv_kernel: int = 3
    # Qwen3.5 Gated DeltaNet
    gdn_num_k_heads: int = 0
    gdn_num_v_heads: int = 0
    gdn_k_head_dim: int = 0
    gdn_v_head_dim: int = 0
    gdn_conv_kernel: int = 4
    # tokens
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    max_position_embeddings: int = 32768
    name: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = _number_problems(self)
        if self.family not in FAMILIES:
            problems.append(f"family must be one of {FAMILIES}, got {self.family!r}")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            problems.append(f"unknown layer types {bad}; known: {LAYER_TYPES}")
        if self.family == "lfm2" and "gdn" in self.layer_types:
            problems.append("an LFM2 model has no Gated DeltaNet layers")
        if self.family == "qwen3.5" and "conv" in self.layer_types:
            problems.append("a Qwen3.5 model has no short-conv layers")
        if self.num_heads % max(self.num_kv_heads, 1):
            problems.append(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.layer_types:
            problems.append("layer_types is empty: a model needs at least one layer")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            problems.append(f"rotary_dim {self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]")
        if "gdn" in self.layer_types:
            if min(self.gdn_num_k_heads, self.gdn_num_v_heads, self.gdn_k_head_dim, self.gdn_v_head_dim) <= 0:
                problems.append("Gated DeltaNet layers need positive gdn_* head counts and dims")
            elif self.gdn_num_v_heads % self.gdn_num_k_heads:
                problems.append("gdn_num_v_heads must be a multiple of gdn_num_k_heads")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "attention")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def gdn_key_dim(self) -> int:
        return self.gdn_num_k_heads * self.gdn_k_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_num_v_heads * self.gdn_v_head_dim

    @property
    def gdn_conv_dim(self) -> int:
        """Channels that go through the GDN causal conv: q, k and v."""
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra")
        d["layer_types"] = list(self.layer_types)
        return d

    # -- Hugging Face config.json ----------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Read a transformers ``config.json`` (as a dict) of an LFM2 or Qwen3.5 model.

        For Qwen3.5 either the text model's own config or the multimodal one (whose
        ``text_config`` is used; the vision tower is not part of labkit) is accepted.
        """
        if not isinstance(hf, Mapping):
            raise ValueError(f"a config is a JSON object (a dict), got {type(hf).__name__}")
        model_type = hf.get("model_type", "")
        if model_type == "lfm2":
            return _read_hf(_lfm2_from_hf, hf, "LFM2")
        if model_type in ("qwen3_5", "qwen3_5_text"):
            if "text_config" in hf and hf["text_config"] is not None:
                text = dict(hf["text_config"])
                text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
                return _read_hf(_qwen35_from_hf, text, "Qwen3.5")
            return _read_hf(_qwen35_from_hf, hf, "Qwen3.5")
        raise ValueError(
            f"unsupported model_type {model_type!r}: labkit reads LFM2 ('lfm2') and Qwen3.5 "
            "('qwen3_5' or 'qwen3_5_text') configs"
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """Read a ``config.json``; an error names the file (malformed JSON, a missing or bad entry)."""
        try:
            hf = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        try:
            return cls.from_hf(hf)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


# Sizes that must be whole numbers >= 1 (the gdn_* ones are checked only where GDN layers need them),
# and the float settings that must be finite and > 0: a zero, negative or fractional one would only
# fail later, deep in a shape or a division, naming nothing.
_POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                  "rotary_dim", "conv_kernel", "gdn_conv_kernel", "max_position_embeddings")
_POSITIVE_FLOATS = ("norm_eps", "rope_theta")


def is_int(x: object) -> bool:
    """A whole number as an int (numpy's too), not a bool, a float or a string."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _number_problems(cfg: "ModelConfig") -> list[str]:
    problems = []
    for name in _POSITIVE_INTS:
        value = getattr(cfg, name)
        if not is_int(value) or value < 1:
            problems.append(f"{name} must be an int >= 1, got {value!r}")
    for name in _POSITIVE_FLOATS:
        value = getattr(cfg, name)
        if not is_real(value) or not (math.isfinite(value) and value > 0):
            problems.append(f"{name} must be a finite number > 0, got {value!r}")
    return problems


def _read_hf(parse: Callable[[Mapping[str, Any]], "ModelConfig"], hf: Mapping[str, Any], family: str) -> "ModelConfig":
    """``parse(hf)``, with a missing key or a value of the wrong type named instead of a bare
    KeyError / TypeError from deep in the arithmetic."""
    try:
        return parse(hf)
    except KeyError as exc:
        raise ValueError(f"the {family} config has no {exc.args[0]!r} entry, which labkit needs") from exc
    except TypeError as exc:
        raise ValueError(f"the {family} config has a value of the wrong type: {exc}") from exc


def _layer_count(hf: Mapping[str, Any], kinds: list[str] | None) -> int:
    """num_hidden_layers, checked against the length of layer_types where both are given."""
    n_layers = hf["num_hidden_layers"]
    if not is_int(n_layers) or n_layers < 1:
        raise ValueError(f"num_hidden_layers must be an int >= 1, got {n_layers!r}")
    if kinds is not None and len(kinds) != n_layers:
        raise ValueError(
            f"num_hidden_layers is {n_layers} but layer_types lists {len(kinds)} layers: make them agree"
        )
    return n_layers


def _rope(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    rp = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"rope_type {rope_type!r} is not supported (only plain RoPE)")
    return rp


def lfm2_ff_dim(block_ff_dim: int, auto_adjust: bool, multiplier: float | None, multiple_of: int) -> int:
    """LFM2's SwiGLU width from its config: 2/3 of ``block_ff_dim``, scaled, rounded up."""
    if not auto_adjust:
        return block_ff_dim
    width = int(2 * block_ff_dim / 3)
    if multiplier is not None:
        width = int(multiplier * width)
        width = multiple_of * math.ceil(width / multiple_of)
    return width


def _layer_kinds(hf_types: list[str], mapping: Mapping[str, str], family: str) -> list[str]:
    """transformers' layer type names as labkit's; an unknown one is refused, never guessed."""
    unknown = sorted({t for t in hf_types if t not in mapping})
    if unknown:
        raise ValueError(f"{family} layer types {unknown} are not supported")
    return [mapping[t] for t in hf_types]


def _lfm2_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    kinds = None
    if hf.get("layer_types"):
        kinds = _layer_kinds(hf["layer_types"], {"full_attention": "attention", "conv": "conv"}, "LFM2")
    n_layers = _layer_count(hf, kinds)
    if kinds is None:
        attn = hf.get("full_attn_idxs")
        attn = list(range(n_layers)) if attn is None else attn
        kinds = ["attention" if i in attn else "conv" for i in range(n_layers)]
    rp = _rope(hf)
    heads = hf["num_attention_heads"]
    if not is_int(heads) or heads < 1:
        raise ValueError(f"num_attention_heads must be an int >= 1, got {heads!r}")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    ff = lfm2_ff_dim(
        hf.get("block_ff_dim", hf.get("intermediate_size")),
        hf.get("block_auto_adjust_ff_dim", True),
        hf.get("block_ffn_dim_multiplier", 1.0),
        hf.get("block_multiple_of", 256),
    )
    if hf.get("conv_bias", False):
        raise ValueError("LFM2 short-conv with bias is not supported (every released LFM2 has conv_bias=false)")
    return ModelConfig(
        family="lfm2",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        layer_types=tuple(kinds),
        intermediate_size=ff,
        norm_eps=hf.get("norm_eps", 1e-5),
        norm_unit_offset=False,
        tie_embeddings=hf.get("tie_embedding", hf.get("tie_word_embeddings", True)),
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        head_dim=head_dim,
        rope_theta=float(rp.get("rope_theta", hf.get("rope_theta", 1e6))),
        rotary_dim=head_dim,
        conv_kernel=hf.get("conv_L_cache", 3),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=_tokens(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
        max_position_embeddings=hf.get("max_position_embeddings", 128000),
        name=hf.get("_name_or_path", "") or "lfm2",
    )


def _qwen35_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    kinds = None
    if hf.get("layer_types"):
        kinds = _layer_kinds(hf["layer_types"], {"full_attention": "attention", "linear_attention": "gdn"}, "Qwen3.5")
    n_layers = _layer_count(hf, kinds)
    if kinds is None:
        every = hf.get("full_attention_interval", 4)
        kinds = ["attention" if (i + 1) % every == 0 else "gdn" for i in range(n_layers)]
    rp = _rope(hf)
    head_dim = hf.get("head_dim", 256)
    partial = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
    if hf.get("attention_bias", False):
        raise ValueError("Qwen3.5 attention with bias is not supported")
    return ModelConfig(
        family="qwen3.5",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        layer_types=tuple(kinds),
        intermediate_size=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_unit_offset=True,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        head_dim=head_dim,
        rope_theta=float(rp.get("rope_theta", hf.get("rope_theta", 1e7))),
        rotary_dim=int(head_dim * partial),
        attn_output_gate=True,
        gdn_num_k_heads=hf.get("linear_num_key_heads", 16),
        gdn_num_v_heads=hf.get("linear_num_value_heads", 32),
        gdn_k_head_dim=hf.get("linear_key_head_dim", 128),
        gdn_v_head_dim=hf.get("linear_value_head_dim", 128),
        gdn_conv_kernel=hf.get("linear_conv_kernel_dim", 4),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=_tokens(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        name=hf.get("_name_or_path", "") or "qwen3.5",
    )


def _tokens(value: Any) -> int | tuple[int, ...] | None:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers ``config.json`` (as a dict) that describes the same model.

    Written so that transformers' own ``Lfm2ForCausalLM`` / ``Qwen3_5ForCausalLM`` load it.
    """
    common = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    if cfg.family == "lfm2":
        if cfg.head_dim * cfg.num_heads != cfg.hidden_size or cfg.rotary_dim != cfg.head_dim:
            raise ValueError("transformers' LFM2 needs head_dim = hidden_size / num_heads and full rotary")
        return {
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            **common,
            "intermediate_size": cfg.intermediate_size,
            "block_auto_adjust_ff_dim": False,
            "norm_eps": cfg.norm_eps,
            "conv_bias": False,
            "conv_L_cache": cfg.conv_kernel,
            "layer_types": ["full_attention" if t == "attention" else "conv" for t in cfg.layer_types],
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        }
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **common,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.norm_eps,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "linear_num_key_heads": cfg.gdn_num_k_heads,
        "linear_num_value_heads": cfg.gdn_num_v_heads,
        "linear_key_head_dim": cfg.gdn_k_head_dim,
        "linear_value_head_dim": cfg.gdn_v_head_dim,
        "linear_conv_kernel_dim": cfg.gdn_conv_kernel,
        "layer_types": ["full_attention" if t == "attention" else "linear_attention" for t in cfg.layer_types],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim,
        },
    }


# -- presets ---------------------------------------------------------------------------------------
_LFM2_350M = ModelConfig(
    family="lfm2",
    name="lfm2-350m",
    vocab_size=65536,
    hidden_size=1024,
    layer_types=tuple("attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)),
    intermediate_size=lfm2_ff_dim(6656, True, 1.0, 256),  # = 4608
    norm_eps=1e-5,
    norm_unit_offset=False,
    tie_embeddings=True,
    num_heads=16,
    num_kv_heads=8,
    head_dim=64,
    rope_theta=1e6,
    rotary_dim=64,
    conv_kernel=3,
    bos_token_id=1,
    eos_token_id=7,
    pad_token_id=0,
    max_position_embeddings=128000,
)

_QWEN35_08B = ModelConfig(
    family="qwen3.5",
    name="qwen3.5-0.8b",
    vocab_size=248320,
    hidden_size=1024,
    layer_types=tuple("attention" if (i + 1) % 4 == 0 else "gdn" for i in range(24)),
    intermediate_size=3584,
    norm_eps=1e-6,
    norm_unit_offset=True,
    tie_embeddings=True,
    num_heads=8,
    num_kv_heads=2,
    head_dim=256,
    rope_theta=1e7,
    rotary_dim=64,  # partial_rotary_factor 0.25
    attn_output_gate=True,
    gdn_num_k_heads=16,
    gdn_num_v_heads=16,
    gdn_k_head_dim=128,
    gdn_v_head_dim=128,
    gdn_conv_kernel=4,
    max_position_embeddings=262144,
)

# Tiny models of the same structure for CPU tests. Sizes are deliberately irregular (odd vocab,
# hidden sizes that are not powers of two, more V heads than K heads) so that kernels and caches
# are exercised off the happy path.
_TINY_LFM2 = ModelConfig(
    family="lfm2",
    name="tiny-lfm2",
    vocab_size=263,
    hidden_size=96,
    layer_types=("conv", "conv", "attention", "conv", "attention"),
    intermediate_size=160,
    norm_eps=1e-5,
    norm_unit_offset=False,
    tie_embeddings=True,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=1e4,
    rotary_dim=16,
    conv_kernel=3,
    max_position_embeddings=4096,
)

_TINY_QWEN35 = ModelConfig(
    family="qwen3.5",
    name="tiny-qwen3.5",
    vocab_size=263,
    hidden_size=80,
    layer_types=("gdn", "gdn", "gdn", "attention", "gdn"),
    intermediate_size=176,
    norm_eps=1e-6,
    norm_unit_offset=True,
    tie_embeddings=True,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    rope_theta=1e5,
    rotary_dim=8,
    attn_output_gate=True,
    gdn_num_k_heads=2,
    gdn_num_v_heads=4,
    gdn_k_head_dim=16,
    gdn_v_head_dim=24,
    gdn_conv_kernel=4,
    max_position_embeddings=4096,
)

PRESETS: dict[str, ModelConfig] = {
    c.name: c for c in (_LFM2_350M, _QWEN35_08B, _TINY_LFM2, _TINY_QWEN35)
}
