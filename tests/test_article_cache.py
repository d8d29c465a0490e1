"""labkit.lab.article_cache.ArticleCache (the article's two-level cache, approximate): threshold 0 is the exact path bit
for bit, skipping is counted exactly, bad parameters are refused, batches of 3 work; the bench's
rows and the plot. Tiny presets, random weights, a few decode steps: seconds on a CPU."""

import math

import pytest
import torch

import labkit
from labkit.lab.article_cache import ArticleCache

B, PROMPT, STEPS = 3, 5, 4


def _model(preset):
    return labkit.build(preset, dtype=torch.float32, seed=1)


def _ids(model, length, seed=0):
    return torch.randint(0, model.cfg.vocab_size, (B, length), generator=torch.Generator().manual_seed(seed))


def _decode(step, model, ids):
    """Logits of a prefill of PROMPT tokens then one decode call per remaining token."""
    cache = model.new_cache(B, ids.shape[1])
    out = [step(ids[:, :PROMPT], cache)[:, -1:]]
    out += [step(ids[:, t : t + 1], cache) for t in range(PROMPT, ids.shape[1])]
    return torch.cat(out, 1)


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_threshold_zero_is_the_exact_path_bit_for_bit(preset):
    model = _model(preset)
    ids = _ids(model, PROMPT + STEPS)
    exact = _decode(lambda i, c: model(i, cache=c), model, ids)
    ac = ArticleCache(model, threshold=0.0, ema_rate=0.3)
    got = _decode(ac, model, ids)
    assert torch.equal(got, exact)
    s = ac.stats()
    assert s["all"]["reuses"] == 0 and s["all"]["skipped_flops"] == 0
    assert s["all"]["decisions"] == B * STEPS * len(ac.work)


def test_large_threshold_skips_and_the_skip_is_counted_exactly():
    """Threshold inf: the first decode step computes (level 2 empty), every later one reuses. Then a
    threshold-0 step folds the waiting GDN tokens. Every figure is checked against the dims."""
    model = _model("tiny-qwen3.5")
    cfg = model.cfg
    ids = _ids(model, PROMPT + STEPS + 1)
    ac = ArticleCache(model, threshold=math.inf)
    exact = _decode(lambda i, c: model(i, cache=c), model, ids[:, : PROMPT + STEPS])
    cache = model.new_cache(B, ids.shape[1])
    logits = [ac(ids[:, :PROMPT], cache)[:, -1:]] + [ac(ids[:, t : t + 1], cache) for t in range(PROMPT, PROMPT + STEPS)]
    got = torch.cat(logits, 1)
    assert torch.isfinite(got).all()
    assert torch.equal(got[:, :2], exact[:, :2])  # prefill and the first decode step compute exactly
    assert not torch.equal(got, exact)  # reused steps are approximate

    n_gdn, n_att = cfg.layer_types.count("gdn"), cfg.layer_types.count("attention")
    dk, dv, hv = cfg.gdn_k_head_dim, cfg.gdn_v_head_dim, cfg.gdn_num_v_heads
    update, readout = 5 * hv * dk * dv, 2 * hv * dk * dv
    reused = STEPS - 1  # decode steps after the first
    s = ac.stats()
    gdn, att = s["by_kind"]["gdn"], s["by_kind"]["attention"]
    assert gdn["reuses"] == n_gdn * B * reused and att["reuses"] == n_att * B * reused
    assert gdn["exact_flops"] == n_gdn * B * STEPS * (update + readout)
    assert gdn["done_flops"] == n_gdn * B * (update + readout)
    assert gdn["owed_flops"] == n_gdn * B * reused * update  # the reused tokens wait in level 1
    assert gdn["skipped_flops"] == n_gdn * B * reused * readout
    # attention: decode step j (0-based) sees PROMPT + j + 1 keys; the reused steps skip all of them
    per_key = 4 * cfg.num_heads * cfg.head_dim
    assert att["skipped_flops"] == n_att * B * per_key * sum(PROMPT + j + 1 for j in range(1, STEPS))
    assert 0 < s["all"]["skipped_of_step"] < s["all"]["skipped_of_mixer"] < s["all"]["skipped_of_core"] < 1

    ac.threshold = 0.0  # the next step computes: the waiting tokens are folded, nothing is owed
    ac(ids[:, -1:], cache)
    gdn = ac.stats()["by_kind"]["gdn"]
    assert gdn["owed_flops"] == 0
    assert gdn["done_flops"] == n_gdn * B * (2 * (update + readout) + reused * update)
    assert gdn["skipped_flops"] == n_gdn * B * reused * readout


def test_fold_uses_the_current_gates_and_leaves_other_sequences_alone():
    """A waiting token folded with g = beta = 0 padding changes nothing for a sequence it does not wait
    for: with one sequence reusing and two computing, the computing rows' GDN state is what the exact
    core gives them (checked on the first GDN layer, whose inputs are the exact path's)."""
    model = _model("tiny-qwen3.5")
    first_gdn = model.cfg.layer_types.index("gdn")
    ids = _ids(model, PROMPT + 2)
    exact_cache = model.new_cache(B, ids.shape[1])
    model(ids, cache=exact_cache)
    ac = ArticleCache(model, threshold=0.0)
    cache = model.new_cache(B, ids.shape[1])
    ac(ids[:, :PROMPT], cache)
    ac(ids[:, PROMPT : PROMPT + 1], cache)
    real_decide = ac._decide

    def only_row_0_reuses(st, signal, extra=None):
        reuse, extra_host = real_decide(st, signal, extra)
        return [True] + [False] * (B - 1), extra_host

    ac._decide = only_row_0_reuses
    ac(ids[:, PROMPT + 1 :], cache)
    got, want = cache.recurrent_states[first_gdn], exact_cache.recurrent_states[first_gdn]
    torch.testing.assert_close(got[1:], want[1:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[0], want[0])  # row 0 skipped its update: its token waits in level 1
    assert len(ac._state[first_gdn].pending) == 1


@pytest.mark.parametrize("kwargs", [dict(threshold=-0.1), dict(threshold=float("nan")), dict(ema_rate=0.0),
                                    dict(ema_rate=1.5), dict(ema_rate=-0.2), dict(threshold="0.1"),
                                    dict(kinds=("conv",)), dict(kinds=())])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError, match="threshold|ema_rate|kinds"):
        ArticleCache(_model("tiny-lfm2"), **kwargs)


