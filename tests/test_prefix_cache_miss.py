"""A prefix-cache miss against the run without a cache: the same tokens, and only a few more launches.

A miss prefills the whole prompt once and stores snapshots at its block boundaries. What it may
add to the prefill without a cache, by design (labkit.prefix_cache's docstring):

- one small copy (the fused decoders) or product (LFM2's B * x) per conv or GDN layer: the windows
  before each boundary, read from the projection the conv is handed (the conv kernels themselves
  are the decoder's own);
- the delta rule's checkpoints: written by the chunk kernel's walk, or stacked once per GDN layer
  by the chunked reference;
- one span table for every snapshot of the call (one launch on a GPU: labkit.ops.copy_spans; no
  clone per tensor, no allocation once the pools are warm).

So the tests count torch ops (views and allocations aside) and Triton launches (the ops the
interpreter runs inside a kernel aside) over one prefill, with and without the cache, plus the
span tables the cache ran (on a CPU they are memmoves, which the counter does not see), and hold
the difference to that budget; the old design (its boundary reader swapped the fused convs for
their references and cloned every tensor) added 47-175%. Tokens and logits: every admission, hits
and misses, on the shipped checkpoints in float32.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import labkit
from conftest import RecordingGraphs, rel_err, shipped_float32
from labkit import prefix_cache as pc_module
from labkit.decode import graphs as graph_seam
from labkit.decode.registry import make_decoder
from labkit.weights import weights_key

BS = 64  # a multiple of the delta rule's chunk: the checkpoints come from its walk
ADMISSIONS = ["every", "ends", "paying"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(labkit.CHECKPOINTS))
def model(request):
    return shipped_float32(request.param)


def _ids(model, length, seed, batch=1):
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- counting what a prefill launches -----------------------------------------------------------------
_FREE = {  # no kernel: views, metadata, allocations, reading a host tensor's number
    "_local_scalar_dense",
    "view", "_unsafe_view", "as_strided", "slice", "select", "unbind", "expand", "t", "transpose", "permute",
    "reshape", "alias", "detach", "split", "split_with_sizes", "chunk", "unsqueeze", "squeeze", "empty",
    "empty_like", "empty_strided", "lift_fresh", "unflatten", "new_empty", "new_empty_strided", "_reshape_alias",
}


class Launches(TorchDispatchMode):
    """Torch ops that run a kernel, and Triton launches, while active; the torch ops Triton's
    interpreter runs inside a kernel are part of that launch, not counted again."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.ops: dict[str, int] = {}
        self.triton = 0
        self._inside = 0
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:  # a GPU: kernels launch for real, none of their work dispatches here
            return
        run = InterpretedFunction.run

        def counted(fn, *args, **kwargs):
            self.triton += 1
            self._inside += 1
            try:
                return run(fn, *args, **kwargs)
            finally:
                self._inside -= 1

        monkeypatch.setattr(InterpretedFunction, "run", counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _FREE and not self._inside:
            self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values()) + self.triton


def _count(monkeypatch, fn):
    with monkeypatch.context() as patch:  # the interpreter's launcher is put back after each count
        counter = Launches(patch)
        with torch.no_grad(), counter:
            out = fn()
    return counter, out


def _miss_budget(model, stacks: bool) -> int:
    """What a miss may add (the module's docstring): a window copy per conv/GDN layer, a checkpoint
    stack per GDN layer (``stacks``: the reference's), one span table for the snapshots, and the range
    check of the ids on the host (one reduction of the host copy the look-up reads anyway)."""
    kinds = model.cfg.layer_types
    convs = sum(k in ("conv", "gdn") for k in kinds)
    return convs + stacks * kinds.count("gdn") + 1 + 1


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_a_miss_adds_only_its_window_copies_and_one_copy_per_dtype(model, admission, monkeypatch):
    decoder = make_decoder("reference", model, model.new_cache(1, 4 * BS + 8))
    ids = _ids(model, 4 * BS + 3, seed=1)

    def plain():
        decoder.cache.reset()
        return decoder.prefill(ids)

    base, want = _count(monkeypatch, plain)
    prefix = labkit.PrefixCache(model, BS, budget_bytes=math.inf, admission=admission)
    key = weights_key(model)  # taken outside the count: its read is not a launch of the miss
    miss, got = _count(monkeypatch, lambda: prefix.prefill(decoder, ids, weights=key))
    assert got.restored == 0 and torch.equal(got.logits, want)  # the same walk: bit for bit
    extra = miss.total + prefix.last_copies.launches - base.total
    print(f"{model.cfg.name} {admission}: {base.total} launches without a cache, +{extra} with it "
          f"({extra / base.total:+.1%}); span tables {prefix.last_copies.launches}")
    assert prefix.last_copies.launches == 1 and "_foreach_copy_" not in miss.ops  # one table, no copy per tensor
    # no clone per stored tensor: the GDN windows' copies are the only ones
    assert miss.ops.get("clone", 0) <= base.ops.get("clone", 0) + model.cfg.layer_types.count("gdn")
    assert 0 < extra <= _miss_budget(model, stacks=True)
    assert len(prefix) == 4


