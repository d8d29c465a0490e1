"""labkit: hybrid-model decoding (LFM2 short-conv, Qwen3.5 Gated DeltaNet) made fast, step by step.

    import labkit
    model = labkit.build("lfm2-350m", dtype=torch.bfloat16, device="cuda")
    out = labkit.generate(model, input_ids, max_new_tokens=128, backend="reference")

This namespace is the product: models, caches, decoders, checkpoints. The workbook's lab tooling
(measurement, plots, notebook glue, and the source article's *approximate* cache,
``labkit.lab.article_cache.ArticleCache``) lives under ``labkit.lab``, ``labkit.bench``,
``labkit.train`` and ``labkit.distributed``, which import the product and are never imported by it
(tests/test_layering.py).
"""

from .decode.registry import BACKENDS
from .cache import CacheFullError, HybridCache
from .checkpoint import CheckpointError, load, save
from .shipped import CHECKPOINTS, available_checkpoints, checkpoint_path
from .config import PRESETS, ModelConfig
from .generate import GenerationResult, generate
from .model import HybridLM, build
from .prefix_cache import PrefixCache
from .tokenizer import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "ByteTokenizer",
    "CHECKPOINTS",
    "CacheFullError",
    "CheckpointError",
    "GenerationResult",
    "HybridCache",
    "HybridLM",
    "ModelConfig",
    "PRESETS",
    "PrefixCache",
    "available_checkpoints",
    "build",
    "checkpoint_path",
    "generate",
    "load",
    "save",
]