def test_needs_a_cache_and_one_batch_size():
    model = _model("tiny-lfm2")
    ac = ArticleCache(model)
    ids = _ids(model, 4)
    with pytest.raises(ValueError, match="HybridCache"):
        ac(ids, None)
    ac(ids, model.new_cache(B, 8))
    with pytest.raises(ValueError, match="reset"):
        ac(ids[:2], model.new_cache(2, 8))


def test_bench_rows_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    from dataclasses import asdict

    from labkit.bench.article_cache import quality_rows, verdict, verdict_markdown
    from labkit.lab.plots import article_cache_curves

    model = _model("tiny-qwen3.5")
    windows = _ids(model, 12)
    rows = quality_rows(model, "tiny-qwen3.5", windows, thresholds=(0.0, 10.0), prompt=4, greedy_steps=3)
    zero, big = rows
    assert zero.identical_to_exact and zero.logit_rel_rms == 0 and zero.bits_per_byte == zero.bits_per_byte_exact
    assert zero.greedy_agreement == 1 and zero.greedy_first_mismatch is None
    assert big.skipped_of_core["all"] > 0 and big.logit_rel_rms > 0 and not big.identical_to_exact
    doc = {"results": [asdict(r) for r in rows], "gpu": None, "command": "test"}
    axes = article_cache_curves(doc)
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in axes)
    v = verdict(doc, article_threshold=10.0)
    q = v["quality"]["tiny-qwen3.5"]
    assert q["exact_at_zero"] and q["at_article_threshold"]["skipped_of_core"] == big.skipped_of_core["all"]
    assert q["max_gdn_skipped_of_core"] <= v["gdn_skip_bound"] + 1e-12
    text = verdict_markdown(doc, article_threshold=10.0)
    assert "tiny-qwen3.5" in text and "bit for bit" in text and "Verdict" in text


def test_waiting_tokens_are_folded_with_the_current_gates():
    """Level 1 -> state: at the first computed step after reuses, the exact core gets the waiting
    tokens' raw k, v, in order, then this token, every one with this step's g and beta."""
    from labkit.ops.delta_rule import delta_rule_ref
    from labkit.ops.mixers import MixerCores

    calls = []

    def recording(q, k, v, g, beta, state):
        calls.append((k.clone(), v.clone(), g.clone(), beta.clone()))
        return delta_rule_ref(q, k, v, g, beta, state)

    model = _model("tiny-qwen3.5")
    first_gdn = model.cfg.layer_types.index("gdn")
    ids = _ids(model, PROMPT + 4)
    ac = ArticleCache(model, threshold=math.inf, inner=MixerCores(delta_rule=recording))
    cache = model.new_cache(B, ids.shape[1])
    for t in (slice(0, PROMPT), *(slice(i, i + 1) for i in range(PROMPT, PROMPT + 3))):
        ac(ids[:, t], cache)
    waiting = [(k, v) for _, _, k, v in ac._state[first_gdn].pending]
    assert len(waiting) == 2  # decode steps 2 and 3 reused
    ac.threshold = 0.0
    calls.clear()
    ac(ids[:, -1:], cache)
    k, v, g, beta = calls[0]  # the first GDN layer calls the core first
    assert k.shape[1] == 3
    assert torch.equal(k[:, :2], torch.cat([w[0] for w in waiting], 1))
    assert torch.equal(v[:, :2], torch.cat([w[1] for w in waiting], 1))
    assert torch.equal(g, g[:, -1:].expand_as(g)) and torch.equal(beta, beta[:, -1:].expand_as(beta))
    assert ac._state[first_gdn].pending == []


def test_kinds_limits_the_approximation_to_those_layers():
    model = _model("tiny-qwen3.5")
    ids = _ids(model, PROMPT + STEPS)
    ac = ArticleCache(model, threshold=math.inf, kinds=("gdn",))
    _decode(ac, model, ids)
    s = ac.stats()
    assert set(s["by_kind"]) == {"gdn"} and s["by_kind"]["gdn"]["reuses"] > 0


def test_core_share_matches_what_the_cache_counts():
    """The prediction helper and the run-time count agree on one exact decode step's core FLOPs."""
    from labkit.lab.article_cache import core_share_of_step

    model = _model("tiny-qwen3.5")
    ids = _ids(model, PROMPT + 1)
    ac = ArticleCache(model, threshold=0.0)
    cache = model.new_cache(B, ids.shape[1])
    ac(ids[:, :PROMPT], cache)
    ac(ids[:, PROMPT:], cache)
    share = core_share_of_step(model, context=PROMPT + 1)
    s = ac.stats()
    assert s["all"]["exact_flops"] == B * (share["attention_core"] + share["gdn_core"])
    assert s["all"]["step_flops_exact"] == B * share["total"]
    assert 0 < share["gdn_bound_of_step"] < share["max_skippable_of_step"] < 1
