"""When would tensor parallelism pay for a small model's decode step (notebook 07)?

A ``tp``-way step is bounded below by ``labkit.distributed.tensor_parallel_step_us``: the one-GPU
step split perfectly plus its all-reduces. Setting that equal to the one-GPU step gives the
all-reduce time below which the split step is shorter (lower per-token latency for one stream).
Throughput per GPU is another matter: ``tp`` GPUs on one stream against ``tp`` replicas.
"""

from __future__ import annotations


def break_even_allreduce_us(single_step_us: float, allreduces: int, tp: int, unsplit_us: float = 0.0) -> float:
    """All-reduce time (µs) at which a ``tp``-way step takes as long as the one-GPU step.

    ``unsplit_us`` is the part of the step that does not shrink with ``tp`` (each GPU still pays it,
    e.g. every kernel's fixed cost); 0 is the perfect split of ``tensor_parallel_step_us``.
    """
    if tp < 2:
        raise ValueError(f"break-even needs tp >= 2, got {tp}")
    if allreduces < 1:
        raise ValueError(f"a tensor-parallel step has at least one all-reduce, got {allreduces}")
    if not 0 <= unsplit_us <= single_step_us:
        raise ValueError(f"the unsplit part must lie in [0, step], got {unsplit_us} of {single_step_us}")
    return (single_step_us - unsplit_us) * (1 - 1 / tp) / allreduces


def tokens_per_s_per_gpu(batch: int, step_us: float, gpus: int) -> float:
    """Decode tokens/s each GPU contributes when ``gpus`` GPUs together take ``step_us`` per step
    of ``batch`` sequences (``gpus`` = tp for a tensor-parallel step, 1 for a replica)."""
    if step_us <= 0 or gpus < 1:
        raise ValueError(f"need a positive step and >= 1 GPU, got {step_us}, {gpus}")
    return batch / (step_us * 1e-6) / gpus