def test_the_fused_miss_keeps_its_kernels(monkeypatch):
    """The fused decoder's miss runs the same Triton kernels as its prefill without a cache (the
    convs included: they were swapped for their torch references before)."""
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=3)
    decoder = make_decoder("fused", model, model.new_cache(1, 2 * BS + 8))
    ids = _ids(model, 2 * BS + 5, seed=2)

    def plain():
        decoder.cache.reset()
        return decoder.prefill(ids)

    plain()  # compile outside the count
    base, want = _count(monkeypatch, plain)
    prefix = labkit.PrefixCache(model, BS, budget_bytes=math.inf)
    key = weights_key(model)
    miss, got = _count(monkeypatch, lambda: prefix.prefill(decoder, ids, weights=key))
    assert miss.triton == base.triton
    extra = miss.total + prefix.last_copies.launches - base.total
    print(f"fused tiny-qwen3.5: {base.total} launches without a cache ({base.triton} Triton), +{extra} with it")
    assert extra <= _miss_budget(model, stacks=False) and prefix.last_copies.launches == 1
    assert rel_err(got.logits, want) < 1e-6
    assert rel_err(prefix.prefill(decoder, ids).logits, model(ids)[:, -1]) < 1e-5  # and the hit it stored


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_misses_and_hits_keep_the_tokens_under_every_admission(model, admission):
    prefix = labkit.PrefixCache(model, BS, budget_bytes=math.inf, admission=admission)
    shared = _ids(model, 2 * BS, seed=3)
    prompts = [torch.cat([shared, _ids(model, n, seed=4 + n)], 1) for n in (5, 70, 1)]
    hits = []
    for p in prompts + [_ids(model, 3 * BS + 9, seed=9)]:
        out = labkit.generate(model, p, 5, prefix_cache=prefix)
        hits.append(out.prefix_hit)
        assert torch.equal(out.tokens, labkit.generate(model, p, 5).tokens)
    # "ends" keeps states at the first prompt's end (2 blocks, on the shared prefix here) and branch points
    assert hits == [0, 2 * BS, 2 * BS, 0]


def test_paying_declines_the_boundaries_a_hit_would_not_pay_for(model):
    rate_all = labkit.PrefixCache(model, BS, math.inf, admission="paying")
    assert rate_all.paying_depth == 1  # at the CPU's rate every boundary pays on these checkpoints
    probe = labkit.PrefixCache(model, BS, math.inf)
    # a rate at which a hit pays only from the third block on: flops * depth * BS > rate * state bytes
    rate = 2.5 * probe.flops_per_token * BS / probe._states_bytes
    prefix = labkit.PrefixCache(model, BS, math.inf, admission="paying", exchange_rate=rate)
    assert prefix.paying_depth == 3
    ids = _ids(model, 4 * BS + 2, seed=5)
    out = labkit.generate(model, ids, 4, prefix_cache=prefix)
    stated = []
    node = prefix.root
    while node.children:
        (node,) = node.children.values()
        stated.append(node.has_states)
    assert stated == [False, False, True, True]  # KV everywhere (a way through), states where they pay
    again = labkit.generate(model, ids, 4, prefix_cache=prefix)
    assert again.prefix_hit == 4 * BS and torch.equal(again.tokens, out.tokens)
    assert prefix.lookup(ids[0, : 2 * BS + 1]) == 0  # no states at the first two boundaries
    assert torch.equal(out.tokens, labkit.generate(model, ids, 4).tokens)


