"""Deterministic request streams for measuring prefix caches: the same seed gives the same tokens.

Three shapes of traffic, the cases a prefix cache is for and against:

- :func:`shared_prefix`: many requests that start with one long system prompt and end in their own
  short question (every request after the first can reuse the system prompt);
- :func:`multi_turn`: chats whose every turn resends the whole conversation so far (the previous
  prompt, the model's reply, the user's next message), several chats interleaved as a server sees
  them (each turn can reuse the chat's previous prompt);
- :func:`unrelated`: independent prompts (the no-hit case: a cache only costs here).

Token ids are drawn uniformly from ``[0, vocab)`` by a seeded generator; replies are drawn too
(a cache sees only token ids, so what matters is which prefixes repeat, not what they say).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    tokens: tuple[int, ...]
    session: str  # which stream it belongs to ("system", "chat-3", "unrelated")
    turn: int = 0  # its turn in the session

    def __len__(self) -> int:
        return len(self.tokens)


def _tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(n))


def _check(vocab: int, **sizes: int) -> None:
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    for name, n in sizes.items():
        if n < 0 or not isinstance(n, int):
            raise ValueError(f"{name} must be a non-negative int, got {n!r}")


def shared_prefix(requests: int, prefix_len: int, suffix_len: int, vocab: int, seed: int = 0) -> list[Request]:
    """``requests`` prompts of one shared ``prefix_len``-token system prompt + their own ``suffix_len`` tokens."""
    _check(vocab, requests=requests, prefix_len=prefix_len, suffix_len=suffix_len)
    rng = random.Random(f"shared-{seed}")
    system = _tokens(rng, prefix_len, vocab)
    return [Request(system + _tokens(rng, suffix_len, vocab), "system", i) for i in range(requests)]


def multi_turn(chats: int, turns: int, first_len: int, reply_len: int, user_len: int, vocab: int,
               seed: int = 0) -> list[Request]:
    """``chats`` conversations of ``turns`` prompts each, interleaved round-robin (chat 0 turn 0, chat 1
    turn 0, ..., chat 0 turn 1, ...). Turn 0 is ``first_len`` tokens; turn t+1 is turn t's prompt +
    a ``reply_len``-token reply + a ``user_len``-token message."""
    _check(vocab, chats=chats, turns=turns, first_len=first_len, reply_len=reply_len, user_len=user_len)
    rng = random.Random(f"chat-{seed}")
    prompts = []
    for c in range(chats):
        prompt, rows = _tokens(rng, first_len, vocab), []
        for t in range(turns):
            if t:
                prompt = prompt + _tokens(rng, reply_len, vocab) + _tokens(rng, user_len, vocab)
            rows.append(Request(prompt, f"chat-{c}", t))
        prompts.append(rows)
    return [prompts[c][t] for t in range(turns) for c in range(chats)]


def unrelated(requests: int, length: int, vocab: int, seed: int = 0) -> list[Request]:
    """``requests`` independent prompts of ``length`` tokens."""
    _check(vocab, requests=requests, length=length)
    rng = random.Random(f"unrelated-{seed}")
    return [Request(_tokens(rng, length, vocab), "unrelated", i) for i in range(requests)]


def reusable_tokens(requests: list[Request], block_size: int) -> int:
    """The most prompt tokens an unbounded exact prefix cache of ``block_size`` could restore over the
    stream: per request, the whole blocks (never the last token) of its longest prefix already seen
    as a block-aligned prefix of an earlier prompt. The ceiling a budgeted cache is measured against."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for req in requests:
        usable = (len(req) - 1) // block_size
        hit = 0
        for j in range(1, usable + 1):
            if req.tokens[: j * block_size] not in seen:
                break
            hit = j
        total += hit * block_size
        for j in range(1, len(req) // block_size + 1):
            seen.add(req.tokens[: j * block_size])
    return total
