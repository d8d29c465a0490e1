"""A deterministic set of requests, cut into batches, and the share of the batches each replica serves.

labkit decodes a batch in lock step (one cache length for all its sequences, no attention mask), so
a batch holds prompts of one length; lengths vary from batch to batch, as a server that buckets
requests by length would see. The batches are fixed before any rank sees them, and depend only on
the seed, the batch size and the lengths asked for, never on how many ranks serve them: a batch
gives the same tokens whichever replica decodes it, so the job's tokens can be compared with a
single-GPU run request by request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RequestBatch:
    index: int  # position in the request set
    request_ids: tuple[int, ...]  # ids of its requests, consecutive, in request order
    prompt: torch.Tensor  # [batch, length] int64 token ids (on the CPU)

    @property
    def prompt_len(self) -> int:
        return self.prompt.shape[1]


def make_requests(vocab_size: int, batch: int, batches: int, prompt_min: int, prompt_max: int,
                  seed: int = 0) -> list[RequestBatch]:
    """``batches`` batches of ``batch`` random-token prompts, each batch of one length drawn from
    ``[prompt_min, prompt_max]``; request ``i`` is row ``i % batch`` of batch ``i // batch``."""
    if batch < 1 or batches < 1:
        raise ValueError(f"need at least one batch of at least one request, got {batches} batches of {batch}")
    if not 1 <= prompt_min <= prompt_max:
        raise ValueError(f"prompt lengths must satisfy 1 <= min <= max, got [{prompt_min}, {prompt_max}]")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt_min, prompt_max + 1, (batches,), generator=gen).tolist()
    out = []
    for g, length in enumerate(lengths):
        prompt = torch.randint(0, vocab_size, (batch, length), generator=gen)
        out.append(RequestBatch(g, tuple(range(g * batch, (g + 1) * batch)), prompt))
    return out


def shard(batches: list[RequestBatch], rank: int, world_size: int) -> list[RequestBatch]:
    """The batches replica ``rank`` of ``world_size`` serves: every ``world_size``-th, from ``rank``.

    Round robin keeps the shares within one batch of each other, and each replica's queue in
    request order. Every replica must get at least one batch.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    if len(batches) < world_size:
        raise ValueError(
            f"more ranks ({world_size}) than batches of requests ({len(batches)}): every replica needs at "
            "least one batch; ask for more batches (--num-batches) or fewer ranks (--nproc / --nnodes)"
        )
    return batches[rank::world_size]
