"""labkit.weights.weights_key: memoized per model, and still changes whenever the weights do, including
edits through ``.data`` that torch's version counter does not see."""

import torch

import labkit
from labkit.weights import _MEMOS, _Memo, weights_key


def _model():
    return labkit.build("tiny-qwen3.5", dtype=torch.float32, device="cpu", seed=0)


def _walked(model):
    """The key a fresh walk gives (no memo)."""
    memo = _Memo(model)
    return memo.with_values([ref() for ref in memo.tensors])


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


def test_an_edit_through_data_changes_the_key():
    """``p.data`` has its own version counter: ``p.data.mul_(3)`` leaves storage and version as they
    were; the fingerprint of sampled values moves."""
    model = _model()
    before = weights_key(model)
    p = next(model.parameters())
    p.data.mul_(3)
    after = weights_key(model)
    assert after.places == before.places  # what torch counts did not move
    assert after != before and after == _walked(model)
    assert weights_key(model) is after  # and it is memoized again


def test_a_reshaped_data_changes_the_key():
    """``p.data = p.data.reshape(...)``: the same storage, version and sampled values, another shape."""
    model = _model()
    before = weights_key(model)
    p = next(model.parameters())
    p.data = p.data.reshape(-1)
    after = weights_key(model)
    assert after != before and after == _walked(model)
    assert after.fingerprint == before.fingerprint  # only the shape tells


def test_the_same_weights_in_another_model_have_the_same_values_not_the_same_key():
    a, b = _model(), _model()  # the same seed: equal values, other storage
    assert weights_key(a) != weights_key(b) and weights_key(a).same_values(weights_key(b))
    c = labkit.build("tiny-qwen3.5", dtype=torch.float32, device="cpu", seed=1)
    assert not weights_key(a).same_values(weights_key(c))


def test_a_model_made_under_inference_mode_has_a_key():
    """Inference tensors have no version counter (reading it raises): their key is address and values."""
    with torch.inference_mode():
        model = _model()
        key = weights_key(model)
    assert weights_key(model) is key
    with torch.inference_mode():
        next(model.parameters()).mul_(3)  # in place, inside inference mode: no counter anywhere
    assert weights_key(model) != key and weights_key(model) == _walked(model)


def test_the_rungs_key_leaves_the_values_out_and_prefix_caches_add_them():
    """A rung's key (values=False) reads no fingerprint and stays the same across a .data edit (its
    plan reads the tensors in place); with_values adds the fingerprint to that very key, which sees it."""
    from labkit.weights import with_values

    model = _model()
    tensors_key = weights_key(model, values=False)
    assert tensors_key.fingerprint is None and weights_key(model, values=False) is tensors_key
    full = with_values(model, tensors_key)
    assert full == weights_key(model) and full.same_tensors(tensors_key)
    model.layers[0].mixer_norm.weight.data.mul_(3)
    assert weights_key(model, values=False) is tensors_key  # nothing a graph binds changed
    assert with_values(model, tensors_key) != full  # the snapshot's values did
    try:
        tensors_key.same_values(full)
    except ValueError:
        pass
    else:
        raise AssertionError("same_values compared a key without its fingerprint")


def test_values_later_gives_the_key_with_values_gives():
    """The prefix cache's two-step read (launch, host work, wait) gives the very key of the one-step
    read, from a rung's tensors key, a full key or nothing; and sees a .data edit made before it."""
    from labkit.weights import values_later, with_values

    model = _model()
    tensors_key = weights_key(model, values=False)
    full = weights_key(model)
    assert values_later(model, tensors_key)() is with_values(model, tensors_key) is full
    assert values_later(model, full)() is full and values_later(model)() is full
    model.layers[0].mixer_norm.weight.data.mul_(3)
    later = values_later(model, tensors_key)()
    assert later != full and later == _walked(model) and later.same_tensors(tensors_key)
