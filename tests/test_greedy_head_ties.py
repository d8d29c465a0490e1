"""Greedy-head ties at the scale of a real LM head: the first maximal column must win, as with torch.argmax.

The second kernel of :func:`labkit.ops.greedy_head.greedy_head` reduces the per-tile winners in
blocks of up to 4096 tiles, one lane per tile of a block. A tie between tiles in one block is
settled across lanes; a tie between tiles that fall on the same lane of different blocks is
settled by the running comparison inside a lane, which only a head with more than 4096 tiles
reaches (Qwen3.5's 248,320-row head in 16-row tiles has 15,520). Streaming such a head through the
interpreter would take minutes, so these tests stand in for the stream and write the per-tile
winners themselves; the reduction, its launch and its block size are the library's own.
"""

import math

import pytest
import torch

import labkit.ops.greedy_head as gh
from labkit.ops.greedy_head import GreedyHeadBuffers, greedy_head, greedy_head_ref
from labkit.ops.linear import LinearConfig

BLOCK_N = 16
REDUCE_BLOCK = 4096  # tiles per block of the reduction (greedy_head caps its block there)
VOCAB = 248_320  # Qwen3.5's vocabulary: 15,520 tiles of 16 rows, 4 reduction blocks


def _winners(rows: int, tiles: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tile (max, first argmax) as the LM-head stream writes them: values below 1, and each
    index inside its own tile."""
    g = torch.Generator().manual_seed(seed)
    val = torch.rand(rows, tiles, generator=g) * 0.9
    in_tile = torch.randint(0, BLOCK_N, (rows, tiles), generator=g, dtype=torch.int32)
    idx = torch.arange(tiles, dtype=torch.int32) * BLOCK_N + in_tile
    return val, idx


def _run_with_stream(monkeypatch, val, idx, device, vocab=VOCAB):
    """greedy_head over a [vocab, 1] head whose stream is replaced by the given per-tile winners."""
    rows, tiles = val.shape
    cfg = LinearConfig(1, BLOCK_N, 16)
    calls = []

    def stream(x, weight, *, config, best_val, best_idx, **_):
        assert config is cfg and best_val.shape == best_idx.shape == (rows, tiles)
        best_val.copy_(val)
        best_idx.copy_(idx)
        calls.append(1)

    monkeypatch.setattr(gh, "launch_linear", stream)
    x = torch.zeros(rows, 1, device=device)
    w = torch.zeros(vocab, 1, device=device)
    buffers = GreedyHeadBuffers.allocate(rows, vocab, cfg, device)
    tokens = torch.full((rows,), -1, dtype=torch.long, device=device)
    greedy_head(x, w, config=cfg, buffers=buffers, tokens_out=tokens)
    assert calls == [1]
    return tokens.cpu()


def _first_winner(val, idx):
    """The index held by the first tile with the row maximum (torch.argmax returns the first)."""
    return idx.gather(1, val.argmax(-1, keepdim=True))[:, 0].long()


def test_qwen35_head_has_several_reduction_blocks():
    tiles = math.ceil(VOCAB / BLOCK_N)
    assert tiles == 15_520 and tiles > 3 * REDUCE_BLOCK


@pytest.mark.parametrize(
    "tied_tiles",
    [
        # the same lane of different blocks: only the in-lane comparison orders them
        (7, 7 + REDUCE_BLOCK, 7 + 3 * REDUCE_BLOCK),
        (4100, 4100 + REDUCE_BLOCK),
        # different lanes of different blocks, the later block on a smaller lane
        (4100, 2 * REDUCE_BLOCK + 1, 3 * REDUCE_BLOCK),
        # different lanes of one block, and the last, partial block
        (15_000, 13_000, 15_519),
        (0, 15_519),
        (15_519,),
    ],
)
def test_ties_across_reduction_blocks_pick_the_first_index(monkeypatch, device, tied_tiles):
    tiles = math.ceil(VOCAB / BLOCK_N)
    val, idx = _winners(3, tiles, seed=len(tied_tiles))
    # row 0 carries the tie; rows 1 and 2 their own clear winners, so a row mix-up shows too
    val[0, list(tied_tiles)] = 1.0
    val[1, 123] = val[2, tiles - 2] = 1.0
    got = _run_with_stream(monkeypatch, val, idx, device)
    want = _first_winner(val, idx)
    assert int(want[0]) == int(idx[0, min(tied_tiles)])
    assert torch.equal(got, want)


def test_a_negative_row_maximum_is_found(monkeypatch, device):
    """Every logit below zero (and -inf at one tile): the running maximum must start at -inf."""
    tiles = math.ceil(VOCAB / BLOCK_N)
    val, idx = _winners(2, tiles, seed=7)
    val = -1.0 - val
    val[0, 9000] = val[0, 9000 + REDUCE_BLOCK] = -0.5
    val[1, :] = float("-inf")
    val[1, 4097] = -3e38
    got = _run_with_stream(monkeypatch, val, idx, device)
    assert got.tolist() == [int(idx[0, 9000]), int(idx[1, 4097])]


def test_ties_inside_one_tile_pick_the_first_column(device):
    """The stream's own per-tile argmax, end to end: equal rows 5, 6 and 13 share a 16-row tile."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(40, 16, generator=g) / 4
    w[6] = w[13] = w[5]
    x = torch.stack([w[5] * 40, w[13] * 40, torch.randn(16, generator=g)])
    w, x = w.to(device), x.to(device)
    tokens = greedy_head(x, w, config=LinearConfig(1, BLOCK_N, 16))
    assert tokens[:2].tolist() == [5, 5]
    assert torch.equal(tokens, greedy_head_ref(x, w))
