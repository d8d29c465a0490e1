"""A model made under ``torch.inference_mode()`` (built or loaded inside it) generates with every rung
and with a PrefixCache, inside inference mode or outside it. Its weights are inference tensors, which
have no version counter: the weights key (labkit.weights) used to raise "Inference tensors do not
track version counter"."""

import contextlib

import pytest
import torch

import labkit
from conftest import random_prompt

RUNGS = ("reference", "reference+graph", "fused", "fused+graph")  # +pdl needs a Hopper GPU


def _made_inside(how, tmp_path):
    if how == "load":
        labkit.save(labkit.build("tiny-lfm2", dtype=torch.float32, seed=0), tmp_path / "ckpt")
    with torch.inference_mode():
        if how == "load":
            return labkit.load(tmp_path / "ckpt", dtype=torch.float32)
        return labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)


@pytest.mark.parametrize("how,generate_inside", [("build", False), ("load", False), ("build", True)])
def test_every_rung_and_the_prefix_cache_work(how, generate_inside, graphs, tmp_path):
    model = _made_inside(how, tmp_path)
    assert next(model.parameters()).is_inference()
    ids = random_prompt(model, 1, 9)
    want = labkit.generate(labkit.build("tiny-lfm2", dtype=torch.float32, seed=0), ids, 3).tokens
    with torch.inference_mode() if generate_inside else contextlib.nullcontext():
        for rung in RUNGS:
            assert torch.equal(labkit.generate(model, ids, 3, backend=rung).tokens, want), rung
        prefix = labkit.PrefixCache(model, 4, budget_bytes=10**8)
        for rung in ("reference", "fused+graph"):
            out = labkit.generate(model, ids, 3, backend=rung, prefix_cache=prefix)
            assert torch.equal(out.tokens, want), rung
        assert out.prefix_hit == 8


def test_one_model_generates_inside_and_then_outside_inference_mode(graphs):
    """The pooled decoders, their caches and graphs, and the prefix cache's snapshots made inside
    inference mode serve a later call outside it, and the other way round."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    ids = random_prompt(model, 1, 9)
    want = labkit.generate(model, ids, 3).tokens
    prefix = labkit.PrefixCache(model, 4, budget_bytes=10**8)
    for inside in (True, False, True):
        with torch.inference_mode(inside):
            for rung in ("fused", "fused+graph"):
                assert torch.equal(labkit.generate(model, ids, 3, backend=rung, prefix_cache=prefix).tokens, want)
                assert torch.equal(labkit.generate(model, ids, 3, backend=rung).tokens, want)
