"""GPUs without Hopper's features (an A100 is sm_80, an L4 or RTX 4090 sm_89: no PDL, no TMA, no bulk
prefetch), on a CPU.

``labkit.ops.features.stand_in`` makes every device answer as such a GPU; nothing else about the CPU
changes, so the rungs are made from a CPU model through their real constructors and take their real
decisions: each rung of the registry either takes its non-Hopper path or refuses, when made, with a
MissingFeature that names the GPU, its capability, what is missing and the rung to use instead; and on
an sm_90 stand-in the Hopper paths are on. What each rung must do is its registry declaration
(``ON_OLDER_GPUS``): a rung added without one fails here. CUDA graphs are replaced by a stand-in that
captures nothing (the decision is made before any capture), so no kernel runs and the test is cheap.
Whether the non-Hopper kernels compile for sm_80 is tests/test_compile_check.py's.
"""

import pytest
import torch

import labkit
from labkit.decode import graphs, registry
from labkit.ops.features import FEATURES, MissingFeature, features, stand_in

OLDER = {"A100": ("NVIDIA A100-SXM4-80GB", (8, 0)), "L4": ("NVIDIA L4", (8, 9))}
HOPPER = ("NVIDIA H200", (9, 0))


class NoGraphs:
    """CUDA graphs that capture nothing and replay nothing: construction only."""

    def available(self, device):
        return True

    def warm_up(self, step, device):
        pass

    def capture(self, step, device):
        return None


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)


@pytest.fixture
def no_graphs(monkeypatch):
    monkeypatch.setattr(graphs, "GRAPHS", NoGraphs())


def _make(backend, model):
    return registry.make_decoder(backend, model, model.new_cache(1, 16))


def test_the_rule_sm_90_and_newer_has_every_feature():
    for name, cap in [*OLDER.values(), ("NVIDIA RTX 4090", (8, 9)), ("NVIDIA T4", (7, 5))]:
        with stand_in(name, cap) as f:
            assert f == features("cpu") == features("cuda:1")
            assert not (f.pdl or f.tma or f.bulk_prefetch) and f.arch == f"sm_{cap[0]}{cap[1]}"
    for name, cap in (HOPPER, ("NVIDIA B200", (10, 0))):
        with stand_in(name, cap) as f:
            assert f.pdl and f.tma and f.bulk_prefetch
    # outside a stand-in, the CPU is Triton's interpreter here, which runs every Hopper path's arithmetic
    assert features("cpu").kind == "interpreter" and features("cpu").pdl


def test_every_rung_declares_what_it_does_without_hopper():
    undeclared = sorted(set(registry.BACKENDS) - set(registry.ON_OLDER_GPUS))
    assert not undeclared, f"rungs without an OlderGpus declaration in labkit.decode.registry: {undeclared}"
    for name, decl in registry.ON_OLDER_GPUS.items():
        assert set(decl.needs) | set(decl.optional) <= set(FEATURES), name
        if decl.needs:  # the rung to use instead exists and needs nothing
            assert not registry.ON_OLDER_GPUS[decl.instead].needs, name


@pytest.mark.parametrize("gpu", OLDER)
@pytest.mark.parametrize("backend", list(registry.BACKENDS))
def test_on_an_older_gpu_a_rung_takes_its_path_or_refuses_clearly(model, no_graphs, gpu, backend):
    decl = registry.ON_OLDER_GPUS[backend]
    name, cap = OLDER[gpu]
    with stand_in(name, cap):
        if decl.needs:
            with pytest.raises(MissingFeature) as e:
                _make(backend, model)
            msg = str(e.value)
            assert name in msg and f"sm_{cap[0]}{cap[1]}" in msg and "9.0" in msg, msg
            assert any(FEATURES[f] in msg for f in decl.needs), msg
            assert f'backend "{decl.instead}"' in msg, msg
            assert backend not in registry.backends_for("cpu")
        else:
            decoder = _make(backend, model)
            assert decoder.hopper_features == frozenset(), (backend, decoder.hopper_features)
            assert backend in registry.backends_for("cpu")


