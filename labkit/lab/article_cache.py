"""The source article's "two-level adaptive cache", as an experimental, APPROXIMATE decode option.

What the article proposes (its step 3, credited there with "-60% compute for stable contexts"):
level 1 keeps the raw q, k, v projections from before any gating; level 2 keeps partly computed
attention results and hands them back instead of computing, as long as the layer's gates are
"stable": an exponential moving average (EMA) of the gates is tracked, and a step whose gates
differ from it by less than a threshold (10% in the article) reuses level 2; otherwise the result
is computed again from level 1 with the current gates.

Why it can only be an approximation here. The exact cache of a Gated DeltaNet layer is already
its fixed-size state S [v_heads, k_dim, v_dim] (see labkit.ops.delta_rule): there is no growing
list of keys and scores to reuse, and every token must pass through the state once. For softmax
attention the exact cache is the KV cache, and a new query needs new scores against every key.
Reusing anything from an earlier step returns an earlier step's answer.

What this module does, per layer and per sequence, at each decode step (T = 1), and nothing at
prefill (T > 1 runs the exact core and empties level 2):

    s_t      = the layer's gate signal                      GDN: (g_t, beta_t) of every value head
                                                             attention: the query q_t (see below)
    change_t = ||s_t - m|| / ||m||,   m the EMA of s_1..s_{t-1}
    reuse    = level 2 holds an output  and  change_t < threshold
    m       <- (1 - ema_rate) m + ema_rate s_t              (after the test; m = s_1 at the first step)

- reuse (the skipped work):
    GDN:       o_t = level-2 output (the core's output at the last computed step); the token's raw
               q, k, v go to level 1 and the state S is not touched: no decay, no k^T S, no rank-1
               write, no readout q^T S.
    attention: o_t = level-2 output; no scores q_t . k_s, no softmax, no sum over values. Level 1
               is the KV cache itself (the raw, pre-gate k, v are written before the core runs);
               a past query is never read again in causal decoding, so none is kept.
- compute:
    GDN:       the tokens waiting in level 1 are folded into S first, "from the raw projections
               with the current gates", i.e. each with this step's g_t and beta_t (not their own,
               which the article's cache does not keep), then this token steps S exactly; the
               output refreshes level 2. The fold is the same delta rule over the waiting tokens
               and this one (padding with g = 0, beta = 0, which leaves S exactly as it was).
    attention: the exact core over every key; the output refreshes level 2.

So the errors are (a) a reused step returns a stale output, (b) a GDN token folded late sees the
gates of the fold step, and (c) on attention a reused step's own key reaches no output until the
next computed step. With ``threshold = 0`` nothing is ever reused (change < 0 is never true), the
wrapped cores are called with the model's own tensors, and the logits are the exact path's bit for
bit (tested).

The attention "gates". LFM2's attention has no gate; Qwen3.5's output gate multiplies the core's
output after the scores and cannot make old scores valid. What decides whether earlier scores
still hold is the query, so the signal of an attention layer is q_t as the core receives it (after
its norm and RoPE; the rotation is part of what changes the scores). LFM2's gated short-conv
layers have no scores and nothing to reuse (K-1 = 2 cached inputs, a few multiply-adds per
channel): the article's cache touches only LFM2's attention layers.

Work is counted, not estimated: every decision and every token that passes through a core is
counted as it happens, in FLOPs of the core (multiply and add counted apart):

    GDN, per token and value head:   state update 5 dk dv (decay dk dv, k^T S 2 dk dv, rank-1 2 dk dv),
                                     readout 2 dk dv;  exact step = 7 dk dv
    attention, per query head:       4 L hd over the L visible keys (scores 2 L hd, values 2 L hd)

A bound follows for Gated DeltaNet: as long as level 1 is honoured (every token reaches S once),
a reused step saves only its readout, so at most ``GDN_SKIP_BOUND`` = 2 / 7 of a GDN core's work
can be skipped, whatever the threshold. Attention can skip all of a reused step's core.

``skipped = exact - done - owed``, where ``owed`` is the update work of tokens still waiting in
level 1 (they will be folded at the layer's next computed step). The projections around the core
(in_proj, conv, out_proj) run at every step whatever level 2 holds; ``stats()`` also gives the
skipped work as a share of the mixers' and of the whole step's FLOPs (the weights' multiply-adds,
counted from their shapes).

Usage::

    ac = ArticleCache(model, threshold=0.1, ema_rate=0.5)
    logits = ac(ids, cache)        # model(ids, cache=cache) with the article's cache in the cores
    ac.stats()                     # decisions, reuses, FLOPs exact / done / owed / skipped
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..cache import HybridCache
from ..model import Attention, GatedDeltaNet, HybridLM
from ..ops.mixers import REFERENCE_CORES, MixerCores

DEFAULT_THRESHOLD = 0.10  # the article's "less than 10%"
DEFAULT_EMA_RATE = 0.5
GDN_UPDATE_FLOPS, GDN_READOUT_FLOPS = 5, 2  # per dk*dv element of each value head, see the module doc
GDN_SKIP_BOUND = GDN_READOUT_FLOPS / (GDN_UPDATE_FLOPS + GDN_READOUT_FLOPS)
KINDS = ("attention", "gdn")  # the layer kinds it can wrap
MIXER_OF_KIND = {"attention": Attention, "gdn": GatedDeltaNet}


@dataclass
class LayerWork:
    """What one layer's core did, in FLOPs, summed over decode steps and sequences."""

    kind: str
    decisions: int = 0  # (step, sequence) pairs decided
    reuses: int = 0  # of which level 2 was returned
    exact_flops: float = 0.0  # what the exact path's core does for the same steps
    done_flops: float = 0.0  # what this path's core did (folds included)
    owed_flops: float = 0.0  # update work of tokens still waiting in level 1
    projection_flops: float = 0.0  # in_proj (+conv) + out_proj, done at every step

    @property
    def skipped_flops(self) -> float:
        return self.exact_flops - self.done_flops - self.owed_flops


