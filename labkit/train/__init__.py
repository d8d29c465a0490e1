"""Train small byte-level models of both families on text every Python machine has.

    python -m labkit train-tiny --family lfm2       # -> data/checkpoints/byte-lfm2-6m    (H200: ~3 min)
    python -m labkit train-tiny --family qwen3.5    # -> data/checkpoints/byte-qwen3.5-6m (H200: ~5.5 min)
    python -m labkit train-tiny --export-corpus build/corpus     # this Python's corpus, to train on elsewhere
    python -m labkit train-tiny --family lfm2 --corpus-root build/corpus

The point is a checkpoint that generates recognisable text offline, for the workbook's decode
experiments; these are toy models, not useful language models.

    options  every option of a run, declared once (command line, ``train()``'s keywords, record)
    configs  the byte-vocabulary model configurations of both families
    corpus   the Python standard library as train and held-out token streams; held-out windows
    loop     initial weights, loss (the model's own forward), learning-rate schedule, the loop
    run      one run: corpus, model, loop, final evaluation, checkpoint, record
    card     the model card, from the record
    cli      ``python -m labkit train-tiny`` (also ``python -m labkit.train``)
"""

from .card import model_card
from .cli import main
from .configs import FAMILIES, SIZES, byte_config
from .corpus import (
    Corpus,
    corpus_files,
    eval_windows,
    export_corpus,
    is_heldout,
    load_corpus,
    pack_windows,
    stdlib_root,
    unpack_windows,
)
from .loop import heldout_loss, init_for_training, loss_sum, lr_at
from .options import TrainOptions
from .run import run_training, train

__all__ = [
    "FAMILIES",
    "SIZES",
    "Corpus",
    "TrainOptions",
    "byte_config",
    "corpus_files",
    "eval_windows",
    "export_corpus",
    "heldout_loss",
    "init_for_training",
    "is_heldout",
    "load_corpus",
    "loss_sum",
    "lr_at",
    "main",
    "model_card",
    "pack_windows",
    "run_training",
    "stdlib_root",
    "train",
    "unpack_windows",
]
