"""A kernel streams at the rate its grid allows: the revised per-kernel model of chapter 02.

The first model, ``t = t0 + bytes / BW_stream``, takes BW_stream from projections whose grids fill
the GPU. A kernel with few programs (the Gated DeltaNet step at batch 1, attention over a handful of
kv heads) has only as many loads in flight as it has programs, so it streams slower. The rate
against the number of programs is measured by one kernel whose grid we can vary without changing
its bytes: the GDN step's ``block_v`` sweep (fusion-evidence.json's ``block_v`` rows). The revised
model is

    t = t0 + bytes / rate(programs)

with rate(P) = bytes / (t - t0) of the sweep's rows, interpolated in log P (and held at the ends).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GridRate:
    t0_us: float
    points: tuple[tuple[int, float], ...]  # (programs, bytes per second), programs ascending

    @classmethod
    def from_rows(cls, rows, t0_us: float) -> "GridRate":
        """From rows with ``programs``, ``bytes`` and ``us`` (one kernel, one batch, several grids)."""
        pts = {}
        for r in rows:
            stream_us = r["us"] - t0_us
            if stream_us <= 0:
                raise ValueError(f"a row of {r['us']:.2f} µs is not above t0 = {t0_us:.2f} µs: no streaming part to fit")
            pts[int(r["programs"])] = r["bytes"] / (stream_us * 1e-6)
        if len(pts) < 2:
            raise ValueError(f"need rows at two or more grid sizes, got {sorted(pts)}")
        return cls(t0_us, tuple(sorted(pts.items())))

    def bytes_per_s(self, programs: int) -> float:
        if programs < 1:
            raise ValueError(f"programs must be >= 1, got {programs}")
        ps = [p for p, _ in self.points]
        if programs <= ps[0]:
            return self.points[0][1]
        if programs >= ps[-1]:
            return self.points[-1][1]
        i = bisect.bisect_left(ps, programs)
        (p0, r0), (p1, r1) = self.points[i - 1], self.points[i]
        f = (math.log(programs) - math.log(p0)) / (math.log(p1) - math.log(p0))
        return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))

    def predict_us(self, nbytes: float, programs: int) -> float:
        return self.t0_us + nbytes / self.bytes_per_s(programs) * 1e6