@dataclass
class _LayerState:
    ema: torch.Tensor | None = None  # [B, D] float32
    level2: torch.Tensor | None = None  # the core's output at each sequence's last computed step
    valid: torch.Tensor | None = None  # [B] bool: level 2 holds an output for this sequence
    pending: list = field(default_factory=list)  # GDN level 1: [(waiting: B host bools, q, k, v)] in order


def _check_parameters(threshold: float, ema_rate: float) -> None:
    if not isinstance(threshold, (int, float)) or math.isnan(threshold) or threshold < 0:
        raise ValueError(f"threshold must be a number >= 0 (a relative change of the gates), got {threshold!r}")
    if not isinstance(ema_rate, (int, float)) or not (0 < ema_rate <= 1):
        raise ValueError(f"ema_rate must be in (0, 1] (the weight of the newest gates in the EMA), got {ema_rate!r}")


class ArticleCache:
    """The article's two-level cache around a model's mixer cores (approximate; see the module doc).

    ``threshold``: reuse level 2 when the gates moved by less than this fraction of their EMA's norm
    (0: never, the exact path; ``inf``: always once level 2 holds an output). ``ema_rate``: weight of
    the newest gates in the EMA, in (0, 1] (1: compare with the previous step's gates). ``inner``:
    the exact cores it wraps (default: the references in labkit.ops.mixers). ``kinds``: the layer
    kinds whose cores it approximates (default both); the others' cores run exact and uncounted.
    """

    def __init__(self, model: HybridLM, threshold: float = DEFAULT_THRESHOLD, ema_rate: float = DEFAULT_EMA_RATE,
                 inner: MixerCores = REFERENCE_CORES, kinds: tuple[str, ...] = KINDS) -> None:
        _check_parameters(threshold, ema_rate)
        if not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
        self.kinds = tuple(kinds)
        self.model = model
        self.threshold = float(threshold)
        self.ema_rate = float(ema_rate)
        self.inner = inner
        self.cores = MixerCores(delta_rule=self._delta_rule if "gdn" in self.kinds else inner.delta_rule,
                                attend=self._attend if "attention" in self.kinds else inner.attend)
        wrapped = tuple(MIXER_OF_KIND[k] for k in self.kinds)
        self._mixers = {b.mixer.layer: b.mixer for b in model.layers if isinstance(b.mixer, wrapped)}
        self._layer: int | None = None
        self._batch: int | None = None
        self.reset()

    # -- running ------------------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, cache: HybridCache, last_only: bool = False) -> torch.Tensor:
        """``model(input_ids, cache=cache)`` with the article's cache in the attention and GDN cores."""
        if not isinstance(cache, HybridCache):
            raise ValueError("the article's cache works on the decode path: pass the model's HybridCache, "
                             f"got {type(cache).__name__}")
        # everything checked before any state changes: a refused call leaves this cache as it was
        self.model._check_input(input_ids, cache)
        if self._batch is not None and input_ids.shape[0] != self._batch:
            raise ValueError(f"this ArticleCache holds {self._batch} sequences, got a batch of {input_ids.shape[0]}; "
                             "reset() it for new sequences")
        if input_ids.shape[1] != 1 and any(st.pending for st in self._state.values()):
            # found here, not in the GDN core: by then the layers before it would have written the cache
            raise RuntimeError("a prefill continues sequences with tokens still waiting in level 1: decode them "
                               "one token at a time, or reset() this ArticleCache and the cache for new sequences")
        self._batch = input_ids.shape[0]
        with self._hooked():
            return self.model.forward_checked(input_ids, cache=cache, last_only=last_only, cores=self.cores)

    def reset(self) -> None:
        """Forget every sequence: EMAs, level 1 and level 2 (the work counts too)."""
        self._state = {i: _LayerState() for i in self._mixers}
        self.work = {i: LayerWork("attention" if isinstance(m, Attention) else "gdn") for i, m in self._mixers.items()}
        self._batch = None

    @contextmanager
    def _hooked(self):
        """Tell the shared cores which layer calls them: a pre-hook on each wrapped mixer."""
        def enter(module, _args):
            self._layer = module.layer

        def leave(_module, _args, _out):
            self._layer = None

        handles = [m.register_forward_pre_hook(enter) for m in self._mixers.values()]
        handles += [m.register_forward_hook(leave) for m in self._mixers.values()]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._layer = None

    def _current(self) -> tuple[_LayerState, LayerWork]:
        if self._layer is None:
            raise RuntimeError("ArticleCache.cores were called outside ArticleCache.__call__ (no layer is set)")
        return self._state[self._layer], self.work[self._layer]

    # -- the decision ---------------------------------------------------------------------------------
    def _decide(self, st: _LayerState, signal: torch.Tensor, extra: torch.Tensor | None = None) -> tuple[list[bool], list]:
        """Which sequences reuse level 2 (host list), updating the EMA; ``extra`` [B] rides the same sync."""
        signal = signal.float()
        B = signal.shape[0]
        if st.ema is None:
            st.ema = signal.clone()
            st.valid = torch.zeros(B, dtype=torch.bool, device=signal.device)
            change = torch.full((B,), float("inf"), device=signal.device)
        else:
            change = (signal - st.ema).norm(dim=-1) / st.ema.norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
            st.ema.mul_(1 - self.ema_rate).add_(signal, alpha=self.ema_rate)
        reuse = st.valid & (change < self.threshold)
        rows = torch.stack([reuse.float(), extra.float()]) if extra is not None else reuse[None].float()
        host = rows.tolist()  # the one device -> host sync of this layer's step
        return [bool(x) for x in host[0]], (host[1] if extra is not None else [])

    @staticmethod
    def _merge(computed: torch.Tensor, rows: list[int], reuse: list[bool], st: _LayerState) -> torch.Tensor:
        """The step's output: computed rows where computed, level 2 elsewhere; level 2 refreshed."""
        if not any(reuse):
            out = computed
        else:
            out = st.level2.clone()
            if rows:
                out[rows] = computed
        st.level2 = out
        st.valid.fill_(True)
        return out

    # -- Gated DeltaNet -------------------------------------------------------------------------------
    def _delta_rule(self, q, k, v, g, beta, state):
        st, work = self._current()
        if state is None:
            raise ValueError("the article's cache needs the layer's recurrent state (run with a HybridCache)")
        if q.shape[1] != 1:  # prefill: the exact core; level 2 no longer belongs to the newest token
            if st.pending:
                raise RuntimeError("a prefill continues sequences with tokens still waiting in level 1")
            st.valid = None if st.valid is None else torch.zeros_like(st.valid)
            return self.inner.delta_rule(q, k, v, g, beta, state)
        B, _, Hv, dv = v.shape
        dk = k.shape[-1]
        update, readout = float(GDN_UPDATE_FLOPS * Hv * dk * dv), float(GDN_READOUT_FLOPS * Hv * dk * dv)
        reuse, _ = self._decide(st, torch.cat([g[:, 0], beta[:, 0]], dim=-1))
        rows = [b for b in range(B) if not reuse[b]]
        work.decisions += B
        work.reuses += B - len(rows)
        work.exact_flops += B * (update + readout)
        folded = sum(w[b] for w, *_ in st.pending for b in rows)  # waiting tokens these rows fold now

        if rows and not st.pending and len(rows) == B:  # every sequence computes, nothing waits: exact
            o, new_state = self.inner.delta_rule(q, k, v, g, beta, state)
        elif rows:
            o, s_rows = self._fold_and_step(st, rows, q, k, v, g, beta, state)
            new_state = state.clone()
            new_state[rows] = s_rows
        else:
            o, new_state = None, state
        work.done_flops += len(rows) * (update + readout) + folded * update
        if any(reuse):  # this token waits in level 1 for the sequences that reuse
            st.pending.append((list(reuse), q, k, v))
        work.owed_flops = sum(sum(w) for w, *_ in st.pending) * update
        return self._merge(o, rows, reuse, st), new_state

    def _fold_and_step(self, st: _LayerState, rows: list[int], q, k, v, g, beta, state):
        """For the sequences ``rows``: fold their waiting tokens into S with the current gates, then
        step this token: one call of the exact core over [waiting..., this token]. An entry that does
        not wait for a sequence gets g = 0, beta = 0 there, which leaves its S exactly as it was."""
        idx = torch.tensor(rows, device=q.device)
        g_now, b_now = g[idx], beta[idx]  # [R, 1, Hv]: the current gates, for every folded token
        gs, bs = [], []
        for waiting, *_ in st.pending:
            w = torch.tensor([waiting[b] for b in rows], device=q.device)[:, None, None]
            gs.append(torch.where(w, g_now, torch.zeros_like(g_now)))
            bs.append(torch.where(w, b_now, torch.zeros_like(b_now)))
        seq = [torch.cat([e[i][idx] for e in st.pending] + [x[idx]], dim=1) for i, x in ((1, q), (2, k), (3, v))]
        o, s_rows = self.inner.delta_rule(*seq, torch.cat(gs + [g_now], dim=1), torch.cat(bs + [b_now], dim=1), state[idx])
        for waiting, *_ in st.pending:  # the folded tokens wait no more for these sequences
            for b in rows:
                waiting[b] = False
        st.pending = [e for e in st.pending if any(e[0])]
        return o[:, -1:], s_rows

    # -- attention --------------------------------------------------------------------------------------
    def _attend(self, q, keys, values, positions, key_positions):
        st, work = self._current()
        if q.shape[2] != 1:  # prefill: exact; level 2 no longer belongs to the newest token
            st.valid = None if st.valid is None else torch.zeros_like(st.valid)
            return self.inner.attend(q, keys, values, positions, key_positions)
        B, nh, _, hd = q.shape
        visible = (key_positions <= positions).sum(-1)  # [B] keys each query sees
        reuse, n_keys = self._decide(st, q[:, :, 0].reshape(B, nh * hd), extra=visible)
        rows = [b for b in range(B) if not reuse[b]]
        work.decisions += B
        work.reuses += B - len(rows)
        work.exact_flops += sum(4.0 * nh * hd * n for n in n_keys)
        work.done_flops += sum(4.0 * nh * hd * n_keys[b] for b in rows)
        if len(rows) == B:
            out = self.inner.attend(q, keys, values, positions, key_positions)
        elif rows:
            idx = torch.tensor(rows, device=q.device)
            out = self.inner.attend(q[idx], keys[idx], values[idx], positions[idx], key_positions[idx])
        else:
            out = None
        return self._merge(out, rows, reuse, st)

    # -- what it saved ------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counted work: per layer kind and in all, with the skipped share of the cores, of the mixers
        (projections included) and of the whole decode step."""
        steps = {i: w.decisions for i, w in self.work.items()}
        for i, w in self.work.items():
            w.projection_flops = steps[i] * _projection_flops(self._mixers[i])
        out: dict = {"threshold": self.threshold, "ema_rate": self.ema_rate, "by_kind": {}}
        for kind in ("attention", "gdn"):
            ws = [w for w in self.work.values() if w.kind == kind]
            if ws:
                out["by_kind"][kind] = _summary(ws)
        every = list(self.work.values())
        out["all"] = _summary(every)
        decisions = max(steps.values(), default=0)  # (step, sequence) pairs of the run
        step_flops = decisions * _step_flops(self.model) + sum(w.exact_flops for w in every)
        out["all"]["step_flops_exact"] = step_flops
        out["all"]["skipped_of_step"] = out["all"]["skipped_flops"] / step_flops if step_flops else 0.0
        return out


def _summary(ws: list[LayerWork]) -> dict:
    exact = sum(w.exact_flops for w in ws)
    skipped = sum(w.skipped_flops for w in ws)
    mixer = exact + sum(w.projection_flops for w in ws)
    decisions = sum(w.decisions for w in ws)
    return {
        "layers": len(ws), "decisions": decisions, "reuses": sum(w.reuses for w in ws),
        "reuse_fraction": sum(w.reuses for w in ws) / decisions if decisions else 0.0,
        "exact_flops": exact, "done_flops": sum(w.done_flops for w in ws), "owed_flops": sum(w.owed_flops for w in ws),
        "skipped_flops": skipped,
        "skipped_of_core": skipped / exact if exact else 0.0,
        "skipped_of_mixer": skipped / mixer if mixer else 0.0,
    }


def _projection_flops(mixer) -> float:
    """Multiply-adds of a mixer's weight matrices for one token (2 FLOPs each)."""
    return float(sum(2 * p.numel() for p in mixer.parameters() if p.dim() == 2))


