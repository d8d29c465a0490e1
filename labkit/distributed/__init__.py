"""More than one GPU: data-parallel replicas over torch.distributed, and the all-reduce latency that
tensor parallelism would pay for a model this small.

    python -m labkit serve-batch --nproc 2 --compare-single     # replicas, against one GPU in the same job
    python -m labkit allreduce --nproc 2                        # all-reduce at decode message sizes

Both launch ``torchrun`` (one process per GPU, NCCL; gloo on CPUs), also across machines with
``--nnodes``/``--node-rank``/``--master-addr``. Modules: :mod:`.runtime` (a rank, its device,
failures shared by all ranks, NVLink multicast kept off), :mod:`.requests` (the request set and each
replica's share), :mod:`.serve` (replicas), :mod:`.allreduce` (the tensor-parallel cost),
:mod:`.cli` (the launcher and the rank entry point).
"""

from .allreduce import AllReduceRow, allreduces_per_token, message_bytes, tensor_parallel_step_us
from .requests import RequestBatch, make_requests, shard
from .runtime import MULTICAST_OFF, RankFailure, check_multicast_off, multicast_off_env
from .serve import ServeRow

__all__ = [
    "AllReduceRow",
    "MULTICAST_OFF",
    "RankFailure",
    "RequestBatch",
    "ServeRow",
    "allreduces_per_token",
    "check_multicast_off",
    "make_requests",
    "message_bytes",
    "multicast_off_env",
    "shard",
    "tensor_parallel_step_us",
]
