"""Facts about the GPU at hand, measured where it matters, and a few datasheet figures for contrast.

The roofline of a decode step is set by memory bandwidth, and the bandwidth a program can reach is
not the datasheet's: an H200 is sold at 4.8 TB/s and copies at about 4.3. So labkit measures it
(a large device-to-device copy, bytes read plus bytes written, median of repeats) and uses the
measured figure everywhere a roofline is drawn.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass

import torch

from . import timing
from ..tuning import gpu_slug

# Vendor datasheet values (SXM parts, dense bf16 without sparsity). Leads, not measurements.
DATASHEET = {
    "H100 SXM": {"memory_gb": 80, "hbm_tb_s": 3.35, "bf16_tflops": 989, "sms": 132, "source": "datasheet"},
    "H200 SXM": {"memory_gb": 141, "hbm_tb_s": 4.8, "bf16_tflops": 989, "sms": 132, "source": "datasheet"},
    "B200": {"memory_gb": 180, "hbm_tb_s": 8.0, "bf16_tflops": 2250, "sms": 148, "source": "datasheet"},
}




@dataclass(frozen=True)
class DeviceFacts:
    name: str
    kind: str  # "cuda" or "cpu"
    sms: int | None
    memory_bytes: int | None
    compute_capability: tuple[int, int] | None
    l2_bytes: int | None
    copy_bytes_per_s: float | None  # measured: bytes read + written per second by a large copy
    bf16_flops: float | None  # measured: a large bf16 matmul

    @property
    def slug(self) -> str:
        """A directory name for results: 'nvidia-h200', 'cpu'."""
        return gpu_slug(self.name) if self.kind == "cuda" else "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


def measure_copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 20, device: str = "cuda") -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and bytes written.

    The buffer should be many times the L2 (H200: 60 MB) so the copy streams from HBM.
    """
    n = nbytes // 2
    src = torch.randn(n // 2, device=device, dtype=torch.float32).view(torch.bfloat16)  # real data, not zeros
    dst = torch.empty_like(src)
    # Eager, not replayed from a graph: a captured device-to-device copy_ becomes a memcpy node, which
    # ran at 2.76 TB/s on an H200 against 4.3 for the copy kernel that an eager copy_ launches.
    ms = timing.measure(lambda: dst.copy_(src), device=device, graph=False, repeats=repeats).ms
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def measure_bf16_matmul(n: int = 8192, repeats: int = 10, device: str = "cuda") -> float:
    """FLOP/s of an n x n x n bf16 matmul on random data."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = timing.measure(lambda: a @ b, device=device, graph=False, repeats=repeats).ms  # as cuBLAS runs eagerly
    return 2 * n**3 / (ms * 1e-3)


def measure_launch_overhead(launches: int = 2000, device: str = "cuda") -> dict[str, float]:
    """Microseconds per tiny kernel, launched eagerly and replayed inside a CUDA graph.

    The kernel (an in-place add on one element) does no work, so its time per launch is the cost
    of launching: the floor under any decode step made of many small kernels.
    """
    x = torch.zeros(1, device=device)

    def eager() -> None:
        for _ in range(launches):
            x.add_(1.0)

    out = {"eager_us": timing.measure(eager, device=device, graph=False, repeats=5).us / launches}
    if torch.device(device).type == "cuda":
        out["graph_us"] = timing.measure(eager, device=device, graph=True, repeats=5).us / launches
    return out


@functools.lru_cache(maxsize=4)
def device_facts(device: str = "auto", measure: bool = True) -> DeviceFacts:
    """What this machine's accelerator is, with measured copy bandwidth and matmul rate.

    ``device="auto"`` means the GPU if there is one. On a CPU the measurements are small (a 64 MB
    copy, a 512 matmul) and serve only to keep the notebooks' arithmetic runnable there.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        return DeviceFacts(
            name=p.name,
            kind="cuda",
            sms=p.multi_processor_count,
            memory_bytes=p.total_memory,
            compute_capability=(p.major, p.minor),
            l2_bytes=getattr(p, "L2_cache_size", None),
            copy_bytes_per_s=measure_copy_bandwidth(device=device) if measure else None,
            bf16_flops=measure_bf16_matmul(device=device) if measure else None,
        )
    return DeviceFacts(
        name=platform.processor() or platform.machine() or "cpu",
        kind="cpu",
        sms=None,
        memory_bytes=None,
        compute_capability=None,
        l2_bytes=None,
        copy_bytes_per_s=measure_copy_bandwidth(64 << 20, repeats=5, device="cpu") if measure else None,
        bf16_flops=measure_bf16_matmul(512, repeats=3, device="cpu") if measure else None,
    )


def hopper_only(section: str, device: str = "auto", needs: tuple[str, ...] = ("pdl", "tma")) -> bool:
    """Whether a notebook's Hopper-only ``section`` runs here: False, with a line saying why it is
    skipped, on a CUDA GPU that lacks one of ``needs`` (names of :data:`labkit.ops.features.FEATURES`:
    an A100, L4 or RTX 4090, older than sm_90); True, silently, on a GPU that has them all, and on
    a CPU, where the notebooks teach from the committed H200 files (and Triton's interpreter runs
    the Hopper paths' arithmetic)."""
    from ..ops.features import FEATURES, SHORT_NAMES, features

    unknown = set(needs) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if torch.device(device).type != "cuda":
        return True
    have = features(device)
    missing = [f for f in needs if not have.has(f)]
    if missing:
        names = "/".join(SHORT_NAMES[f] for f in missing)
        print(f"skipped: {section} needs sm_90 or newer ({names}); this GPU ({have.name}) is {have.arch}")
    return not missing


def versions() -> dict[str, str | None]:
    """Software versions worth recording next to any measured figure."""
    out: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    out["cuda"] = torch.version.cuda
    for mod in ("triton", "transformers", "fla"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # not installed (or broken): recorded as absent
            out[mod] = None
    if torch.cuda.is_available():
        out["driver"] = _driver_version()
    return out


def host() -> dict[str, str | int | None]:
    """The machine around the GPU, worth recording next to any figure that has host work in it (a
    prefix-cache hit, ``generate``'s set-up, a host-bound rung): the CPU's model name, its logical
    CPUs, and how many of them this process may run on (``taskset`` or a container narrows it: one
    core steadies host-bound timings between processes, and a figure taken so should say so). Such
    figures move with the host while the GPU's own do not (the H100 runs in
    data/bench/nvidia-h100-80gb-hbm3/archive/README.md). A virtual machine may report a generic name."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cpus": os.cpu_count(), "cpus_allowed": allowed}


def _cpu_model() -> str | None:
    """The CPU's model name: /proc/cpuinfo's on Linux (``platform.processor()`` there says only
    "x86_64"), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _driver_version() -> str | None:
    import subprocess

    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()[0]
    except Exception:
        return None
