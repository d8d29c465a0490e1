"""labkit.weights.weights_key: memoized per model, and still changes whenever the weights do."""

import torch

import labkit
from labkit.weights import _MEMOS, _describe, weights_key


def _model():
    return labkit.build("tiny-qwen3.5", dtype=torch.float32, device="cpu", seed=0)


def _walked(model):
    return tuple(_describe(model, []))


def test_the_same_model_gives_the_same_key_object_without_a_walk():
    model = _model()
    first = weights_key(model)
    assert first == _walked(model)
    assert weights_key(model) is first and model in _MEMOS


def test_an_in_place_change_changes_the_key():
    model = _model()
    before = weights_key(model)
    p = next(model.parameters())
    with torch.no_grad():
        p.add_(1)
    after = weights_key(model)
    assert after != before and after == _walked(model)


def test_a_replaced_parameter_changes_the_key():
    model = _model()
    before = weights_key(model)
    name, p = next(iter(model.named_parameters()))
    owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    setattr(owner, name.rpartition(".")[2], torch.nn.Parameter(p.detach().clone()))
    after = weights_key(model)
    assert after != before and after == _walked(model)


def test_a_data_assignment_a_new_buffer_and_a_deleted_module_change_the_key():
    model = _model()
    key = weights_key(model)
    p = next(model.parameters())
    p.data = p.data.clone()  # same Parameter object, new storage
    assert weights_key(model) != key and weights_key(model) == _walked(model)
    key = weights_key(model)
    model.register_buffer("extra", torch.zeros(3))
    assert weights_key(model) != key and weights_key(model) == _walked(model)
    key = weights_key(model)
    name = next(iter(model._modules))
    setattr(model, name, torch.nn.Identity())  # a subtree replaced: its tensors are gone from the key
    assert weights_key(model) != key and weights_key(model) == _walked(model)


def test_the_memo_does_not_keep_a_model_alive():
    import gc
    import weakref

    model = _model()
    weights_key(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
