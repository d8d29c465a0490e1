"""labkit.bench.tma without a GPU: the shapes it times, and the tuning file section it writes from a sweep."""

import json
from dataclasses import asdict

import pytest

from labkit import cuda
from labkit.bench import tma


def test_projection_shapes_are_every_distinct_weight_of_both_presets():
    shapes = {(s.n, s.k) for s in tma.projection_shapes()}
    assert (1024, 4608) in shapes and (248320, 1024) in shapes and (65536, 1024) in shapes
    assert len(shapes) == len(tma.projection_shapes()) == 12


def _row(n, k, batch, config, us, error=None):
    return tma.StreamRow(n, k, "somewhere", batch, "cuda-tma", repr(config), us, 2 * n * k,
                         2 * n * k / us / 1e3, 1e-3, error)


def test_tuning_section_keeps_the_fastest_correct_config(tmp_path):
    from labkit import tuning

    slow, fast, wrong = cuda.TmaConfig(16, 128, 2), cuda.TmaConfig(32, 256, 4, fill=2), cuda.TmaConfig(64, 64, 8)
    rows = [_row(1024, 4608, 1, slow, 5.0), _row(1024, 4608, 1, fast, 4.0), _row(1024, 4608, 1, wrong, 1.0, "wrong"),
            _row(1024, 4608, 16, slow, 6.0)]
    sweep = {"gpu": "NVIDIA H200", "device": {}, "versions": {}, "date": "d", "command": "c",
             "results": [asdict(r) for r in rows]}
    src = tmp_path / "sweep.json"
    src.write_text(json.dumps(sweep))
    path = tma.write_tuning(src, tmp_path)
    assert path.name == "nvidia-h200.json"  # the GPU's one tuning file, its tma section
    assert tuning.tma.table_of(tuning.read_tuning_file(path), "") == {(1, 1024, 4608): fast, (16, 1024, 4608): slow}
    assert cuda.config_from_repr(repr(fast)) == fast


def test_malformed_tuning_section_is_a_clear_error(tmp_path):
    from labkit import tuning

    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": tuning.FORMAT, "gpu": "x", "tma": {"entries": [{"n": 1}]}}))
    with pytest.raises(tuning.TuningFileError, match=r"x\.json: tma\.entries\[0\]"):
        tuning.read_tuning_file(bad)


def test_summary_table_takes_the_fastest_correct_row_per_implementation():
    rows = [_row(1024, 4608, 1, cuda.TmaConfig(16, 128, 2), 5.0), _row(1024, 4608, 1, cuda.TmaConfig(), 4.0),
            _row(1024, 4608, 1, cuda.TmaConfig(64, 64, 2), 1.0, "wrong result")]
    table = tma.summary_table(rows)
    assert table.splitlines()[2] == f"| 1024 | 4608 | 1 | {2 * 1024 * 4608 / 4.0 / 1e3:,.0f} |"
