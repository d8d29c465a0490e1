"""Hardware counters of single kernel launches, read with Nsight Compute's command line (``ncu``).

    rows = profile([sys.executable, "-m", "labkit.lab.counters_target", "--model", "lfm2-350m"],
                   DECODE_METRICS, profile_from_start=False).rows

:func:`profile` runs a program under ``ncu --csv --page raw --clock-control none --metrics ...`` and
reads the raw page back: one row per profiled kernel launch, each metric a :class:`Value` (the number
and its unit). ncu replays every profiled kernel once per group of counters the hardware can count
together ("passes"), restoring the memory the kernel writes between passes and flushing the caches
before each (its default ``--cache-control all``): so every launch is measured with a cold L2, and a
profile costs a fraction of a second per kernel however short the kernel is. ``--clock-control
none`` leaves the clocks where the GPU puts them (ncu's default locks them at base clock, which
makes times and bandwidths read low).

Counter names are Nsight Compute's (``ncu --query-metrics``; ``labkit.bench.ncu_metrics`` checks the
article's names against the listing): a name is ``unit__counter`` and a roll-up suffix (``.sum``,
``.avg.pct_of_peak_sustained_elapsed`` ...), or a launch attribute (``launch__*``). ncu refuses the
whole run when one requested name does not exist on the GPU at hand (``==ERROR== Failed to find
metric ...``), so :func:`profile` drops a name ncu rejects, says so in :attr:`Profile.rejected`, and
runs again, trying the next spelling where a :class:`Metric` has one; :func:`check_metrics` does
that on a one-kernel probe first, which is cheap.

Where counters cannot be read, :func:`ncu_unavailable_reason` says why in one line: ncu is not
installed or there is no GPU (:func:`ncu_missing_reason`), or the driver lets only administrators
read the counters (``ERR_NVGPUCTRPERM``; the fix is in :data:`PERMISSION_FIX`).
"""

from __future__ import annotations

import csv
import functools
import glob
import importlib
import os
import pkgutil
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

NCU_ENV = "LABKIT_NCU"  # a path to ncu, for an install that is on no usual path
_NCU_GLOBS = ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/NVIDIA-Nsight-Compute*/ncu")
DRIVER_PARAMS = Path("/proc/driver/nvidia/params")
PERMISSION_FIX = ("run ncu as root (sudo), or let every user read them: put 'options nvidia "
                  "NVreg_RestrictProfilingToAdminUsers=0' in a file of /etc/modprobe.d/ and reload the nvidia "
                  "driver (or reboot)")
PERMISSION_MESSAGE = ("the NVIDIA driver lets only administrators read the GPU's performance counters "
                      "(ERR_NVGPUCTRPERM): " + PERMISSION_FIX)


class NcuError(RuntimeError):
    """ncu ran and did not profile: the message holds the end of its output."""


class CountersNotPermitted(NcuError):
    """The driver refused the counters to this user (ERR_NVGPUCTRPERM)."""