@pytest.mark.parametrize("backend", list(registry.BACKENDS))
def test_on_hopper_every_rung_takes_its_hopper_paths(model, no_graphs, backend):
    decl = registry.ON_OLDER_GPUS[backend]
    with stand_in(*HOPPER):
        decoder = _make(backend, model)
    assert decoder.hopper_features == frozenset(decl.needs) | frozenset(decl.optional)


def test_the_persistent_rung_streams_without_the_prefetch_and_refuses_one_asked_for(model, no_graphs):
    from labkit.decode.persistent import PersistentDecoder
    from labkit.ops import persistent_decode as pd

    with stand_in(*OLDER["A100"]):
        default = PersistentDecoder(model, model.new_cache(1, 16))
        assert default.settings["prefetch_tiles"] == 0 and default._launch_settings()["prefetch_tiles"] == 0
        assert PersistentDecoder(model, model.new_cache(1, 16), settings={"prefetch_tiles": 0})
        with pytest.raises(MissingFeature, match=r"prefetch_tiles=2.*bulk L2 prefetch.*sm_80.*prefetch_tiles=0"):
            PersistentDecoder(model, model.new_cache(1, 16), settings={"prefetch_tiles": 2})
        with pytest.raises(MissingFeature, match="bulk L2 prefetch"):  # the launcher, for a caller that skips the rung
            pd._launch_args(torch.zeros(1), None, None, greedy=True, advance=False, num_warps=4, prefetch_tiles=1)
    with stand_in(*HOPPER):
        hopper = PersistentDecoder(model, model.new_cache(1, 16), settings={"prefetch_tiles": 2})
        assert hopper._launch_settings()["prefetch_tiles"] == 2


def test_ops_refuse_pdl_and_descriptors_before_any_launch():
    from labkit.bench import latency
    from labkit.ops import linear, plain_gemv

    x, w = torch.randn(1, 64), torch.randn(32, 64)
    with stand_in(*OLDER["L4"]):
        with pytest.raises(MissingFeature, match=r"pdl=True .*NVIDIA L4, is sm_89.*pdl=False"):
            linear.linear(x, w, pdl=True)
        with pytest.raises(MissingFeature, match=r'plain_gemv\(style="descriptor"\) needs the tensor memory'):
            plain_gemv.plain_gemv(x, w, style="descriptor", block_n=16, block_k=64)
        with pytest.raises(MissingFeature, match=r'style="pointer"'):
            latency.chase(latency.chain_table(8 * latency.ROW * 4, "random", "cpu"), 0, 4, "descriptor")
        assert torch.allclose(linear.linear(x, w), x @ w.T, atol=1e-4)  # without PDL the op runs as before


def test_the_tma_kernels_refuse_an_older_gpu_by_name(monkeypatch):
    from labkit import cuda

    with stand_in(*OLDER["A100"]):
        with pytest.raises(MissingFeature, match=r"labkit\.cuda's kernels.*NVIDIA A100-SXM4-80GB, is sm_80.*"
                                                 r"labkit\.ops\.linear\.linear"):
            cuda.arch_of("cuda")
    with stand_in(*HOPPER):
        assert cuda.arch_of("cuda") == "90a"
    with stand_in("NVIDIA B200", (10, 0)):
        assert cuda.arch_of("cuda") == "100a"


def test_notebooks_skip_hopper_only_sections_with_the_reason(capsys):
    from labkit.lab.hw import hopper_only

    with stand_in(*OLDER["A100"]):
        assert hopper_only("the PDL timeline", "cuda", needs=("pdl",)) is False
    assert capsys.readouterr().out == (
        "skipped: the PDL timeline needs sm_90 or newer (PDL); this GPU (NVIDIA A100-SXM4-80GB) is sm_80\n")
    with stand_in(*HOPPER):
        assert hopper_only("the PDL timeline", "cuda") is True
    assert hopper_only("anything", "cpu") is True  # a CPU run teaches from the committed H200 files
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="unknown features"):
        hopper_only("x", "cpu", needs=("wgmma",))