def test_a_miss_under_fused_graph_replays_its_captured_reading_prefill(monkeypatch):
    graphs = RecordingGraphs()
    monkeypatch.setattr(graph_seam, "GRAPHS", graphs)
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=5)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 2 * 8 + 8))
    prefix = labkit.PrefixCache(model, 8, budget_bytes=math.inf)
    prompts = [_ids(model, 2 * 8 + 3, seed=s) for s in range(4)]
    due = decoder.prefill_policy["capture_at"]
    for i, p in enumerate(prompts):
        got = prefix.prefill(decoder, p)
        assert got.restored == 0 and rel_err(got.logits, model(p)[:, -1]) < 1e-5
        assert len(decoder._reading_graphs) == (i + 1 >= due)
        hit = prefix.prefill(decoder, p)  # the snapshots the replay read restore exactly
        assert hit.restored == 16 and rel_err(hit.logits, model(p)[:, -1]) < 1e-5
    assert graphs.replays >= len(prompts) - due + 1


def test_warm_up_pays_the_first_call_and_leaves_nothing(monkeypatch):
    monkeypatch.setattr(graph_seam, "GRAPHS", RecordingGraphs())
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=6)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 40))
    prefix = labkit.PrefixCache(model, 8, budget_bytes=math.inf, warm_up=decoder)
    assert prefix.warm_up_s > 0 and len(prefix) == 0 and prefix.nbytes == 0
    assert decoder.captures >= 1  # the step graphs (a tail shape is captured when it comes back)
    assert decoder.cache.seq_len == 0
    ids = _ids(model, 19, seed=7)
    assert prefix.prefill(decoder, ids).restored == 0 and prefix.prefill(decoder, ids).restored == 16


def test_bad_admission_rate_and_warm_up_decoder_are_refused(model):
    with pytest.raises(ValueError, match="unknown admission 'sometimes'.*every, ends, paying"):
        labkit.PrefixCache(model, BS, math.inf, admission="sometimes")
    with pytest.raises(ValueError, match="exchange_rate must be a positive number"):
        labkit.PrefixCache(model, BS, math.inf, admission="paying", exchange_rate=-1.0)
    with pytest.raises(ValueError, match="no FLOPs-per-byte exchange rate for device kind 'mps'.*exchange_rate="):
        pc_module._exchange_rate(torch.device("mps"), None)
    other = labkit.build("tiny-qwen3.5" if "lfm" in model.cfg.name else "tiny-lfm2", dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="another model configuration"):
        labkit.PrefixCache(model, BS, math.inf, warm_up=make_decoder("reference", other, other.new_cache(1, 200)))
    same_cfg = labkit.build(model.cfg, dtype=torch.float32, seed=1)  # another model's weights
    with pytest.raises(ValueError, match="weights are not the ones"):
        labkit.PrefixCache(model, BS, math.inf, warm_up=make_decoder("reference", same_cfg, same_cfg.new_cache(1, 200)))
    with pytest.raises(TypeError, match="needs a labkit.decode.Decoder"):
        labkit.PrefixCache(model, BS, math.inf, warm_up="reference")


def test_the_chunked_reference_hands_out_the_states_of_the_recurrence():
    """Its checkpoints are the step-by-step recurrence's state after 64, 128, 192 of 200 tokens
    (irregular: the last chunk is partial), from an initial state, with grouped value heads."""
    from labkit.ops.delta_rule import delta_rule_chunked_ref, delta_rule_recurrent_ref

    gen = torch.Generator().manual_seed(0)
    B, T, Hk, Hv, K, V = 2, 200, 2, 4, 16, 24
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(B, T, Hv, V, generator=gen)
    g = -torch.rand(B, T, Hv, generator=gen) * 0.2
    beta = torch.rand(B, T, Hv, generator=gen)
    state = torch.randn(B, Hv, K, V, generator=gen) * 0.1
    buf = torch.empty(B, T // 64, Hv, K, V)
    out, final = delta_rule_chunked_ref(q, k, v, g, beta, state, checkpoints=buf, checkpoint_every=64)
    for j, e in enumerate((64, 128, 192)):
        _, want = delta_rule_recurrent_ref(q[:, :e], k[:, :e], v[:, :e], g[:, :e], beta[:, :e], state)
        assert rel_err(buf[:, j], want) < 1e-5
    assert torch.equal(out, delta_rule_chunked_ref(q, k, v, g, beta, state)[0])  # the walk is unchanged
    with pytest.raises(ValueError, match="multiple of chunk_size=64"):
        delta_rule_chunked_ref(q, k, v, g, beta, state, checkpoints=buf, checkpoint_every=48)
