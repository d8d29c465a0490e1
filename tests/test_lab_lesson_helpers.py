"""The lab helpers notebooks 04 and 05 call: source excerpts, results-file tables, Little's law, the
stream fits and the persistent step's cost model, each against a hand-worked case."""

import math

import numpy as np
import pytest

from labkit.lab import little_law, source_excerpt, stream_fits
from labkit.lab.lesson_files import files_table, load

SRC = "int a;\n\n// start here\nint b = 1;\nint c = 2;\n// end\nint d;\n"


def test_excerpt_between_markers_and_to_a_blank_line():
    assert source_excerpt.excerpt(SRC, "start here", "// end") == "// start here\nint b = 1;\nint c = 2;"
    assert source_excerpt.excerpt(SRC, "int b", "// end", include_end=True) == "int b = 1;\nint c = 2;\n// end"
    assert source_excerpt.excerpt(SRC, "int b") == "int b = 1;\nint c = 2;\n// end\nint d;"
    with pytest.raises(ValueError, match="start marker"):
        source_excerpt.excerpt(SRC, "not there")
    with pytest.raises(ValueError, match="end marker"):
        source_excerpt.excerpt(SRC, "int b", "int a")
    assert source_excerpt.fenced("x = 1", "cpp", "note").splitlines() == ["note", "", "```cpp", "x = 1", "```"]


def test_files_table_lists_provenance_and_a_missing_file_is_an_error():
    docs = load(["hw"])
    table = files_table(docs)
    assert "`hw.json`" in table and docs["hw"]["date"][:16] in table
    with pytest.raises(FileNotFoundError, match="no committed results"):
        load(["no-such-file"])


def test_littles_law_and_blocks():
    assert little_law.bytes_in_flight(1000, 4e12) == pytest.approx(4e6)
    with pytest.raises(ValueError):
        little_law.bytes_in_flight(0, 4e12)
    assert little_law.blocks_to_cover(33_000, 2, 8192) == 3
    assert little_law.blocks_to_cover(100, 2, 8192) == 1
    rows = [{"pattern": "stride", "style": "pointer", "nbytes": n, "ns_per_load": v, "error": None}
            for n, v in ((1 << 20, 300.0), (1 << 28, 350.0))]
    assert little_law.latency_ns(rows, "stride", "pointer") == 350.0
    assert little_law.latency_ns(rows, "stride", "pointer", 1 << 20) == 300.0
    with pytest.raises(KeyError, match="no latency row"):
        little_law.latency_ns(rows, "random", "pointer")


def _row(nbytes, us):
    return {"weight_bytes": nbytes, "us": us, "error": None}


def test_stream_fit_half_bandwidth_and_the_above_copy_check():
    rows = [_row(b, 2.0 + b / 4e12 * 1e6) for b in (1e6, 1e7, 1e8, 5e8)]  # 2 us + B / 4 TB/s exactly
    f = stream_fits.fit_rows(rows)
    assert f.t0_us == pytest.approx(2.0) and f.bytes_per_s == pytest.approx(4e12)
    # B / (2 us + B / 4 TB/s) = 1.5 TB/s  =>  B = 2e-6 / (2 / 3e12 - 1 / 4e12)
    assert stream_fits.half_bandwidth_bytes(f, 3e12) == pytest.approx(2e-6 / (2 / 3e12 - 1 / 4e12))
    assert math.isinf(stream_fits.half_bandwidth_bytes(f, 9e12))
    chk = stream_fits.above_copy_check(rows, 3.5e12, 60 * 2**20)
    assert chk["own_bytes_per_s"] == pytest.approx(5e8 / (127e-6)) and chk["own_above_copy"]
    assert chk["top_slope_bytes_per_s"] == pytest.approx(4e12)
    assert chk["l2_share_max"] == pytest.approx(60 * 2**20 / 5e8)
    assert not stream_fits.above_copy_check(rows, 4.5e12, 60 * 2**20)["own_above_copy"]
    assert "| 1 | x |" in stream_fits.fits_table({("x", 1): f}, 3e12)


def test_instruction_costs_deal_fit_and_step():
    from labkit.lab import instruction_costs as ic

    rows = [{"instruction": "a", "op": "gate_up", "tiles": 5}, {"instruction": "b.down", "op": "residual", "tiles": 2},
            {"instruction": "c", "op": "attention", "tiles": 1}]
    deal = ic.tiles_per_program(rows, 4)
    # a: tiles 0..4 on programs 0,1,2,3,0; b starts at (5 mod 4) = 1: programs 1, 2; c on program 3
    assert deal.tolist() == [[2, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 1]]
    with pytest.raises(ValueError):
        ic.tiles_per_program(rows, 0)
    a, b, c = 2.0, 1.0, 1.5
    pts = [{"rounds": r, "t_bytes": t, "added": ic.predict(a, b, c, r, t), "linear": True}
           for r, t in ((1, 1.0), (2, 1.0), (1, 4.0), (3, 2.0))]
    fa, fb, fc, r2 = ic.fit_costs(pts)
    assert (fa, fb, fc) == pytest.approx((a, b, c)) and r2 == pytest.approx(1.0)
    pts.append({"rounds": 1, "t_bytes": 0.0, "added": 7.0, "linear": False})
    assert ic.revised_step_us(pts, a, b, c) == pytest.approx(sum(p["added"] for p in pts))
    timed = [dict(r, last_end_us=e, roofline_us=0.5) for r, e in zip(rows, (3.0, 5.0, 9.0))]
    acc = ic.added_per_kind(timed, deal)
    assert acc["gate_up + SwiGLU"]["added"] == 3.0 and acc["down + residual"]["added"] == 2.0
    assert acc["attention"]["added"] == 4.0 and acc["gate_up + SwiGLU"]["rounds"] == 2
    assert [p["linear"] for p in ic.instruction_points(timed, deal)] == [True, True, False]


