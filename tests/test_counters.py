"""Hardware counters without a GPU: ncu's raw CSV read back (units, thousands separators, n/a, the
lines around the table), rejected metric names dropped and retried (a stand-in ncu), the reasons
given where ncu cannot run, the bank arithmetic of the transpose demo against a thread-by-thread
count, the article's commands beside the real ones, and the demo's CUDA source compiled for sm_90a
and sm_100a with plain nvcc."""

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from labkit import cuda, resources
from labkit.lab import bank_conflicts as bc
from labkit.lab import counters

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","dram__bytes_read.sum","dram__bytes_read.sum.per_second",'
          '"dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum",'
          '"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","launch__registers_per_thread",'
          '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
          '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"')
SAMPLE = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    "lfm2-350m fused batch 1: profiled step 34",  # the program's own output, before the table
    HEADER,
    '"","","","","","","","","","","","Mbyte","Gbyte/second","%","usecond","","register/thread","",""',
    '"0","4242","python3.12","h200","_linear_kernel","1","7","(128, 1, 1)","(264, 1, 1)","0","9.0",'
    '"1,234.5","2,850.25","61.3","0.4331","0","40","12.5","1.5"',
    "==WARNING== a message of ncu's between two rows",
    '"1","4242","python3.12","h200","void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, '
    'long, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, long)","1","7",'
    '"(128, 1, 1)","(8, 1, 1)","0","9.0","n/a","0","0.9","2.1","0","16","0.5","n/a"',
    '"2","4242","python3.12","h200","_linear_kernel","1","7","(128, 1, 1)","(264, 1, 1)","0","9.0",'
    '"1,000","2,000","40","0.5","12","40","2","4"',
    "==PROF== Disconnected from process 4242",
])
STALL_LONG = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"


def test_the_raw_page_is_read_with_units_separators_and_na():
    rows = counters.parse_raw_csv(SAMPLE)
    assert [r.launch for r in rows] == [0, 1, 2] and rows[0].process == 4242
    assert rows[0].grid == "(264, 1, 1)" and rows[0].block == "(128, 1, 1)"
    read = rows[0].metrics["dram__bytes_read.sum"]
    assert (read.value, read.unit, read.text) == (1234.5, "Mbyte", "1,234.5")
    assert read.base == pytest.approx(1.2345e9) and read.base_unit == "byte"
    rate = rows[0].metrics["dram__bytes_read.sum.per_second"]
    assert rate.base == pytest.approx(2.85025e12) and rate.base_unit == "byte/second"
    assert rows[0].base("gpu__time_duration.sum") == pytest.approx(0.4331e-6)
    assert rows[0].base("dram__throughput.avg.pct_of_peak_sustained_elapsed") == 61.3
    regs = rows[0].metrics["launch__registers_per_thread"]
    assert regs.base == 40 and regs.base_unit == "register/thread"
    assert rows[1].metrics["dram__bytes_read.sum"].value is None  # n/a
    assert rows[1].base("no__such_metric.sum") is None


@pytest.mark.parametrize("unit,factor,base", [
    ("Gbyte/second", 1e9, "byte/second"), ("nsecond", 1e-9, "second"), ("msecond", 1e-3, "second"),
    ("Kbyte", 1e3, "byte"), ("byte", 1, "byte"), ("%", 1, "%"), ("register/thread", 1, "register/thread"),
    ("cycle/usecond", 1e6, "cycle/second"), ("", 1, ""), ("warp", 1, "warp"),
    # the short forms today's ncu prints (seen on the H200 machine, ncu of CUDA 13)
    ("ns", 1e-9, "second"), ("us", 1e-6, "second"), ("byte/s", 1, "byte/second"), ("Gbyte/s", 1e9, "byte/second")])
def test_units_scale_to_their_base(unit, factor, base):
    got = counters.unit_scale(unit)
    assert got[0] == pytest.approx(factor) and got[1] == base


def test_no_table_is_no_rows_and_a_short_row_is_an_error():
    assert counters.parse_raw_csv("==PROF== Connected\n==ERROR== something\n") == []
    broken = SAMPLE.replace('"1,000","2,000","40","0.5","12","40","2","4"', '"1,000"')
    with pytest.raises(ValueError, match="fields"):
        counters.parse_raw_csv(broken)


def test_kernel_names_are_shortened_and_given_their_op():
    rows = counters.parse_raw_csv(SAMPLE)
    assert counters.short_kernel_name(rows[1].kernel) == "indexSelectSmallIndex"
    assert counters.short_kernel_name("_linear_kernel") == "_linear_kernel"
    known = counters.triton_kernel_ops()
    assert known["_linear_kernel"] == "linear" and known["_gdn_decode_kernel"] == "gated_delta_decode"
    assert counters.op_of(rows[0].kernel) == "linear" and counters.op_of(rows[1].kernel) == "torch"
    assert counters.op_of("labkit_transpose_naive") is None


