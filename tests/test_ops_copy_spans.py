"""labkit.ops.copy_spans: one launch of the span kernel against one copy per tensor pair.

The kernel runs in Triton's interpreter here (its addresses are host memory), on irregular spans:
odd lengths, views at odd offsets (word and alignment fall to 1 or 2 bytes), spans longer than one
program's piece (several programs per span), and mixed dtypes in one table. Destinations are
poisoned first, so a word the kernel does not write fails; memory next to a destination is
checked untouched (a span must not run past its end).
"""

import numpy as np
import pytest
import torch

from labkit.ops.copy_spans import BLOCK_BYTES, launch_copy_spans
from labkit.ops.spans import Spans, _word_and_align, copy_spans_ref, run_table


def _pairs(shapes_dtypes, seed=0, offset=0):
    """(source, destination) pairs; destinations are views into NaN-poisoned (or -7) buffers with one
    guard element on each side."""
    gen = torch.Generator().manual_seed(seed)
    pairs, guards = [], []
    for shape, dtype in shapes_dtypes:
        n = int(np.prod(shape))
        if dtype.is_floating_point:
            src_buf = torch.randn(n + offset, generator=gen).to(dtype)
            dst_buf = torch.full((n + 2,), float("nan"), dtype=dtype)
        else:
            src_buf = torch.randint(-100, 100, (n + offset,), generator=gen, dtype=dtype)
            dst_buf = torch.full((n + 2,), -7, dtype=dtype)
        pairs.append((src_buf[offset:].view(shape), dst_buf[1:n + 1].view(shape)))
        guards.append(dst_buf)
    return pairs, guards


def _expected(pairs):
    want = [torch.empty_like(d) for _, d in pairs]
    copy_spans_ref([(s, w) for (s, _), w in zip(pairs, want)])
    return want


def _check(pairs, guards, want):
    for (_, dst), w, buf in zip(pairs, want, guards):
        assert torch.equal(dst, w), "a span was not copied exactly (or not at all)"
        first, last = buf[0], buf[-1]
        untouched = torch.isnan(first) if buf.dtype.is_floating_point else first == -7
        untouched_end = torch.isnan(last) if buf.dtype.is_floating_point else last == -7
        assert untouched and untouched_end, "a span ran past its destination"


CASES = {
    "irregular mixed": [((3, 5), torch.bfloat16), ((7,), torch.float32), ((33, 65), torch.float16), ((1,), torch.int8)],
    "longer than a piece": [((BLOCK_BYTES // 4 + 37,), torch.float32), ((3, 4099), torch.bfloat16)],
    "aligned rows": [((64, 16), torch.bfloat16), ((16, 8, 8), torch.float32)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("offset", [0, 1])
def test_the_kernel_copies_every_span_exactly(case, offset):
    pairs, guards = _pairs(CASES[case], seed=len(case), offset=offset)
    want = _expected(pairs)
    spans = Spans.of(pairs)
    table, word, align, longest = spans.table()
    launch_copy_spans(table, word, align, longest)  # the kernel, in the interpreter
    _check(pairs, guards, want)


def test_the_host_path_runs_the_same_copies():
    pairs, guards = _pairs(CASES["irregular mixed"], seed=3, offset=1)
    want = _expected(pairs)
    Spans.of(pairs).run()  # host memory: a memmove per span
    _check(pairs, guards, want)
    pairs, guards = _pairs(CASES["aligned rows"], seed=4)
    want = _expected(pairs)
    run_table(*Spans.of(pairs).table())  # a staged table of host memory
    _check(pairs, guards, want)


def test_word_and_alignment_follow_the_least_aligned_span():
    as_array = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    assert _word_and_align(as_array([4096, 8192]), as_array([256])) == (8, 16)
    assert _word_and_align(as_array([4096, 8196]), as_array([256])) == (4, 4)
    assert _word_and_align(as_array([4096, 8192]), as_array([6])) == (2, 2)
    assert _word_and_align(as_array([4097, 8192]), as_array([256])) == (1, 1)


def test_joined_tables_run_together():
    a, ga = _pairs(CASES["aligned rows"], seed=5)
    b, gb = _pairs(CASES["irregular mixed"], seed=6)
    want = _expected(a + b)
    joined = Spans.join([Spans.of(a), Spans.of(b)], torch.device("cpu"))
    assert len(joined) == len(a) + len(b) and joined.total_bytes == sum(s.numel() * s.element_size() for s, _ in a + b)
    table, word, align, longest = joined.table()
    launch_copy_spans(table, word, align, longest)
    _check(a + b, ga + gb, want)


def test_bad_tables_are_refused():
    with pytest.raises(TypeError, match="table must have dtype torch.int64"):
        launch_copy_spans(torch.zeros(2, 3, dtype=torch.int32), 4, 4, 1)
    with pytest.raises(ValueError, match=r"table must have shape \[\*, 3\]"):
        launch_copy_spans(torch.zeros(2, 2, dtype=torch.int64), 4, 4, 1)
    with pytest.raises(ValueError, match="word must be 1, 2, 4 or 8"):
        launch_copy_spans(torch.zeros(2, 3, dtype=torch.int64), 3, 4, 1)
    with pytest.raises(ValueError, match="align must be a power of two"):
        launch_copy_spans(torch.zeros(2, 3, dtype=torch.int64), 8, 4, 1)
    with pytest.raises(ValueError, match="one shape and dtype"):
        Spans.of([(torch.zeros(3), torch.zeros(4))])
    with pytest.raises(ValueError, match="at least one"):
        Spans.of([])
