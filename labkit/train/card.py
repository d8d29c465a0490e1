"""The model card (a checkpoint's README.md), written from the training record alone, so a record
re-makes its card anywhere."""

from __future__ import annotations

from typing import Any


def model_card(r: dict[str, Any]) -> str:
    """The README.md of a trained checkpoint, written from its training record."""
    cfg, c, f = r["model"]["config"], r["corpus"], r["final"]
    a = r["args"]
    kinds = cfg["layer_types"]
    pattern = " ".join({"conv": "C", "attention": "A", "gdn": "D"}[k] for k in kinds)
    if cfg["family"] == "lfm2":
        arch = (f"LFM2 structure: {len(kinds)} blocks, gated short convolution (kernel {cfg['conv_kernel']}) "
                f"in {kinds.count('conv')}, grouped-query attention in {kinds.count('attention')} "
                f"({cfg['num_heads']} query heads, {cfg['num_kv_heads']} KV heads, head dim {cfg['head_dim']}, "
                f"q/k RMSNorm, RoPE θ={cfg['rope_theta']:g})")
    else:
        arch = (f"Qwen3.5 structure: {len(kinds)} blocks, Gated DeltaNet in {kinds.count('gdn')} "
                f"({cfg['gdn_num_k_heads']} key heads × {cfg['gdn_k_head_dim']}, {cfg['gdn_num_v_heads']} value "
                f"heads × {cfg['gdn_v_head_dim']}, conv kernel {cfg['gdn_conv_kernel']}), gated attention in "
                f"{kinds.count('attention')} ({cfg['num_heads']} query heads, {cfg['num_kv_heads']} KV heads, "
                f"head dim {cfg['head_dim']}, q/k RMSNorm, sigmoid output gate, RoPE on {cfg['rotary_dim']} of "
                f"{cfg['head_dim']} channels, θ={cfg['rope_theta']:g})")
    mb = (r["model"]["checkpoint_bytes"] or 0) / 1e6
    dev = r["device"]["name"] + (f" ({r['device']['type']})" if r["device"]["type"] != "cuda" else "")
    sample = r["sample"]["text"]
    fence = "```"
    while fence in sample:
        fence += "`"
    return f"""# {r['name']}

A toy byte-level language model with the structure of {'Liquid AI’s LFM2' if cfg['family'] == 'lfm2' else 'Qwen3.5'},
trained from scratch by `labkit.train` on the Python standard library's own source code, so that the
labkit workbook has a real trained model to decode, offline, with recognisable output. It is not a
useful language model and not a release of {'LFM2' if cfg['family'] == 'lfm2' else 'Qwen3.5'}; only the
architecture is shared.

## Model

- {arch}; SwiGLU MLP width {cfg['intermediate_size']} in every block; pattern `{pattern}`
  (C = short conv, D = Gated DeltaNet, A = attention).
- Hidden size {cfg['hidden_size']}, vocabulary {cfg['vocab_size']} (bytes 0-255, `<pad>`=256, `<bos>`=257,
  `<eos>`=258, 259-263 reserved; see `byte_tokenizer.json`), tied embeddings.
- {r['model']['parameters']:,} parameters; stored in bfloat16 ({mb:.1f} MB) in transformers' format
  (`config.json` + `model.safetensors`): `labkit.load` and `transformers.AutoModelForCausalLM` both read it.
- Trained context: {a['seq']} bytes (RoPE positions beyond it were never seen).

## Data

The `.py` files of the standard library of Python {c['python_version']} ({c['python_implementation']}),
found with `sysconfig.get_paths()["stdlib"]`{_exported(c)}, without the top-level directories
{', '.join(f'`{d}/`' for d in c['excluded_top_dirs'])}; the test suite is included. Each file is one
document, `<bos>` + its bytes + `<eos>`, in sorted path order. A file is held out when
`{c['heldout_rule']}`.

| split | files | tokens (≈ bytes) | sha256 of the token stream |
| --- | ---: | ---: | --- |
| train | {c['train_files']:,} | {c['train_tokens']:,} | `{c['train_sha256'][:16]}…` |
| held out | {c['heldout_files']:,} | {c['heldout_tokens']:,} | `{c['heldout_sha256'][:16]}…` |

Another Python version has a different standard library, hence a different corpus: the counts and
hashes above identify this one. License: the Python source is distributed by the Python Software
Foundation under the PSF License Agreement, which permits use, modification and redistribution of
derived works with its copyright notice retained; this model was trained on that text and its
samples may reproduce fragments of it.

## Training

{r['steps']:,} steps ({'stopped by the time budget' if r['stopped_by'] == 'time_budget' else 'all planned steps'})
of {a['batch']} random crops × {a['seq']} bytes = {r['tokens_seen'] / 1e6:.1f} M tokens seen
({r['epochs']:.3g} passes over the train split), in {r['seconds']['train']:.0f} s on {dev}
({r['steps_per_s']:.1f} steps/s), {'bfloat16 autocast' if r['autocast'] else 'float32'}. AdamW
(β = 0.9, 0.95; weight decay {a['weight_decay']} on matrices), peak learning rate {a['lr']:g} after
{r['warmup_steps']} warmup steps, cosine decay to {a['min_lr_ratio']:g}× (by steps or by elapsed time,
whichever is further along), gradient clipping at {a['grad_clip']}, seed {a['seed']}.
Date {r['date']}; Python {r['versions']['python']}, torch {r['versions']['torch']},
labkit {r['versions']['labkit']}{_commit(r['versions'].get('git_commit'))}.

```
{r['command']}
```

## Results

| | nats / byte | bits / byte |
| --- | ---: | ---: |
| train loss (last {a['log_every']} steps, training precision) | {f['train_loss']:.4f} | {f['train_bits_per_byte']:.3f} |
| held-out loss ({f['heldout_windows']} windows × {f['window_tokens']} tokens, float32) | {f['heldout_loss']:.4f} | {f['heldout_bits_per_byte']:.3f} |

{_per_char(c, f)}The held-out figure is a float32 forward of the saved bfloat16 weights. `training.json` has the whole
history, every argument, the versions and a stored subset of held-out windows
({len(r['check']['window_indices'])} windows, loss {r['check']['loss']:.4f} nats/byte) that the tests
recompute.

Greedy continuation of `{r['sample']['prompt']}` ({r['sample']['max_new_tokens']} bytes at most, reference
backend, float32, CPU):

{fence}python
{r['sample']['prompt']}{sample}
{fence}

## Use

```python
import torch, labkit

path = labkit.checkpoint_path("{r['name']}")
model = labkit.load(path, dtype=torch.float32)
tok = labkit.ByteTokenizer.from_checkpoint(path)
ids = torch.tensor([tok.encode("{r['sample']['prompt']}")])
out = labkit.generate(model, ids, max_new_tokens=96, stop_tokens=[tok.eos_id])
print(tok.decode(out.tokens[0]))
```
"""


def _per_char(c: dict[str, Any], f: dict[str, Any]) -> str:
    if "heldout_bytes_per_char" not in c:  # records made before the corpus counted characters
        return ""
    bpc = c["heldout_bytes_per_char"]
    return (f"The held-out text has {bpc:.4f} bytes per character (UTF-8; train split "
            f"{c['train_bytes_per_char']:.4f}),\nso the held-out loss is "
            f"{f['heldout_bits_per_byte'] * bpc:.3f} bits per character.\n\n")


def _exported(c: dict[str, Any]) -> str:
    if c.get("corpus_root", c["stdlib_root"]) == c["stdlib_root"]:
        return ""
    return f" (`{c['stdlib_root']}`, exported with `--export-corpus` and read from a copy)"


def _commit(commit: str | None) -> str:
    if not commit:
        return ""
    return f" at commit {commit[:12]}" + (" with uncommitted changes" if commit.endswith("-dirty") else "")