def test_summaries_group_launches_and_weigh_by_time():
    prof = counters.Profile(counters.parse_raw_csv(SAMPLE), {
        "time": "gpu__time_duration.sum", "dram_read": "dram__bytes_read.sum", "dram_write": None,
        "dram_pct_peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "registers": "launch__registers_per_thread", "stall_long_scoreboard": STALL_LONG,
        "stall_wait": "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "bank_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "bank_conflicts_st": None})
    index, linear = counters.summarize(prof)  # longest first
    assert (linear.kernel, linear.op, linear.launches, index.kernel) == ("_linear_kernel", "linear", 2, "indexSelectSmallIndex")
    assert linear.time_us == pytest.approx(0.9331)
    assert linear.dram_pct_peak == pytest.approx((61.3 * 0.4331 + 40 * 0.5) / 0.9331)
    assert linear.dram_bytes is None and linear.bank_conflicts is None  # a dropped metric is no number
    assert linear.registers == 40
    assert linear.top_stall == "long_scoreboard"  # 12.5 and 2 beat 1.5 and 4, weighted by time
    assert index.top_stall == "long_scoreboard"  # the n/a wait stall is left out
    table = counters.format_summaries([linear, index], copy_bytes_per_s=4.25e12)
    assert "_linear_kernel" in table and "long_scoreboard" in table


def test_a_rejected_name_moves_its_family_to_the_next_spelling():
    stall_names = {m.names[0] for m in counters.DECODE_METRICS if m.family == "stall"}
    out = "==PROF== Connected\n==ERROR== Failed to find metric regex:^" + STALL_LONG.replace(".", r"\.") + "$\n"
    assert counters.rejected_names(out, sorted(stall_names | {"gpu__time_duration.sum"})) == {STALL_LONG}
    chosen = counters.choose_names(counters.DECODE_METRICS, {STALL_LONG})
    assert chosen["stall_barrier"] == "smsp__average_warp_latency_issue_stalled_barrier.ratio"
    assert chosen["time"] == "gpu__time_duration.sum"
    assert counters.choose_names(["a__b.sum"], {"a__b.sum"}) == {"a__b.sum": None}
    # a suffix that does not exist rejects that name only, not the counter's other roll-ups
    out = "==ERROR== Failed to find metric dram__bytes_read.sum.per_second\n"
    assert counters.rejected_names(out, ["dram__bytes_read.sum", "dram__bytes_read.sum.per_second"]) == {
        "dram__bytes_read.sum.per_second"}
    # an error about the run that lists the request is not a rejection of each name
    names = ["a__x.sum", "b__y.sum", "c__z.sum"]
    assert counters.rejected_names("==ERROR== could not profile with a__x.sum,b__y.sum,c__z.sum\n", names) == set()


