"""What every rank of a labkit job shares: its place in the job, its device, the process group, and
failures that end the job on every rank at once.

A rank is one process of a ``torchrun`` job (``torch.distributed.run``), which sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address in its environment. Rank ``r`` of a node
drives GPU ``LOCAL_RANK`` through NCCL; on a machine without a GPU the ranks use gloo on the CPU.

NVLink multicast (NVLS in NCCL, multicast objects in PyTorch's symmetric memory and in NVSHMEM) is
kept off in every process labkit starts: on shared machines a program that used it has put the
host's GPUs out of service for a day or more. labkit's launcher sets the three variables of
:data:`MULTICAST_OFF`; a rank that finds them unset in an NCCL job refuses to start rather than
trusting whoever launched it. (So NCCL's small-message all-reduce here runs without NVLink SHARP.)
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

T = TypeVar("T")


def multicast_off_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) with NVLink multicast switched off everywhere."""
    out = dict(os.environ if env is None else env)
    out.update(MULTICAST_OFF)
    return out


def check_multicast_off(env: dict[str, str] | os._Environ | None = None) -> None:
    """Raise unless every variable of :data:`MULTICAST_OFF` holds its off value."""
    env = os.environ if env is None else env
    wrong = {k: env.get(k) for k, v in MULTICAST_OFF.items() if env.get(k) != v}
    if wrong:
        want = " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items())
        raise RuntimeError(
            f"an NCCL job must start with NVLink multicast off ({want}); this rank sees "
            + ", ".join(f"{k}={v!r}" for k, v in wrong.items())
            + ". Launch it with `python -m labkit serve-batch` / `allreduce`, which set them, or export them"
        )


class RankFailure(RuntimeError):
    """Raised on every rank when a step failed on at least one; the message names each failing rank."""


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str  # "nccl" or "gloo"
    host: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def gather_all(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), on every rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def on_every_rank(self, what: str, fn: Callable[[], T], publish: Callable[[T], Any] | None = None
                      ) -> tuple[T, list[Any]]:
        """Run ``fn()`` here, then agree with every other rank on how it went.

        If it raised anywhere, it raises :class:`RankFailure` everywhere, naming each failing rank
        and its error, so that no rank is left waiting in a collective for a peer that gave up.
        Returns the local result and every rank's ``publish(result)`` (None without ``publish``).
        """
        result, error, cause = None, None, None
        try:
            result = fn()
        except Exception as exc:  # reported to every rank below, then raised with them
            error, cause = f"{type(exc).__name__}: {exc}", exc
        shared = None if error is not None or publish is None else publish(result)
        everyone = self.gather_all((self.host, error, shared))
        failed = [(r, host, e) for r, (host, e, _) in enumerate(everyone) if e is not None]
        if failed:
            detail = "; ".join(f"rank {r} ({host}): {e}" for r, host, e in failed)
            raise RankFailure(f"{what} failed on {len(failed)} of {self.world_size} ranks: {detail}") from cause
        return result, [s for _, _, s in everyone]


def start(device: str = "auto", timeout_s: float = 900.0) -> Rank:
    """Join the job this process was launched into (by torchrun) and pick its device.

    ``device="auto"``: GPU ``LOCAL_RANK`` with NCCL where CUDA is available, else the CPU with gloo.
    """
    missing = [v for v in RANK_VARIABLES if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"this is one rank of a torch.distributed job, but {', '.join(missing)} are not set: launch it with "
            "`python -m labkit serve-batch --nproc N ...` (or `allreduce`), which starts torchrun"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {device} was asked for, but torch sees no CUDA GPU on {socket.gethostname()}")
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise RuntimeError(
                f"{local_world} ranks were started on {socket.gethostname()}, which has {gpus} visible GPU(s): "
                "one rank drives one GPU, so lower --nproc (or check CUDA_VISIBLE_DEVICES)"
            )
        check_multicast_off()
        dev, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(dev)
    elif device == "cpu":
        from ..lab.notebooks import cpu_environment

        cpu_environment()  # Triton's interpreter for the fused backends, chosen before triton is imported
        dev, backend = torch.device("cpu"), "gloo"
    else:
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    kwargs: dict[str, Any] = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return Rank(rank, world, local_rank, local_world, dev, backend, socket.gethostname())


def finish() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
