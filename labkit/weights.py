"""A model's weights key: what a plan, a captured graph or a prefix snapshot depends on.

:func:`weights_key` is taken on every prefill (by :meth:`labkit.decode.fused.FusedDecoder.refresh`, by
:class:`labkit.PrefixCache` on every hit), so its cost is paid on every time to first token. Walking
the module tree and reading every tensor's metadata costs ~0.2-0.3 ms of Python on Qwen3.5-0.8B; a
prefix-cache hit is ~4 ms in all, so the walk is memoized per model object. The memo is exact: it
returns the key a full walk would return. It keeps weak references to the modules and tensors it
saw and, on each call, re-reads in a few C-level passes (``map`` over the memo's lists, no Python
call per tensor) the facts the key is made of: every module's parameter, buffer and child names,
that each entry is still the very object seen, and each tensor's storage address, in-place version
counter, shape and dtype. Any difference, or a module or tensor that died, and the key is walked
again.

What it saves is the walk's Python, not the reading of the facts: on a CPU, for Qwen3.5-0.8B's
136 modules and 236 tensors (built on the meta device), a full walk took ~306 us and a memoized
call ~225 us (11 Python calls instead of ~1,000), of which ~90 us is reading four facts of each
tensor; on the H200 machine's host, 0.219 ms against 0.232 (data/bench/nvidia-h200/hit-host.json):
the facts cost what the walk did. The saving that counts is not taking the key twice: ``generate``
hands the fused decoder's freshly checked key to :meth:`labkit.PrefixCache.prefill`.
"""

from __future__ import annotations

import operator
import weakref
from itertools import chain

import torch
from torch import nn

__all__ = ["weights_key"]


def _describe(module: nn.Module, out: list, modules: list | None = None) -> list:
    """(name, storage, in-place version, shape) of every parameter and buffer under ``module``, with
    the names of the submodules between them (a plain walk: module.named_parameters() is 4x slower).
    ``modules`` collects the modules walked, in the walk's order (the memo's fast pass re-reads them)."""
    if modules is not None:
        modules.append(module)
    for tensors in (module._parameters, module._buffers):
        out.extend((name, t.data_ptr(), t._version, t.shape) for name, t in tensors.items() if t is not None)
    for name, child in module._modules.items():
        if child is not None:
            out.append(name)
            _describe(child, out, modules)
    return out


_DICTS = operator.attrgetter("_parameters", "_buffers", "_modules")
_VERSION = operator.attrgetter("_version")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_NONE = type(None)  # calling it gives None: stands in for a weak reference to a None entry


def _ref(obj):
    return _NONE if obj is None else weakref.ref(obj)


def _facts(tensors: list[torch.Tensor]) -> tuple:
    """Storage addresses, version counters, shapes and dtypes: the per-tensor facts of the key (and
    dtype, which a conversion changes along with the address anyway)."""
    return (tuple(map(torch.Tensor.data_ptr, tensors)), tuple(map(_VERSION, tensors)),
            tuple(map(_SHAPE, tensors)), tuple(map(_DTYPE, tensors)))


class _Memo:
    """What one walk of a model saw, held weakly (a replaced weight is freed, not kept by the memo)."""

    __slots__ = ("modules", "names", "entries", "tensors", "facts", "key")

    def __init__(self, model: nn.Module) -> None:
        modules: list[nn.Module] = []
        self.key = tuple(_describe(model, [], modules))
        dicts = list(chain.from_iterable(map(_DICTS, modules)))
        entries = list(chain.from_iterable(map(dict.values, dicts)))
        tensors = [t for t in entries if isinstance(t, torch.Tensor)]
        self.modules = [weakref.ref(m) for m in modules]
        self.names = tuple(chain.from_iterable(dicts))  # every dict's keys, in order
        self.entries = [_ref(e) for e in entries]
        self.tensors = [weakref.ref(t) for t in tensors]
        self.facts = _facts(tensors)

    def still_holds(self) -> bool:
        """True if a walk now would give :attr:`key`: the same modules, entries (by identity) and names,
        each tensor at the same storage, version, shape and dtype."""
        modules = list(map(operator.call, self.modules))
        if None in modules:  # a module died: the tree changed
            return False
        dicts = list(chain.from_iterable(map(_DICTS, modules)))
        if tuple(chain.from_iterable(dicts)) != self.names:
            return False
        entries = list(chain.from_iterable(map(dict.values, dicts)))
        if not all(map(operator.is_, entries, map(operator.call, self.entries))):
            return False
        # the entries are the very objects seen, so the weak references to the tensors are alive
        return _facts(list(map(operator.call, self.tensors))) == self.facts


_MEMOS: "weakref.WeakKeyDictionary[nn.Module, _Memo]" = weakref.WeakKeyDictionary()


def weights_key(model: nn.Module) -> tuple:
    """What a plan depends on: the name, storage, in-place version and shape of every tensor of the model.

    Any change means a plan (and the graphs that captured it) may read stale weights: a replaced
    tensor, a moved or converted model (new storage), a renamed or deleted parameter, an in-place
    update. Metadata only, no device work. Memoized per model object (see the module's docstring):
    a repeated call re-checks the facts in ~20 Python calls instead of walking the tree, and returns
    the very same tuple while nothing changed. Writes through ``.data`` bypass the version counter
    and are not seen (a ``.data`` assignment of new storage is: its address differs).
    """
    memo = _MEMOS.get(model)
    if memo is None or not memo.still_holds():
        memo = _MEMOS[model] = _Memo(model)
    return memo.key
