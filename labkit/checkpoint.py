"""Hugging Face checkpoints (config.json + safetensors) to labkit models and back.

labkit stores together the weights that one decode step reads together (see ``labkit.model``),
so each labkit parameter is made from one or more transformers tensors. The table below is the
whole correspondence; loading joins, saving splits, and both check every name and shape, so a
missing, unexpected or mis-shaped tensor stops the load with an error that names it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from .config import ModelConfig, to_hf
from .model import HybridLM, empty_model

Tensor = torch.Tensor


@dataclass(frozen=True)
class Source:
    """How one labkit parameter is made from transformers tensors (and split back into them)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    join: Callable[[list[Tensor]], Tensor]
    split: Callable[[Tensor], list[Tensor]]


def _rows(names: list[str], shapes: list[tuple[int, ...]]) -> Source:
    """Tensors stacked along dim 0 (projections whose outputs labkit computes in one product)."""
    sizes = [s[0] for s in shapes]
    return Source(tuple(names), tuple(shapes), lambda ts: torch.cat(ts, 0), lambda t: list(t.split(sizes, 0)))


def _same(name: str, shape: tuple[int, ...]) -> Source:
    return Source((name,), (shape,), lambda ts: ts[0], lambda t: [t])


def _depthwise(name: str, channels: int, taps: int) -> Source:
    """nn.Conv1d's [C, 1, K] weight as labkit's [C, K]."""
    return Source((name,), ((channels, 1, taps),), lambda ts: ts[0][:, 0], lambda t: [t[:, None]])


def _qwen_q_and_gate(name: str, heads: int, head_dim: int, hidden: int) -> Source:
    """Qwen3.5's q_proj interleaves, per head, head_dim query rows then head_dim gate rows.

    labkit keeps the queries of all heads first, then all gates: [q | gate] halves.
    """

    def join(ts: list[Tensor]) -> Tensor:
        w = ts[0].view(heads, 2, head_dim, hidden)
        return torch.cat((w[:, 0].reshape(-1, hidden), w[:, 1].reshape(-1, hidden)), 0)

    def split(t: Tensor) -> list[Tensor]:
        q, gate = t.view(2, heads, head_dim, hidden).unbind(0)
        return [torch.stack((q, gate), 1).reshape(2 * heads * head_dim, hidden)]

    return Source((name,), ((2 * heads * head_dim, hidden),), join, split)


def _qwen_attention(p: str, cfg: ModelConfig) -> dict[str, Source]:
    """wqkv = [q | k | v | gate] built from q_proj (q and gate interleaved), k_proj, v_proj."""
    H, nh, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    qg = _qwen_q_and_gate(f"{p}.self_attn.q_proj.weight", nh, hd, H)
    kv_shape = (cfg.kv_size, H)

    def join(ts: list[Tensor]) -> Tensor:
        q, gate = qg.join([ts[0]]).split(cfg.q_size, 0)
        return torch.cat((q, ts[1], ts[2], gate), 0)

    def split(t: Tensor) -> list[Tensor]:
        q, k, v, gate = t.split([cfg.q_size, cfg.kv_size, cfg.kv_size, cfg.q_size], 0)
        return [qg.split(torch.cat((q, gate), 0))[0], k, v]

    names = (qg.names[0], f"{p}.self_attn.k_proj.weight", f"{p}.self_attn.v_proj.weight")
    return {"mixer.wqkv": Source(names, (qg.shapes[0], kv_shape, kv_shape), join, split)}