# -- finding ncu ------------------------------------------------------------------------------------
def find_ncu() -> str | None:
    """The ncu executable: ``$LABKIT_NCU``, else the one on PATH, else the newest in the CUDA toolkit's
    and Nsight Compute's usual install folders; None if there is none."""
    given = os.environ.get(NCU_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    on_path = shutil.which("ncu")
    if on_path:
        return on_path
    found = sorted(p for pattern in _NCU_GLOBS for p in glob.glob(pattern) if os.access(p, os.X_OK))
    return found[-1] if found else None


def counters_restricted(params: Path = DRIVER_PARAMS) -> bool:
    """True when the driver keeps the counters for administrators (``RmProfilingAdminOnly: 1`` in its
    parameters) and this process is not root. False when it cannot tell (no such file)."""
    try:
        text = params.read_text()
    except OSError:
        return False
    match = re.search(r"RmProfilingAdminOnly:\s*(\d+)", text)
    return bool(match and match.group(1) != "0" and os.geteuid() != 0)


def ncu_missing_reason() -> str | None:
    """Why ncu cannot run here at all (not installed, no CUDA GPU), in one line; None when it can."""
    if find_ncu() is None:
        return ("Nsight Compute's command line (ncu) is not installed here: not on PATH, not in "
                "/usr/local/cuda*/bin or /opt/nvidia/nsight-compute; install Nsight Compute (the CUDA toolkit "
                f"ships it) or set {NCU_ENV}=/path/to/ncu")
    import torch

    if not torch.cuda.is_available():
        return "ncu profiles CUDA kernels, and torch sees no CUDA GPU here"
    return None


def ncu_unavailable_reason(*, check_counters: bool = False, params: Path = DRIVER_PARAMS) -> str | None:
    """Why ncu cannot read counters here, in one line; None when it should: :func:`ncu_missing_reason`,
    then the driver's counter permission, from its parameters, or with ``check_counters`` by
    profiling one tiny kernel (a few seconds; this also answers where the parameters cannot be read,
    or where a process that is not root was given the right another way)."""
    missing = ncu_missing_reason()
    if missing:
        return missing
    if not check_counters:
        return PERMISSION_MESSAGE if counters_restricted(params) else None
    try:
        check_metrics([Metric("time", ("gpu__time_duration.sum",), "")])
    except CountersNotPermitted:
        return PERMISSION_MESSAGE
    except NcuError as exc:
        return f"ncu failed on a one-kernel probe: {str(exc).splitlines()[0]}"
    return None


# -- metric sets ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """One quantity: ``key`` is what the summaries call it, ``names`` its ncu spellings in order of
    preference (a later one is tried where ncu rejects the one before), ``meaning`` what it measures.
    Metrics of one ``family`` share a pattern and move to their next spelling together, so that one
    rejection costs one retry for all of them."""

    key: str
    names: tuple[str, ...]
    meaning: str
    family: str = ""

    @property
    def group(self) -> str:
        return self.family or self.key


STALL_REASONS = ("long_scoreboard", "barrier", "membar", "wait", "math_pipe_throttle", "lg_throttle",
                 "short_scoreboard", "no_instruction")
_STALL_MEANING = {
    "long_scoreboard": "waiting for a global or local memory load (L1TEX: L2 or HBM)",
    "barrier": "waiting at __syncthreads for the rest of its block",
    "membar": "waiting for a memory fence",
    "wait": "a fixed-latency dependency (the compiler's wait counts)",
    "math_pipe_throttle": "the math pipe it needs is busy",
    "lg_throttle": "the queue of global/local memory instructions is full",
    "short_scoreboard": "waiting for shared memory or a special-function result",
    "no_instruction": "no instruction fetched yet (instruction cache miss, or after a branch)",
}


def _stall(reason: str) -> Metric:
    return Metric(
        f"stall_{reason}",
        (f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio",
         f"smsp__average_warp_latency_issue_stalled_{reason}.ratio"),
        f"warps stalled on {_STALL_MEANING[reason]}, per issued instruction: how many cycles between two "
        "instructions a warp spends in this state",
        family="stall")


DECODE_METRICS: tuple[Metric, ...] = (
    Metric("time", ("gpu__time_duration.sum",), "GPU time of the launch (at the clocks the GPU chose)"),
    Metric("dram_read", ("dram__bytes_read.sum",), "bytes read from HBM (the caches are flushed before each pass)"),
    Metric("dram_write", ("dram__bytes_write.sum",), "bytes written to HBM"),
    Metric("dram_read_rate", ("dram__bytes_read.sum.per_second",), "HBM read bandwidth over the launch"),
    Metric("dram_pct_peak", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                             "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
           "HBM throughput as a share of the hardware's peak"),
    Metric("occupancy", ("sm__warps_active.avg.pct_of_peak_sustained_active",),
           "achieved occupancy: warps resident per active cycle, as a share of the SM's maximum"),
    Metric("occupancy_theoretical", ("sm__maximum_warps_per_active_cycle_pct",),
           "theoretical occupancy: what the launch's registers, shared memory and block size allow"),
    Metric("registers", ("launch__registers_per_thread",), "registers per thread the kernel was compiled to"),
    Metric("local_load", ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",),
           "bytes loaded from local memory: register spills (and arrays indexed at run time)"),
    Metric("local_store", ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",), "bytes stored to local memory"),
    Metric("bank_conflicts_ld", ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",),
           "shared-memory load wavefronts beyond the fewest the accesses need (bank conflicts)"),
    Metric("bank_conflicts_st", ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",),
           "shared-memory store wavefronts beyond the fewest (bank conflicts)"),
    *(_stall(r) for r in STALL_REASONS),
    Metric("grid", ("launch__grid_size",), "blocks in the grid"),
    Metric("block", ("launch__block_size",), "threads per block"),
    Metric("smem_dynamic", ("launch__shared_mem_per_block_dynamic",), "dynamic shared memory per block"),
    Metric("smem_static", ("launch__shared_mem_per_block_static",), "static shared memory per block"),
)


def _as_metrics(metrics: Iterable[Metric | str]) -> list[Metric]:
    return [m if isinstance(m, Metric) else Metric(m, (m,), "") for m in metrics]


def choose_names(metrics: Iterable[Metric | str], rejected: Iterable[str] = ()) -> dict[str, str | None]:
    """key -> the ncu name to request, skipping rejected ones: each family takes the first spelling
    index none of its members had rejected (None: every spelling was rejected, the metric is dropped)."""
    metrics, rejected = _as_metrics(metrics), set(rejected)
    families: dict[str, list[Metric]] = {}
    for m in metrics:
        families.setdefault(m.group, []).append(m)
    chosen: dict[str, str | None] = {}
    for members in families.values():
        depth = max(len(m.names) for m in members)
        pick = next((i for i in range(depth)
                     if not any(i < len(m.names) and m.names[i] in rejected for m in members)), None)
        for m in members:
            chosen[m.key] = m.names[pick] if pick is not None and pick < len(m.names) else None
    return chosen


def _base(name: str) -> str:
    return name.split(".", 1)[0]


def rejected_names(output: str, requested: Iterable[str]) -> set[str]:
    """The requested names that ncu's error lines reject (``==ERROR== Failed to find metric
    regex:^name...``): a name counts when it is written whole in an error line, else when its
    ``unit__counter`` part is a word of one.
    An error line that names most of the request is not a rejection of each (it is about the run)."""
    requested = list(requested)
    found: set[str] = set()
    for line in output.splitlines():
        if "==ERROR==" not in line:
            continue
        plain = line.replace("\\.", ".")  # a regex's escaped dots
        named = {n for n in requested if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w.])", plain)}
        if not named:  # ncu may name the counter without the roll-up suffix asked for
            words = set(re.findall(r"[A-Za-z0-9_]+__[A-Za-z0-9_]+", line))
            named = {n for n in requested if _base(n) in words}
        if named and (len(named) <= max(1, len(requested) // 2)):
            found |= named
    return found


def permission_denied(output: str) -> bool:
    return "ERR_NVGPUCTRPERM" in output


# -- the raw CSV page -------------------------------------------------------------------------------
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BASE_UNITS = {"byte", "second", "cycle", "sector", "request", "warp", "inst", "thread", "register", "block",
               "wavefront", "hz"}
_SHORT_UNITS = {"s": "second"}  # ncu 2025+ prints "ns" and "byte/s" where older releases wrote "nsecond"


def unit_scale(unit: str) -> tuple[float, str]:
    """(factor, base unit) of an ncu unit: ``"Gbyte/second"`` -> (1e9, "byte/second"), ``"usecond"`` ->
    (1e-6, "second"), ``"ns"`` -> (1e-9, "second"), ``"%"`` -> (1, "%"). Decimal prefixes (ncu's); unknown
    units scale by 1."""
    factor, parts = 1.0, []
    for i, part in enumerate(unit.split("/")):
        scale = 1.0
        if part[:1] in _PREFIX and part[1:] in _SHORT_UNITS:
            part = part[0] + _SHORT_UNITS[part[1:]]
        part = _SHORT_UNITS.get(part, part)
        if part not in _BASE_UNITS and part[:1] in _PREFIX and part[1:] in _BASE_UNITS:
            scale, part = _PREFIX[part[0]], part[1:]
        factor = factor * scale if i == 0 else factor / scale
        parts.append(part)
    return factor, "/".join(parts)


def parse_number(text: str) -> float | None:
    """A metric's value as ncu prints it: ``"1,234.5"`` (thousands separators) -> 1234.5; ``"n/a"``,
    empty or not a number -> None."""
    text = text.strip().replace(",", "")
    if text.lower() in ("", "n/a", "na", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Value:
    """One metric of one launch: the number as printed (None: n/a), its unit, and the text."""

    value: float | None
    unit: str
    text: str = ""

    @property
    def base(self) -> float | None:
        """The value in the base unit (bytes, seconds, bytes/second ...): see :func:`unit_scale`."""
        return None if self.value is None else self.value * unit_scale(self.unit)[0]

    @property
    def base_unit(self) -> str:
        return unit_scale(self.unit)[1]


@dataclass
class KernelRow:
    """One profiled launch: ncu's launch ID, the kernel's name as ncu prints it, its metrics."""

    launch: int
    kernel: str
    metrics: dict[str, Value]
    block: str = ""
    grid: str = ""
    process: int | None = None

    def base(self, name: str | None) -> float | None:
        """The named metric in its base unit; None when not measured or n/a."""
        v = self.metrics.get(name) if name else None
        return None if v is None else v.base


def parse_raw_csv(text: str) -> list[KernelRow]:
    """The launches of ``ncu --csv --page raw`` output: the header row (from ``"ID"``), the units
    row, then one row per launch. Lines before the header (``==PROF==`` lines, the program's own
    output), ncu's ``==...==`` lines within the table and whatever follows it are skipped; a metric
    column is one whose name has ``__``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    table = []
    for line in lines[start:]:
        if line.startswith("=="):  # a message of ncu's between rows (==PROF==, ==WARNING==)
            continue
        if not line.startswith('"'):
            break
        table.append(line)
    records = list(csv.reader(table))
    header, body = records[0], records[1:]
    units = body.pop(0) if body and body[0][:1] == [""] else [""] * len(header)
    col = {name: i for i, name in enumerate(header)}
    metric_cols = [(i, name) for i, name in enumerate(header) if "__" in name]
    rows = []
    for rec in body:
        if len(rec) != len(header):
            raise ValueError(f"ncu's raw CSV row has {len(rec)} fields, its header {len(header)}: {rec[:3]}")

        def get(name: str, rec=rec) -> str:
            return rec[col[name]] if name in col else ""

        launch = parse_number(get("ID"))
        process = parse_number(get("Process ID"))
        metrics = {name: Value(parse_number(rec[i]), units[i] if i < len(units) else "", rec[i])
                   for i, name in metric_cols}
        rows.append(KernelRow(int(launch) if launch is not None else len(rows), get("Kernel Name"), metrics,
                              get("Block Size"), get("Grid Size"), int(process) if process is not None else None))
    return rows


def short_kernel_name(name: str) -> str:
    """A kernel's function name without return type, namespaces, template arguments or parameters:
    ``"void at::native::(anonymous namespace)::fill<float>(int, float*)"`` -> ``"fill"``."""
    name = name.replace("(anonymous namespace)", "")
    depth, cut = 0, []
    for ch in name:  # drop every <...> (nested), then cut at the parameters
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            cut.append(ch)
    plain = "".join(cut).split("(", 1)[0].split()
    plain = plain[-1] if plain else ""  # the last word: after the return type
    return plain.rsplit("::", 1)[-1] or name


@functools.lru_cache(maxsize=1)
def triton_kernel_ops() -> dict[str, str]:
    """The Triton kernels of ``labkit.ops``, by function name -> the op module that holds it
    (``"_linear_kernel"`` -> ``"linear"``), found by importing each op module."""
    from triton.runtime.jit import KernelInterface

    from .. import ops

    found = {}
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        for obj in vars(module).values():
            fn = getattr(obj, "fn", None)
            if isinstance(obj, KernelInterface) and callable(fn) and getattr(fn, "__module__", "") == module.__name__:
                found[fn.__name__] = info.name
    return found


def op_of(kernel: str, known: dict[str, str] | None = None) -> str | None:
    """The labkit op a kernel belongs to, from its Triton function name; ``"torch"`` for PyTorch's
    own kernels (``at::`` names); None when neither."""
    known = triton_kernel_ops() if known is None else known
    short = short_kernel_name(kernel)
    if short in known:
        return known[short]
    if "at::" in kernel or "native::" in kernel:
        return "torch"
    return None


# -- running ncu ------------------------------------------------------------------------------------
def ncu_command(argv: Sequence[str], names: Iterable[str], *, ncu: str = "ncu", kernel_regex: str | None = None,
                launch_skip: int = 0, launch_count: int | None = None, profile_from_start: bool = True) -> list[str]:
    """The ncu command line that profiles ``argv`` for ``names``, printing the raw page as CSV."""
    cmd = [ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
           "--metrics", ",".join(names), "--target-processes", "all"]
    if not profile_from_start:  # profile only between cudaProfilerStart and cudaProfilerStop
        cmd += ["--profile-from-start", "off"]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    return [*cmd, *argv]


@dataclass
class Profile:
    """What :func:`profile` measured: the launches, which ncu name each metric key was measured
    under (None: dropped), the names ncu rejected, and the command of the run that succeeded."""

    rows: list[KernelRow]
    names: dict[str, str | None]
    rejected: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)

    def value(self, row: KernelRow, key: str) -> float | None:
        """Metric ``key`` of ``row`` in its base unit (None: dropped, or n/a)."""
        return row.base(self.names.get(key))

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def _run(cmd: list[str], timeout_s: float, env: dict | None) -> tuple[int, str, str]:
    """Run ``cmd`` in its own process group; past ``timeout_s`` the whole group (ncu and the program it
    profiles) is stopped and NcuError raised."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise NcuError(f"ncu ran past {timeout_s:g} s and was stopped: {shlex.join(cmd)}\n{_tail(out + err)}") from None
    return proc.returncode, out, err


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def profile(argv: Sequence[str], metrics: Iterable[Metric | str], *, kernel_regex: str | None = None,
            launch_skip: int = 0, launch_count: int | None = None, timeout_s: float = 300,
            profile_from_start: bool = True, rejected: Iterable[str] = (), ncu: str | None = None,
            env: dict | None = None, max_retries: int = 6) -> Profile:
    """Profile the program ``argv`` (e.g. ``[sys.executable, "-m", "module", ...]``) under ncu.

    ``kernel_regex``: only kernels whose function name matches; ``launch_skip``/``launch_count``: of
    those, skip the first N and profile M; ``profile_from_start=False``: only the launches between
    the program's ``cudaProfilerStart`` and ``cudaProfilerStop`` (``torch.cuda.profiler.start()``).
    A metric name ncu rejects is dropped (its family tries its next spelling) and the run repeated,
    at most ``max_retries`` times; ``rejected``: names known to be rejected already (from
    :func:`check_metrics`). Raises :class:`CountersNotPermitted` on ERR_NVGPUCTRPERM, NcuError
    when ncu fails otherwise or profiles nothing.
    """
    metrics = _as_metrics(metrics)
    ncu = ncu or find_ncu()
    if ncu is None:
        raise NcuError(ncu_missing_reason() or "ncu is not installed")
    rejected = set(rejected)
    for _ in range(max_retries + 1):
        names = choose_names(metrics, rejected)
        wanted = sorted({n for n in names.values() if n})
        if not wanted:
            raise NcuError(f"ncu rejected every metric asked for: {sorted(rejected)}")
        cmd = ncu_command(argv, wanted, ncu=ncu, kernel_regex=kernel_regex, launch_skip=launch_skip,
                          launch_count=launch_count, profile_from_start=profile_from_start)
        code, out, err = _run(cmd, timeout_s, env)
        both = out + "\n" + err
        if permission_denied(both):
            raise CountersNotPermitted(PERMISSION_MESSAGE)
        bad = rejected_names(both, wanted)
        rows = parse_raw_csv(out) or parse_raw_csv(both)
        if code == 0 and rows:  # a complaint about a name in a run that profiled: that name is dropped
            names = {k: (None if n in bad else n) for k, n in names.items()}
            return Profile(rows, names, sorted(rejected | bad), cmd)
        if bad:
            rejected |= bad
            print(f"ncu rejected {', '.join(sorted(bad))}: dropped, profiling again", file=sys.stderr)
            continue
        if code != 0:
            raise NcuError(f"ncu exited with status {code}: {shlex.join(cmd)}\n{_tail(both)}")
        raise NcuError(f"ncu profiled no kernel (check the kernel filter, or that the program calls "
                       f"cudaProfilerStart when profile_from_start=False): {shlex.join(cmd)}\n{_tail(both)}")
    raise NcuError(f"ncu kept rejecting metrics after {max_retries} retries: {sorted(rejected)}")


PROBE = "import torch; x = torch.ones(1 << 16, device='cuda'); torch.cuda.synchronize()"


def check_metrics(metrics: Iterable[Metric | str], *, timeout_s: float = 180, ncu: str | None = None) -> Profile:
    """Profile one tiny kernel (``torch.ones`` on the GPU) for ``metrics``: which names this ncu and
    GPU accept (:attr:`Profile.rejected`), and whether counters can be read at all, for a few seconds
    per try instead of a whole program's."""
    return profile([sys.executable, "-c", PROBE], metrics, launch_count=1, timeout_s=timeout_s, ncu=ncu)