def _step_flops(model: HybridLM) -> float:
    """The weights' FLOPs of one decode token: every matrix once (the embedding is a lookup; a tied
    lm_head is the embedding matrix, counted once as the head)."""
    flops = sum(2 * p.numel() for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed."))
    return float(flops + 2 * model.lm_head_weight.numel())


def core_share_of_step(model: HybridLM, context: int) -> dict:
    """The prediction before measuring: FLOPs of one decode token at ``context`` visible keys, split
    into the attention and GDN cores (what the article's cache can skip) and the weights (what it
    cannot), with the same per-element counts the cache counts at run time. Skipping every core
    entirely would save at most ``cores / total`` of the step."""
    cfg = model.cfg
    att = cfg.layer_types.count("attention") * 4.0 * cfg.num_heads * cfg.head_dim * context
    gdn = cfg.layer_types.count("gdn") * float(GDN_UPDATE_FLOPS + GDN_READOUT_FLOPS) * (
        cfg.gdn_num_v_heads * cfg.gdn_k_head_dim * cfg.gdn_v_head_dim if "gdn" in cfg.layer_types else 0)
    weights = _step_flops(model)
    total = att + gdn + weights
    return {"context": context, "attention_core": att, "gdn_core": gdn, "weights": weights, "total": total,
            "max_skippable_of_step": (att + gdn) / total,
            "gdn_bound_of_step": (att + GDN_SKIP_BOUND * gdn) / total}