def parameter_sources(cfg: ModelConfig, prefix: str = "model.") -> dict[str, Source]:
    """labkit parameter name -> where it comes from in a transformers checkpoint."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    out: dict[str, Source] = {"embed.weight": _same(f"{prefix}embed_tokens.weight", (cfg.vocab_size, H))}
    lfm2 = cfg.family == "lfm2"
    for i, kind in enumerate(cfg.layer_types):
        p = f"{prefix}layers.{i}"
        layer: dict[str, Source] = {}
        if lfm2:
            layer["mixer_norm.weight"] = _same(f"{p}.operator_norm.weight", (H,))
            layer["mlp_norm.weight"] = _same(f"{p}.ffn_norm.weight", (H,))
            layer["mlp.gate_up"] = _rows([f"{p}.feed_forward.w1.weight", f"{p}.feed_forward.w3.weight"], [(I, H)] * 2)
            layer["mlp.down"] = _same(f"{p}.feed_forward.w2.weight", (H, I))
        else:
            layer["mixer_norm.weight"] = _same(f"{p}.input_layernorm.weight", (H,))
            layer["mlp_norm.weight"] = _same(f"{p}.post_attention_layernorm.weight", (H,))
            layer["mlp.gate_up"] = _rows([f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], [(I, H)] * 2)
            layer["mlp.down"] = _same(f"{p}.mlp.down_proj.weight", (H, I))
        if kind == "attention":
            hd = cfg.head_dim
            if lfm2:
                a = f"{p}.self_attn"
                qkv = [f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight"]
                layer["mixer.wqkv"] = _rows(qkv, [(cfg.q_size, H), (cfg.kv_size, H), (cfg.kv_size, H)])
                layer["mixer.wo"] = _same(f"{a}.out_proj.weight", (H, cfg.q_size))
                layer["mixer.q_norm.weight"] = _same(f"{a}.q_layernorm.weight", (hd,))
                layer["mixer.k_norm.weight"] = _same(f"{a}.k_layernorm.weight", (hd,))
            else:
                a = f"{p}.self_attn"
                layer.update(_qwen_attention(p, cfg))
                layer["mixer.wo"] = _same(f"{a}.o_proj.weight", (H, cfg.q_size))
                layer["mixer.q_norm.weight"] = _same(f"{a}.q_norm.weight", (hd,))
                layer["mixer.k_norm.weight"] = _same(f"{a}.k_norm.weight", (hd,))
        elif kind == "conv":
            c = f"{p}.conv"
            layer["mixer.in_proj"] = _same(f"{c}.in_proj.weight", (3 * H, H))
            layer["mixer.conv_weight"] = _depthwise(f"{c}.conv.weight", H, cfg.conv_kernel)
            layer["mixer.out_proj"] = _same(f"{c}.out_proj.weight", (H, H))
        elif kind == "gdn":
            g, nv = f"{p}.linear_attn", cfg.gdn_num_v_heads
            layer["mixer.in_proj"] = _rows(
                [f"{g}.in_proj_qkv.weight", f"{g}.in_proj_z.weight", f"{g}.in_proj_b.weight", f"{g}.in_proj_a.weight"],
                [(cfg.gdn_conv_dim, H), (cfg.gdn_value_dim, H), (nv, H), (nv, H)],
            )
            layer["mixer.conv_weight"] = _depthwise(f"{g}.conv1d.weight", cfg.gdn_conv_dim, cfg.gdn_conv_kernel)
            layer["mixer.A_log"] = _same(f"{g}.A_log", (nv,))
            layer["mixer.dt_bias"] = _same(f"{g}.dt_bias", (nv,))
            layer["mixer.norm_weight"] = _same(f"{g}.norm.weight", (cfg.gdn_v_head_dim,))
            layer["mixer.out_proj"] = _same(f"{g}.out_proj.weight", (H, cfg.gdn_value_dim))
        out.update({f"layers.{i}.{k}": v for k, v in layer.items()})
    out["final_norm.weight"] = _same(f"{prefix}{'embedding_norm' if lfm2 else 'norm'}.weight", (H,))
    if not cfg.tie_embeddings:
        out["lm_head"] = _same("lm_head.weight", (cfg.vocab_size, H))
    return out


# Tensors of released checkpoints that are not part of the text decoder labkit runs.
_NOT_TEXT_DECODER = ("model.visual.", "mtp.")


class CheckpointError(ValueError):
    """A checkpoint that does not describe the model its config.json promises."""


INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} ({what}) is not valid JSON: {exc}") from exc


def _open_safetensors(file: Path):
    """safetensors' reader of ``file``; a truncated or corrupt file is an error that names it."""
    from safetensors import safe_open

    try:
        return safe_open(file, framework="pt")
    except Exception as exc:  # SafetensorError, OSError: neither names the file
        raise CheckpointError(f"{file} cannot be read as safetensors (truncated or corrupt?): {exc}") from exc