# -- the article's commands beside the real ones ----------------------------------------------------
TARGET = ["python", "-m", "labkit.lab.counters_target", "--model", "lfm2-350m", "--batch", "1", "--steps", "2"]


def article_commands() -> list[dict[str, str]]:
    """The article's profiling commands, each beside what to run instead and why (rows for a table).

    The article's metric names are checked against ncu's listing for the H200 by ``python -m labkit
    bench ncu-metrics`` (data/bench/nvidia-h200/ncu-metric-names.json); ``article_names`` lists them.
    """
    occupancy = [m.names[0] for m in DECODE_METRICS if m.key in ("occupancy", "occupancy_theoretical")]
    traffic = [m.names[0] for m in DECODE_METRICS if m.key in ("time", "dram_read", "dram_write", "dram_pct_peak")]
    banks = [m.names[0] for m in DECODE_METRICS if m.key.startswith("bank_conflicts")]
    real = functools.partial(ncu_command, profile_from_start=False)
    return [
        {"what": "real vs theoretical occupancy",
         "article": 'nv-nsight-cu-cli --metrics "sm__maximum_warps_avg,sm__warps_active_avg"',
         "article_names": "sm__maximum_warps_avg,sm__warps_active_avg",
         "instead": shlex.join(real(TARGET, occupancy)),
         "why": "nv-nsight-cu-cli is an old name of the CLI (today ncu), and ncu lists neither metric: achieved "
                "occupancy is sm__warps_active.avg.pct_of_peak_sustained_active, theoretical "
                "sm__maximum_warps_per_active_cycle_pct. The article's line also names no program to profile."},
        {"what": "TMA traffic",
         "article": 'ncu --metrics "tma__bytes_queried,tma__throughput"',
         "article_names": "tma__bytes_queried,tma__throughput",
         "instead": shlex.join(real(TARGET, traffic)),
         "why": "ncu has no tma__ counters on the H200 (ncu --query-metrics --chip gh100 lists what exists). "
                "What a TMA weight stream is for, bytes from HBM per second, is dram__bytes_read.sum over "
                "gpu__time_duration.sum, and dram__throughput as a share of the peak."},
        {"what": "shared-memory bank conflicts",
         "article": "(a claim, no command) banks are 8 bytes wide on Hopper and 4 on B200",
         "article_names": "",
         "instead": shlex.join(real(["python", "-m", "labkit.lab.bank_conflicts", "--run"], banks,
                                    kernel_regex="^labkit_transpose_")),
         "why": "Hopper and Blackwell both have 32 banks of 4 bytes; python -m labkit bench bank-conflicts "
                "predicts the conflicts of three tile layouts from that and reads them from these counters."},
        {"what": "timeline",
         "article": "nsys profile --stats=true ./inference_script",
         "article_names": "",
         "instead": "nsys profile --stats=true python -m labkit.lab.counters_target --model lfm2-350m",
         "why": "a real command (Nsight Systems): a timeline of launches and gaps, no counters; "
                "labkit.lab.profile gets the same from torch.profiler inside the notebook."},
    ]


