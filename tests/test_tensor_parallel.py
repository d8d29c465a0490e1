import pytest

from labkit.config import PRESETS
from labkit.distributed import allreduces_per_token, tensor_parallel_step_us
from labkit.lab.tensor_parallel import break_even_allreduce_us, tokens_per_s_per_gpu


@pytest.mark.parametrize("tp", [2, 3, 8])
@pytest.mark.parametrize("step_us", [457.0, 1013.7])
def test_break_even_makes_the_split_step_as_long_as_one_gpu(tp, step_us):
    cfg = PRESETS["lfm2-350m"]
    n = allreduces_per_token(cfg)
    t = break_even_allreduce_us(step_us, n, tp)
    assert tensor_parallel_step_us(cfg, step_us, tp, t) == pytest.approx(step_us)
    assert tensor_parallel_step_us(cfg, step_us, tp, 0.9 * t) < step_us < tensor_parallel_step_us(cfg, step_us, tp, 1.1 * t)


def test_an_unsplit_part_lowers_the_break_even():
    # a 100 µs step of which 40 µs does not split, 2 GPUs, 3 all-reduces: 60 / 2 / 3 = 10 µs
    assert break_even_allreduce_us(100.0, 3, 2, unsplit_us=40.0) == pytest.approx(10.0)
    assert break_even_allreduce_us(100.0, 3, 2) == pytest.approx(50 / 3)
    for bad in (dict(tp=1), dict(allreduces=0), dict(unsplit_us=101.0), dict(unsplit_us=-1.0)):
        with pytest.raises(ValueError):
            break_even_allreduce_us(**{"single_step_us": 100.0, "allreduces": 3, "tp": 2, **bad})


def test_tokens_per_gpu():
    assert tokens_per_s_per_gpu(16, 1000.0, 2) == pytest.approx(8000.0)
    with pytest.raises(ValueError):
        tokens_per_s_per_gpu(1, 0.0, 1)