def test_answer_check_says_not_yet_and_correct():
    from labkit.lab.answer_check import check_number

    assert "not yet (set it" in check_number("1", None, 10.0)
    assert check_number("1", 10.5, 10.0, "KiB").startswith("1: correct: 10.0 KiB")
    assert "not yet: 13" in check_number("1", 13, 10.0)
    with pytest.raises(ValueError):
        check_number("1", 1.0, 0.0)


def test_chain_rows_and_bars_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.lab.chain_bars import PLAIN, chain_label, chain_rows, plot_chain
    from labkit.lab.rung_bars import rung_bars

    ch = [{"model": "m", "batch": 1, "gemv": "plain", "pdl": True, "placement": None, "ms": 0.3},
          {"model": "m", "batch": 1, "gemv": "linear", "pdl": False, "placement": None, "ms": 0.4}]
    tc = [{"model": "m", "batch": 1, "impl": "cuda-tma default+pdl", "ms": 0.5}]
    rows = chain_rows(ch, tc, "m")
    assert [r[0] for r in rows] == [PLAIN + " + PDL", "labkit linear, no PDL", "CUDA + TMA kernel, default+ PDL"]
    assert chain_label({"gemv": "tma-32x256s3", "pdl": False}) == "plain Triton GEMV, TMA descriptors 32x256, 3 stages"
    with pytest.raises(ValueError):
        chain_rows(ch, tc, "other")
    fig, (a, b) = plt.subplots(1, 2)
    plot_chain(a, rows, 0.2, "t")
    rung_bars(b, [("x", 100.0, "#000", ""), ("y (predicted)", 900.0, "#f00", "//")], 2000.0, "t")
    assert len(b.patches) == 2 and b.get_xscale() == "log"
    with pytest.raises(ValueError):
        rung_bars(b, [], 1.0, "empty")
    plt.close(fig)


def test_header_rules_and_search(tmp_path):
    from labkit.lab.cuda_headers import search_headers, tensor_map_rules

    cuda_h = ("/**\n * \\brief Encodes\n * - ::tensorMap address must be aligned to 64 bytes.\n"
              " * - ::globalAddress, which specifies the start, must be 16 byte aligned.\n */\n"
              "CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap);\n")
    decl, rules = tensor_map_rules(cuda_h)
    assert decl == "CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap);"
    assert rules == ["tensorMap address must be aligned to 64 bytes.", "globalAddress, which specifies the start, must be 16 byte aligned."]
    with pytest.raises(ValueError):
        tensor_map_rules("/** nothing */\nCUresult CUDAAPI cuTensorMapEncodeTiled(int);")
    (tmp_path / "cuda.h").write_text(cuda_h)
    got = search_headers(tmp_path, ["cuTensorMapEncodeTiled", "cudaTensorMapCreate"])
    assert got["files"] == 1 and got["hits"] == {"cuTensorMapEncodeTiled": ["cuda.h"], "cudaTensorMapCreate": []}


def test_stream_plot_and_stage_share():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [dict(_row(b, 2.0 + b / 4e12 * 1e6), impl="t", batch=1, gb_per_s=b / (2.0 + b / 4e12 * 1e6) / 1e3)
            for b in (1e6, 1e8)]
    fig, ax = plt.subplots()
    stream_fits.plot_stream_rates(ax, rows, {("t", 1): stream_fits.fit_rows(rows)}, 1, {"t": ("T", "#000")},
                                  latency_ns=300, copy_bytes_per_s=4e12)
    plt.close(fig)
    from types import SimpleNamespace

    sweep = [{"n": 1, "k": 1, "batch": 1, "config": s, "us": us, "error": None} for s, us in ((1, 2.0), (2, 1.0))]
    share = stream_fits.best_share_by_stages(sweep, lambda c: SimpleNamespace(stages=c))
    assert share == {(1, 1): pytest.approx(0.5), (1, 2): pytest.approx(1.0)}


def test_latency_plot_draws_committed_and_live_rows():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [{"pattern": p, "style": s, "nbytes": n, "ns_per_load": 100.0 + n / 1e7, "error": None}
            for p in ("random", "stride") for s in ("pointer", "descriptor") for n in (1 << 14, 1 << 28)]
    fig, ax = plt.subplots()
    little_law.plot_latency(ax, rows, rows[:2], l2_bytes=60 * 2**20, live_label="here")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "random chain, pointer loads (H200, committed)" in labels and "random chain, pointer loads (here)" in labels
    plt.close(fig)


def test_alignment_summary_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.lab.tma_alignment import alignment_summary, plot_alignment

    rows = [{"batch": 1, "row_stride": 4096, "base_offset_bytes": o, "gb_per_s": g, "us": 1e3 / g, "error": None}
            for o, g in ((0, 4000.0), (64, 3800.0), (128, 4000.0))]
    rows.append({"batch": 1, "row_stride": 4096, "base_offset_bytes": 8, "gb_per_s": None, "us": None, "error": "refused"})
    s = alignment_summary(rows)
    assert s["offsets"] == [0, 64, 128] and s["spread"][(1, 4096)] == pytest.approx(0.05) and len(s["refused"]) == 1
    assert s["us"][((1, 4096), 64)] == pytest.approx(1e3 / 3800)
    fig, ax = plt.subplots()
    plot_alignment(ax, rows, 4.2e12)
    assert len(ax.patches) == 3
    plt.close(fig)
    with pytest.raises(ValueError):
        alignment_summary(rows[-1:])