# -- per-kernel summaries ---------------------------------------------------------------------------
@dataclass
class KernelSummary:
    """The launches of one kernel at one launch shape (name, grid, block) in a profile, summed or
    averaged over their GPU time. None where the metric was not measured."""

    kernel: str
    op: str | None
    grid: str
    block: str
    launches: int
    time_us: float | None  # all its launches together
    dram_bytes: float | None  # read + written
    dram_tb_s: float | None
    dram_pct_peak: float | None  # ncu's share of the HBM peak, time-weighted
    occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    registers: int | None
    spill_bytes: float | None  # local-memory bytes loaded + stored
    bank_conflicts: float | None
    top_stall: str | None  # the stall reason with the most cycles per issued instruction
    top_stall_cycles: float | None


def _total(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) or not values else float(sum(values))


def _weighted(values: list[float | None], weights: list[float | None]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights) if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total else None


def summarize(prof: Profile, known_ops: dict[str, str] | None = None) -> list[KernelSummary]:
    """One :class:`KernelSummary` per (kernel name, grid, block), longest total time first."""
    groups: dict[tuple[str, str, str], list[KernelRow]] = {}
    for row in prof.rows:
        groups.setdefault((short_kernel_name(row.kernel), row.grid, row.block), []).append(row)
    stalls = [m for m in DECODE_METRICS if m.family == "stall" and prof.names.get(m.key)]
    out = []
    for (name, grid, block), rows in groups.items():
        def col(key: str, rows=rows) -> list[float | None]:
            return [prof.value(r, key) for r in rows]

        def both(a: str, b: str) -> list[float | None]:
            return [x + y if x is not None and y is not None else None for x, y in zip(col(a), col(b))]

        weights = col("time")
        time, dram = _total(weights), _total(both("dram_read", "dram_write"))
        stall = {m.key: _weighted(col(m.key), weights) for m in stalls}
        stall = {k: c for k, c in stall.items() if c is not None}
        top = max(stall, key=stall.get) if stall else None
        regs = [r for r in col("registers") if r is not None]
        out.append(KernelSummary(
            kernel=name, op=op_of(rows[0].kernel, known_ops), grid=grid, block=block, launches=len(rows),
            time_us=None if time is None else time * 1e6, dram_bytes=dram,
            dram_tb_s=dram / time / 1e12 if dram is not None and time else None,
            dram_pct_peak=_weighted(col("dram_pct_peak"), weights),
            occupancy_pct=_weighted(col("occupancy"), weights),
            theoretical_occupancy_pct=_weighted(col("occupancy_theoretical"), weights),
            registers=int(max(regs)) if regs else None, spill_bytes=_total(both("local_load", "local_store")),
            bank_conflicts=_total(both("bank_conflicts_ld", "bank_conflicts_st")),
            top_stall=top.removeprefix("stall_") if top else None, top_stall_cycles=stall.get(top) if top else None,
        ))
    return sorted(out, key=lambda s: -(s.time_us or 0.0))