FAKE_NCU = '''\
    import os, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_NCU_LOG"], "a") as log:
        log.write(" ".join(args) + "\\n")
    if os.environ.get("FAKE_NCU_PERM"):
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
        sys.exit(1)
    names = args[args.index("--metrics") + 1].split(",")
    bad = [n for n in names if n.startswith("bad__")]
    print("==PROF== Connected to process 1 (python)")
    if bad:
        print("==ERROR== Failed to find metric regex:^" + bad[0].split(".")[0] + "\\\\.(sum|avg)$", file=sys.stderr)
        sys.exit(1)
    for n in names:
        if n.startswith("warn__"):  # complained about, the run goes on
            print("==ERROR== Failed to find metric " + n)
    if os.environ.get("FAKE_NCU_EMPTY"):
        sys.exit(0)
    cols = ",".join('"%s"' % n for n in names)
    print('"ID","Process ID","Kernel Name","Block Size","Grid Size",' + cols)
    print('"","","","",""' + ',"byte"' * len(names))
    for i in range(2):
        print('"%d","1","_linear_kernel","(128, 1, 1)","(8, 1, 1)"' % i + ',"1,024"' * len(names))
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_NCU))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "calls.txt"))
    return path


def _calls(fake_ncu):
    return (fake_ncu.parent / "calls.txt").read_text().splitlines()


def test_profile_drops_a_rejected_name_and_runs_again(fake_ncu, capsys):
    metrics = [counters.Metric("time", ("gpu__time_duration.sum",), ""),
               counters.Metric("odd", ("bad__counter.sum", "good__counter.sum"), "")]
    prof = counters.profile(["python", "-m", "target"], metrics, ncu=str(fake_ncu), kernel_regex="^_linear",
                            profile_from_start=False)
    assert prof.rejected == ["bad__counter.sum"] and prof.names["odd"] == "good__counter.sum"
    assert [r.base(prof.names["time"]) for r in prof.rows] == [1024, 1024]
    first, second = _calls(fake_ncu)
    assert "bad__counter.sum" in first and "bad__counter.sum" not in second
    for flag in ("--csv --page raw", "--clock-control none", "--profile-from-start off",
                 "--kernel-name regex:^_linear", "--target-processes all"):
        assert flag in second
    assert second.endswith("python -m target") and "rejected bad__counter.sum" in capsys.readouterr().err


def test_a_name_complained_about_in_a_run_that_profiled_is_dropped_without_a_rerun(fake_ncu):
    prof = counters.profile(["prog"], ["gpu__time_duration.sum", "warn__x.sum"], ncu=str(fake_ncu))
    assert prof.rejected == ["warn__x.sum"] and prof.names == {"gpu__time_duration.sum": "gpu__time_duration.sum",
                                                               "warn__x.sum": None}
    assert len(_calls(fake_ncu)) == 1 and len(prof.rows) == 2


def test_profile_says_when_counters_are_refused_or_nothing_was_profiled(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_EMPTY", "1")
    with pytest.raises(counters.NcuError, match="profiled no kernel"):
        counters.profile(["prog"], ["gpu__time_duration.sum"], ncu=str(fake_ncu))
    monkeypatch.setenv("FAKE_NCU_PERM", "1")
    with pytest.raises(counters.CountersNotPermitted, match="NVreg_RestrictProfilingToAdminUsers=0"):
        counters.profile(["prog"], ["gpu__time_duration.sum"], ncu=str(fake_ncu))


def test_without_ncu_the_reason_says_it_is_not_installed(monkeypatch, tmp_path):
    monkeypatch.delenv(counters.NCU_ENV, raising=False)
    monkeypatch.setattr(counters.shutil, "which", lambda name: None)
    monkeypatch.setattr(counters, "_NCU_GLOBS", (str(tmp_path / "none*" / "ncu"),))
    assert counters.find_ncu() is None
    reason = counters.ncu_unavailable_reason()
    assert "not installed" in reason and "LABKIT_NCU" in reason
    from labkit.__main__ import main

    assert main(["bench", "counters", "--model", "lfm2-350m", "--data-dir", str(tmp_path / "data")]) == 2
    assert not list(tmp_path.rglob("*.json"))


def test_restricted_counters_are_reported_with_the_fix(monkeypatch, fake_ncu, tmp_path):
    monkeypatch.setenv(counters.NCU_ENV, str(fake_ncu))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(counters.os, "geteuid", lambda: 1000)
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    reason = counters.ncu_unavailable_reason(params=params)
    assert "ERR_NVGPUCTRPERM" in reason and "sudo" in reason and "NVreg_RestrictProfilingToAdminUsers=0" in reason
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert counters.ncu_unavailable_reason(params=params) is None
    monkeypatch.setenv("FAKE_NCU_PERM", "1")  # the probe asks ncu itself
    assert "ERR_NVGPUCTRPERM" in counters.ncu_unavailable_reason(check_counters=True, params=params)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU" in counters.ncu_unavailable_reason(params=params)


def test_the_article_commands_stand_beside_real_ones():
    rows = counters.article_commands()
    assert any("nv-nsight-cu-cli" in r["article"] for r in rows)
    saved = json.loads((resources.bench_dir() / "nvidia-h200" / "ncu-metric-names.json").read_text())
    listed = {r["name"]: r["listed"] for r in saved["results"]}
    real = {n for m in (*counters.DECODE_METRICS, *bc.bank_metrics()) for n in m.names}
    for r in rows:
        assert r["instead"].split()[0] in ("ncu", "nsys") and "nv-nsight-cu-cli" not in r["instead"]
        for name in filter(None, r["article_names"].split(",")):
            assert listed[name] is False, f"{name} is listed by ncu: the table should not call it wrong"
        if r["instead"].startswith("ncu"):
            asked = r["instead"].split("--metrics ", 1)[1].split()[0].split(",")
            assert asked and set(asked) <= real and "--clock-control none" in r["instead"]


# -- the bank-conflict demo -------------------------------------------------------------------------
def test_wavefronts_follow_the_banks():
    assert bc.wavefronts(range(32)) == 1  # 32 consecutive words: every bank once
    assert bc.wavefronts([0] * 32) == 1  # one word: a broadcast
    assert bc.wavefronts([32 * i for i in range(32)]) == 32  # a column of a [32][32] tile: one bank
    assert bc.wavefronts([2 * i for i in range(32)]) == 2  # stride 2: 16 banks, two words each
    assert bc.wavefronts([None] * 32) == 0
    assert bc.bank_of(4 * 33) == 1 and bc.bank_of(128) == 0


@pytest.mark.parametrize("layout,ld_per_access", [("naive", 32), ("padded", 1), ("swizzled", 1)])
def test_a_column_read_costs_what_its_layout_predicts(layout, ld_per_access):
    for j in range(bc.TILE):
        assert bc.wavefronts([bc.tile_word(layout, tx, j) for tx in range(32)]) == ld_per_access  # column j
        assert bc.wavefronts([bc.tile_word(layout, j, tx) for tx in range(32)]) == 1  # row j
    p = bc.predict(layout, 4096, 4096)
    accesses = (4096 // 32) ** 2 * bc.BLOCK_ROWS * (bc.TILE // bc.BLOCK_ROWS)
    assert p.ld_requests == p.st_requests == accesses and p.st_conflicts == 0
    assert p.ld_conflicts == accesses * (ld_per_access - 1)


def _thread_by_thread(layout, rows, cols):
    """The kernel's accesses, lane by lane from its global indices (not through tile_accesses)."""
    ld_req = st_req = ld_wf = st_wf = 0
    for by in range(0, rows, 32):
        for bx in range(0, cols, 32):
            for ty in range(bc.BLOCK_ROWS):
                for k in range(4):
                    j = ty + 8 * k
                    st = [bc.tile_word(layout, j, tx) if by + j < rows and bx + tx < cols else None for tx in range(32)]
                    ld = [bc.tile_word(layout, tx, j) if bx + j < cols and by + tx < rows else None for tx in range(32)]
                    if any(w is not None for w in st):
                        st_req, st_wf = st_req + 1, st_wf + bc.wavefronts(st)
                    if any(w is not None for w in ld):
                        ld_req, ld_wf = ld_req + 1, ld_wf + bc.wavefronts(ld)
    return ld_req, st_req, ld_wf, st_wf


@pytest.mark.parametrize("layout", bc.LAYOUTS)
@pytest.mark.parametrize("rows,cols", [(70, 45), (33, 100), (5, 3), (64, 64)])
def test_the_prediction_of_a_whole_transpose_matches_a_lane_count(layout, rows, cols):
    p = bc.predict(layout, rows, cols)
    assert (p.ld_requests, p.st_requests, p.ld_wavefronts, p.st_wavefronts) == _thread_by_thread(layout, rows, cols)


def test_bad_layouts_and_shapes_are_refused():
    with pytest.raises(ValueError, match="layout must be one of"):
        bc.tile_word("diagonal", 0, 0)
    with pytest.raises(ValueError, match="rows, cols >= 1"):
        bc.predict("naive", 0, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        bc.transpose(torch.zeros(4, 4), "diagonal")
    with pytest.raises(ValueError, match="contiguous float32 CUDA matrix"):
        bc.transpose(torch.zeros(4, 4), "naive")


@pytest.fixture(scope="module")
def transpose_ptxas(tmp_path_factory):
    from test_cuda_kernels import _need_nvcc

    _need_nvcc()
    source = tmp_path_factory.mktemp("bank") / "transpose.cu"
    source.write_text(bc.KERNEL_SOURCE)
    return {arch: cuda.ptxas_report(source, arch) for arch in cuda.ARCHS}


@pytest.mark.parametrize("arch", cuda.ARCHS)
def test_the_transpose_source_compiles_for_each_target(arch, transpose_ptxas):
    entries = {e.kernel: e for e in transpose_ptxas[arch]}
    assert set(entries) == {bc.KERNEL_PREFIX + layout for layout in bc.LAYOUTS}
    for e in entries.values():
        assert e.arch == f"sm_{arch}" and (e.spill_store_bytes, e.spill_load_bytes) == (0, 0)


def test_the_target_decodes_a_tiny_preset_on_the_cpu():
    from labkit.lab.counters_target import run

    tokens = run("tiny-lfm2", batch=2, context=3, steps=2, backend="reference", device="cpu")
    assert tokens.shape == (2,) and tokens.dtype == torch.int64
    with pytest.raises(ValueError, match="steps >= 2"):
        run("tiny-lfm2", steps=1, device="cpu")


# -- the bench commands' reporting, with the GPU parts stood in for ---------------------------------
@pytest.fixture
def h200(monkeypatch):
    from labkit.lab import hw

    facts = hw.DeviceFacts("NVIDIA H200", "cuda", 132, 141 << 30, (9, 0), 60 << 20, 4.25e12, 7e14)
    monkeypatch.setattr(hw, "device_facts", lambda *a, **k: facts)
    return facts


def test_bench_counters_writes_launches_and_summaries(monkeypatch, tmp_path, h200, capsys):
    from labkit.__main__ import main

    names = counters.choose_names(counters.DECODE_METRICS)
    names["dram_write"] = None  # as if ncu had rejected it
    calls = []

    def fake_profile(argv, metrics, **kw):
        calls.append((argv, kw))
        return counters.Profile(counters.parse_raw_csv(SAMPLE), names, ["x__rejected.sum"], ["ncu", *argv])

    monkeypatch.setattr(counters, "ncu_missing_reason", lambda: None)
    monkeypatch.setattr(counters, "check_metrics", lambda m: counters.Profile([], {}, ["x__rejected.sum"]))
    monkeypatch.setattr(counters, "profile", fake_profile)
    assert main(["bench", "counters", "--model", "lfm2-350m", "--data-dir", str(tmp_path)]) == 0
    (argv, kw), = calls
    assert argv[1:3] == ["-m", "labkit.lab.counters_target"] and "lfm2-350m" in argv
    assert kw["profile_from_start"] is False and kw["rejected"] == ["x__rejected.sum"]
    doc = json.loads((tmp_path / "nvidia-h200" / "ncu-decode.json").read_text())
    assert doc["kind"] == "ncu-decode" and doc["gpu"] == "NVIDIA H200" and len(doc["results"]) == 3
    first = doc["results"][0]
    assert first["op"] == "linear" and first["metrics"]["time"] == pytest.approx(0.4331e-6)
    assert "dram_write" not in first["metrics"] and first["units"]["time"] == "second"
    assert {m["key"]: m["name"] for m in doc["metrics"]}["dram_write"] is None
    assert [s["kernel"] for s in doc["summary"]] == ["indexSelectSmallIndex", "_linear_kernel"]
    out = capsys.readouterr().out
    assert "ncu rejects x__rejected.sum" in out and "_linear_kernel" in out and "wrote" in out


def test_bench_bank_conflicts_sets_counters_beside_the_prediction(monkeypatch, tmp_path, h200, capsys):
    from labkit.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bc, "check", lambda: [])
    monkeypatch.setattr(bc, "time_layouts", lambda rows, cols, repeats: [
        bc.Timed(layout, rows, cols, 0.2, 2 * rows * cols * 4 / 0.2e-3 / 1e9, [0.2]) for layout in bc.LAYOUTS])
    monkeypatch.setattr(counters, "ncu_missing_reason", lambda: None)
    monkeypatch.setattr(counters, "check_metrics", lambda m: counters.Profile([], {}, []))

    def fake_layouts(rows, cols, rejected):
        p = {layout: bc.predict(layout, rows, cols) for layout in bc.LAYOUTS}
        return ({layout: {"bank_conflicts_ld": float(p[layout].ld_conflicts), "bank_conflicts_st": 0.0,
                          "wavefronts_ld": float(p[layout].ld_wavefronts), "requests_ld": float(p[layout].ld_requests)}
                 for layout in bc.LAYOUTS}, counters.Profile([], {}, [], ["ncu", "--csv"]))

    monkeypatch.setattr(bc, "profile_layouts", fake_layouts)
    assert main(["bench", "bank-conflicts", "--profile-size", "64", "64", "--data-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "nvidia-h200" / "bank-conflicts.json").read_text())
    naive = doc["results"][0]
    assert naive["layout"] == "naive" and naive["prediction"]["ld_conflicts"] == 4 * 8 * 4 * 31
    assert naive["counters"]["bank_conflicts_ld"] == 4 * 8 * 4 * 31 and doc["counters_note"] is None
    assert doc["ncu_command"] == "ncu --csv" and doc["banks"] == 32
    assert "32.0, 32.0" in capsys.readouterr().out  # wavefronts per naive column read: predicted, measured

    monkeypatch.setattr(counters, "ncu_missing_reason", lambda: "ncu is not installed here")
    assert main(["bench", "bank-conflicts", "--data-dir", str(tmp_path), "--name", "b2"]) == 0
    doc = json.loads((tmp_path / "nvidia-h200" / "b2.json").read_text())
    assert doc["counters_note"] == "ncu is not installed here" and doc["results"][0]["counters"] is None