def _tensor_index(path: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it: from the index of a sharded checkpoint, else from the
    safetensors files themselves. One set of weights only: safetensors files the index does not
    name, or a tensor found in two files (a stray ``model_old.safetensors`` beside ``model.safetensors``),
    are refused rather than one of them read silently."""
    files = sorted(path.glob("*.safetensors"))
    index = path / INDEX_FILE
    if index.exists():
        data = _read_json(index, "the index of a sharded checkpoint")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise CheckpointError(f"{index} has no \"weight_map\" object of tensor name -> file name")
        named = {path / file for file in weight_map.values()}
        absent = sorted(str(f.name) for f in named if not f.is_file())
        if absent:
            raise CheckpointError(f"{index} names files that are not in {path}: {_few(absent)}")
        stray = sorted(f.name for f in files if f not in named)
        if stray:
            raise CheckpointError(
                f"{path} holds two sets of weights: {_few(stray)} beside the shards that {index.name} names; "
                "remove the files that do not belong (or the index)"
            )
        return {name: path / file for name, file in weight_map.items()}
    if not files:
        raise CheckpointError(f"no .safetensors files in {path}")
    found: dict[str, Path] = {}
    for f in files:
        with _open_safetensors(f) as sf:
            for name in sf.keys():
                if name in found:
                    raise CheckpointError(
                        f"{path} holds more than one set of weights: tensor {name} is in both {found[name].name} "
                        f"and {f.name}; remove the stray file"
                    )
                found[name] = f
    return found


# The dtypes a labkit model computes in (``load``), and what ``save`` may store (any floating dtype:
# ``load`` converts a floating tensor to the dtype asked for, and refuses any other).
MODEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def as_dtype(dtype: object, argument: str = "dtype", allowed: tuple[torch.dtype, ...] | None = MODEL_DTYPES) -> torch.dtype:
    """A torch dtype from a torch.dtype or its name as config.json spells it ("float32", "bfloat16",
    also "torch.float16"): the names are unambiguous and are what a checkpoint's own config holds, so
    they are accepted rather than refused. ``allowed`` None: any floating dtype."""
    resolved = dtype
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
    ok = isinstance(resolved, torch.dtype) and (resolved in allowed if allowed else resolved.is_floating_point)
    if not ok:
        choices = ", ".join(str(d).removeprefix("torch.") for d in allowed) if allowed else "a floating dtype"
        raise ValueError(
            f"{argument} must be a floating torch dtype or its name ({choices}), got {dtype!r}"
            + ("; load refuses integer tensors, so such a checkpoint could not be read back" if allowed is None else "")
        )
    return resolved


def _as_device(device: object) -> torch.device:
    try:
        return torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r}") from exc


def _as_path(path: object, argument: str = "path") -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or a path (os.PathLike), got {type(path).__name__} {path!r}")
    return os.fspath(path)


HUB_PREFIX = "hub:"


def _resolve(path: str | Path) -> Path:
    """The local checkpoint directory; a Hugging Face Hub download only for an explicit "hub:owner/name".

    A local path that does not exist is an error here, never a network request, whatever it looks like.
    """
    text = str(path)
    if text.startswith(HUB_PREFIX):
        return _from_hub(text.removeprefix(HUB_PREFIX))
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise CheckpointError(f"{p} is a file; labkit.load wants the checkpoint directory")
    hint = f" (for the Hugging Face Hub repo, load '{HUB_PREFIX}{text}')" if _looks_like_repo_id(text) else ""
    raise CheckpointError(f"no checkpoint directory at {p}{hint}")


def _looks_like_repo_id(text: str) -> bool:
    return text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/"))


def _from_hub(repo_id: str) -> Path:
    if not _looks_like_repo_id(repo_id):
        raise CheckpointError(f"{HUB_PREFIX}{repo_id}: a Hub checkpoint is named {HUB_PREFIX}owner/name")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise CheckpointError(f"loading {HUB_PREFIX}{repo_id} needs huggingface_hub: pip install huggingface_hub") from exc
    return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"]))


def load(
    path: str | Path, dtype: torch.dtype | str = torch.bfloat16, device: torch.device | str = "cpu"
) -> HybridLM:
    """Load a transformers checkpoint (config.json + safetensors) of LFM2 or Qwen3.5.

    ``path`` is a local directory, or ``"hub:owner/name"`` to download (config and safetensors only)
    from the Hugging Face Hub with huggingface_hub. Nothing else reaches the network. ``dtype``: a
    torch dtype or its name ("bfloat16"). Any fault of the checkpoint is a :class:`CheckpointError`
    that names the file (and the tensor).
    """
    dtype, device = as_dtype(dtype), _as_device(device)
    root = _resolve(_as_path(path))
    config_path = root / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{root} has no config.json")
    try:
        cfg = ModelConfig.from_json(config_path)  # its errors name the file
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    cfg = cfg.replace(name=cfg.name if cfg.name not in ("lfm2", "qwen3.5") else root.name)
    index = _tensor_index(root)
    prefix = "model.language_model." if any(n.startswith("model.language_model.") for n in index) else "model."
    sources = parameter_sources(cfg, prefix)

    wanted = {n for s in sources.values() for n in s.names}
    missing = sorted(wanted - index.keys())
    extra = sorted(n for n in index.keys() - wanted if not n.startswith(_NOT_TEXT_DECODER))
    tied_head = cfg.tie_embeddings and "lm_head.weight" in extra
    if tied_head:
        extra.remove("lm_head.weight")
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {root} does not match its config ({cfg.family}, {cfg.num_layers} layers): "
            + (f"missing tensors {_few(missing)}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected tensors {_few(extra)}" if extra else "")
        )

    handles: dict[Path, object] = {}

    def read(name: str) -> Tensor:
        f = index[name]
        if f not in handles:
            handles[f] = _open_safetensors(f)
        try:
            return handles[f].get_tensor(name)  # type: ignore[attr-defined]
        except Exception as exc:  # a name the index promises but the file lacks, a truncated file
            raise CheckpointError(f"tensor {name} cannot be read from {f}: {exc}") from exc

    model = empty_model(cfg, dtype, device)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for pname, src in sources.items():
            parts = []
            for name, shape in zip(src.names, src.shapes):
                t = read(name)
                if tuple(t.shape) != shape:
                    raise CheckpointError(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
                if not t.is_floating_point():
                    raise CheckpointError(f"tensor {name} has dtype {t.dtype}, expected a floating dtype")
                parts.append(t)
            params[pname].copy_(src.join(parts).to(dtype))
        if tied_head and not torch.equal(read("lm_head.weight").to(dtype), params["embed.weight"].cpu()):
            raise CheckpointError("config ties lm_head to the embedding, but lm_head.weight differs from it")
    return model


def _few(names: list[str], n: int = 8) -> str:
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def hf_state_dict(model: HybridLM, device: torch.device | str | None = "cpu") -> dict[str, Tensor]:
    """The model's weights under transformers' names and layouts (on ``device``; None: where they are)."""
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    for pname, src in parameter_sources(model.cfg).items():
        for name, t in zip(src.names, src.split(params[pname].detach())):
            out[name] = t.contiguous() if device is None else t.contiguous().to(device)
    return out


# ModelConfig fields that do not fix the weights' shapes or the model's function: extra_config may
# set them (a checkpoint's token ids, its name); any other change would describe another model.
_DESCRIPTIVE = ("name", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings")


def _config_json(cfg: ModelConfig, storage: torch.dtype, extra_config: Mapping | None) -> str:
    """The config.json text ``save`` writes, validated before anything is written: transformers'
    form of ``cfg`` exists, ``extra_config`` is JSON, and the text reads back as this model."""
    if extra_config is not None and not isinstance(extra_config, Mapping):
        raise TypeError(f"extra_config must be a dict of config.json entries, got {type(extra_config).__name__}")
    hf = to_hf(cfg)  # raises for what transformers' configs cannot express
    hf["dtype"] = str(storage).removeprefix("torch.")
    _check_reads_back(cfg, hf, "transformers' form of this config reads back as another model")
    hf.update(extra_config or {})
    try:
        text = json.dumps(hf, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise ValueError(f"extra_config must hold JSON values only (str, number, bool, None, list, dict): {exc}") from exc
    _check_reads_back(cfg, json.loads(text), "extra_config changes the model; change the model's config instead")
    return text


def _check_reads_back(cfg: ModelConfig, hf: dict, problem: str) -> None:
    """Refuse a config.json that does not read back as ``cfg`` (but for its descriptive fields)."""
    try:
        back = ModelConfig.from_hf(hf)
    except ValueError as exc:
        raise ValueError(f"{problem}: {exc}") from exc
    changed = [f"{f.name} ({getattr(cfg, f.name)!r} -> {getattr(back, f.name)!r})" for f in dataclasses.fields(cfg)
               if f.compare and f.name not in _DESCRIPTIVE and getattr(back, f.name) != getattr(cfg, f.name)]
    if changed:
        raise ValueError(f"{problem}: {', '.join(changed)}; the checkpoint would not describe the model saved")


def _other_weights(root: Path) -> list[Path]:
    """Files of ``root`` that are weights ``save`` does not write: a shard index, other safetensors."""
    if not root.is_dir():
        return []
    others = [f for f in sorted(root.glob("*.safetensors")) if f.name != WEIGHTS_FILE]
    return ([root / INDEX_FILE] if (root / INDEX_FILE).exists() else []) + others


def _write_synced(write: Callable[[Path], None], file: Path) -> None:
    """``write(file)`` then fsync it: the rename that publishes it must not outrun its bytes."""
    write(file)
    with open(file, "rb+") as f:
        os.fsync(f.fileno())


def save(
    model: HybridLM,
    path: str | Path,
    dtype: torch.dtype | str | None = None,
    extra_config: Mapping | None = None,
    *,
    replace_weights: bool = False,
) -> Path:
    """Write a transformers-format checkpoint (config.json + model.safetensors) that ``load`` and
    transformers both read, atomically.

    Everything is checked before the first byte is written: the config (transformers' form of it,
    ``extra_config`` JSON that does not change the model), ``dtype`` (a floating dtype: ``load``
    refuses others). The files are written into a temporary directory beside ``path`` and renamed
    into place, so a writer that dies partway (disk full, Ctrl-C) leaves the old checkpoint whole: a
    new directory appears whole or not at all; in an existing one, ``model.safetensors`` then
    ``config.json`` are each replaced by one rename (other files, a tokenizer say, are kept). A
    directory that holds other weights (a sharded checkpoint's index and shards, any other
    ``*.safetensors``) is refused, since ``load`` would then find two sets; ``replace_weights=True``
    removes them (moved aside first, deleted once the new files are in place).
    """
    from safetensors.torch import save_file

    if not isinstance(model, HybridLM):
        raise TypeError(f"save wants a labkit HybridLM (from labkit.build or labkit.load), got {type(model).__name__}")
    if not isinstance(replace_weights, bool):
        raise TypeError(f"replace_weights must be True or False, got {replace_weights!r}")
    given = Path(_as_path(path)).expanduser()
    root = given.absolute()  # "." has a name and a parent
    storage = model.dtype if dtype is None else as_dtype(dtype, allowed=None)
    config_text = _config_json(model.cfg, storage, extra_config)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root} is a file; save writes a checkpoint directory")
    others = _other_weights(root)
    if others and not replace_weights:
        raise CheckpointError(
            f"{root} already holds other weights ({_few([f.name for f in others])}): load would find two sets "
            "of weights there; save elsewhere, or pass replace_weights=True to remove them"
        )
    tensors = {k: v.to(storage) for k, v in hf_state_dict(model).items()}

    # A new checkpoint is staged beside its directory-to-be (renamed into place whole); an existing
    # directory stages inside itself (same file system, and only the directory need be writable).
    # Made by mkdir (not mkdtemp's 0700) so that, renamed into place, it has a directory's usual mode.
    fresh = not root.exists()
    name = f".{root.name}.saving-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = root.parent / name if fresh else root / name
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
    try:
        _write_synced(lambda f: save_file(tensors, str(f), metadata={"format": "pt"}), staging / WEIGHTS_FILE)
        _write_synced(lambda f: f.write_text(config_text), staging / "config.json")
        if fresh:
            os.rename(staging, root)  # the whole checkpoint appears at once
            return given
        aside = staging / "replaced"  # old weights leave before the new arrive: never two sets at once
        aside.mkdir()
        for f in others:
            os.replace(f, aside / f.name)
        os.replace(staging / WEIGHTS_FILE, root / WEIGHTS_FILE)
        os.replace(staging / "config.json", root / "config.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return given