def _cell(value, fmt: str, width: int) -> str:
    return f"{'-' if value is None else format(value, fmt):>{width}}"


def format_summaries(summaries: list[KernelSummary], copy_bytes_per_s: float | None = None) -> str:
    """A text table of :func:`summarize`'s rows: time, HBM bandwidth (TB/s, % of ncu's peak, % of the
    measured copy), occupancy achieved/theoretical, registers, spill bytes, bank conflicts, top stall."""
    head = (f"{'kernel':<28} {'op':<18} {'grid':>14} {'n':>3} {'time us':>9} {'TB/s':>6} {'%peak':>6} "
            f"{'%copy':>6} {'occ%':>5} {'theo%':>5} {'regs':>4} {'spill B':>8} {'conflicts':>9}  top stall")
    lines = [head, "-" * len(head)]
    for s in summaries:
        copy = s.dram_tb_s * 1e12 / copy_bytes_per_s * 100 if s.dram_tb_s is not None and copy_bytes_per_s else None
        stall = f"{s.top_stall} ({s.top_stall_cycles:.1f})" if s.top_stall else "-"
        lines.append(
            f"{s.kernel[:28]:<28} {(s.op or '-')[:18]:<18} {s.grid[:14]:>14} {s.launches:>3} "
            f"{_cell(s.time_us, '.1f', 9)} {_cell(s.dram_tb_s, '.2f', 6)} {_cell(s.dram_pct_peak, '.1f', 6)} "
            f"{_cell(copy, '.1f', 6)} {_cell(s.occupancy_pct, '.1f', 5)} {_cell(s.theoretical_occupancy_pct, '.1f', 5)} "
            f"{_cell(s.registers, 'd', 4)} {_cell(s.spill_bytes, '.0f', 8)} {_cell(s.bank_conflicts, '.0f', 9)}  {stall}")
    return "\n".join(lines)
