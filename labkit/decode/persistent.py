"""The ``"persistent"`` rung: the whole decode step as one kernel of resident programs.

The fused rungs launch one kernel per fused op, 74 to 97 per step, and each kernel boundary costs
about 2 µs beyond the bytes it moves (notebook 04). This rung launches one: the step's
instructions (:mod:`labkit.decode.step_program`, built once per plan and cache from the same
:class:`~labkit.decode.plan.StepPlan` as ``"fused"``) are walked by a grid of resident programs
that wait on counters in global memory instead of kernel boundaries
(:mod:`labkit.ops.persistent_decode`). On a CUDA GPU the launch is captured in a CUDA graph with
the length increment folded in, so a step is one graph node; in Triton's interpreter it runs
eagerly, with one program. The prefill is ``"fused"``'s.

Settings (``tuning.settings("persistent_decode")``): programs per SM, warps, the projections' K
tile and the bounds of their output tiles, and ``prefetch_tiles``. The grid is checked against
what fits on the GPU at once (a program that is not resident would make every other wait for ever).

On a GPU older than sm_90 (A100, L4, RTX 4090), which has no bulk L2 prefetch
(:mod:`labkit.ops.features`), the rung runs the same kernel with ``prefetch_tiles`` 0: each program
streams its weights without asking L2 for them ahead. That is this rung's non-Hopper path, taken
when the prefetch comes from the tuning file or its heuristic; a caller who asks for a prefetch by
name (``settings={"prefetch_tiles": 2}``) on such a GPU gets a MissingFeature error instead, so that
what is measured is what was asked for.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from . import graphs
from .fused import FusedDecoder
from .plan import StepPlan
from .step_program import StepProgram, build_step_program
from .. import tuning
from ..cache import HybridCache
from ..model import HybridLM
from ..ops.features import features


class PersistentDecoder(FusedDecoder):
    """One kernel per decode step for a :class:`~labkit.model.HybridLM` over a :class:`~labkit.cache.HybridCache`."""

    def __init__(self, model: HybridLM, cache: HybridCache, *, settings: Mapping[str, Any] | None = None) -> None:
        """``settings``: values over the tuning file's ``persistent_decode`` settings (a tuner's candidate)."""
        from ..ops import persistent_decode

        self._persistent = persistent_decode
        self.settings = dict(tuning.settings("persistent_decode", model.device))
        unknown = set(settings or {}) - set(self.settings)
        if unknown:
            raise ValueError(f"unknown persistent_decode settings {sorted(unknown)}; known: {sorted(self.settings)}")
        self.settings.update(settings or {})
        have = features(model.device)
        if self.settings["prefetch_tiles"] and not have.bulk_prefetch:
            asked = (settings or {}).get("prefetch_tiles")
            if asked:  # by name: refused, not quietly dropped
                have.require("bulk_prefetch", f"the persistent rung's prefetch_tiles={asked}", "Use prefetch_tiles=0.")
            self.settings["prefetch_tiles"] = 0  # the tuning file's or heuristic's: the non-Hopper path
        self._programs: dict[bool, tuple[StepPlan, StepProgram, Any, Any, torch.Tensor]] = {}
        super().__init__(model, cache, graph=graphs.GRAPHS.available(model.device), pdl=False)

    def _grid(self) -> int:
        if self.model.device.type != "cuda":
            return 1
        return self._persistent.resident_programs(self.settings["programs_per_sm"])

    def _program(self, plan: StepPlan, greedy: bool) -> tuple[StepPlan, StepProgram, Any, Any, torch.Tensor]:
        """The encoded program of ``plan`` (built on first use after each refresh)."""
        built = self._programs.get(greedy)
        if built is not None and built[0] is plan:
            return built
        ops, cache, device = self._persistent, self.cache, self.model.device
        programs = self._grid()
        prog, shapes = build_step_program(plan, cache, programs=programs, greedy=greedy, settings=self.settings)
        table = ops.encode(prog.instructions, programs, device, shapes.dtype)
        head = prog.instructions[-1].tiles
        buffers = ops.StepBuffers(
            tokens=plan.tokens, lengths=cache.lengths, next_tokens=plan.next_tokens,
            best_val=torch.empty(cache.batch_size, head, dtype=torch.float32, device=device),
            best_idx=torch.empty(cache.batch_size, head, dtype=torch.int32, device=device),
            counters=torch.zeros(len(prog.instructions) * ops.COUNTER_STRIDE, dtype=torch.int32, device=device),
            attn_ws=plan.attn_ws, gdn_ws=plan.gdn_ws,
        )
        if device.type == "cuda":
            # the one kernel both launches of a graph rung run (the eager warm-up, the captured step
            # that advances lengths: a runtime argument) compiled and loaded now, not inside a capture
            kernel = ops.precompile(table, buffers, shapes, greedy=greedy, **self._launch_settings())
            fit = ops.resident_per_sm(kernel, device)
            if fit < self.settings["programs_per_sm"]:
                raise RuntimeError(
                    f"the persistent step needs {self.settings['programs_per_sm']} resident programs per SM and its "
                    f"compiled kernel fits {fit}: lower programs_per_sm, num_warps or max_registers in the tuning file's "
                    "persistent_decode settings")
        self._programs[greedy] = built = (plan, prog, shapes, buffers, table)
        return built

    def _launch_step(self, plan: StepPlan, greedy: bool, advance: bool) -> None:
        _, _, shapes, buffers, table = self._program(plan, greedy)
        self._persistent.launch_persistent_step(table, buffers, shapes, programs=self._grid(), greedy=greedy,
                                                advance=advance, **self._launch_settings())

    @torch.no_grad()
    def timeline(self, tokens: torch.Tensor, *, greedy: bool = True) -> tuple[StepProgram, torch.Tensor]:
        """One eager step (CUDA only; the cache advances by one, as by :meth:`step_greedy`) with each
        program's (start, end) of every instruction stamped on the device: ``(program, stamps)``,
        stamps int64 [programs, instructions, 2] in nanoseconds from the earliest start, -1 where a
        program had no tile of an instruction. (A first call compiles the stamping variant before
        it launches: the stamps see only the device's work.)"""
        if self.model.device.type != "cuda":
            raise RuntimeError("the timeline reads the GPU's global timer: it needs a model on a CUDA GPU")
        plan = self.plan
        if plan is None or self._weights is None:
            raise RuntimeError("this decoder has no valid plan; prefill again")
        _, prog, shapes, buffers, table = self._program(plan, greedy)
        stamps = torch.full((self._grid(), table.shape[0], 2), -1, dtype=torch.int64, device=self.model.device)
        self.cache.check_room(self.cache.batch_size, 1)
        plan.tokens.copy_(tokens)
        self._persistent.launch_persistent_step(table, buffers, shapes, programs=self._grid(), greedy=greedy,
                                                advance=False, stamps=stamps, **self._launch_settings())
        self.cache.advance(1)
        t0 = stamps[stamps >= 0].min()
        return prog, torch.where(stamps >= 0, stamps - t0, stamps)

    @property
    def hopper_features(self) -> frozenset[str]:
        return frozenset({"bulk_prefetch"} if self.settings["prefetch_tiles"] else ())

    def _launch_settings(self) -> dict[str, int]:
        return {k: self.settings[k] for k in ("num_warps", "max_registers", "num_stages", "prefetch_tiles")}

    def _forward(self, plan: StepPlan, greedy: bool) -> None:
        self._launch_step(plan, greedy, advance=False)

    @torch.no_grad()
    def _capture(self, greedy: bool) -> Any:
        """The step in a graph, with the length increment inside the kernel (one node per step)."""
        cache, plan = self.cache, self.plan
        return graphs.capture(lambda: self._launch_step(plan, greedy, advance=False),
                              [*cache.conv_states.values(), *cache.recurrent_states.values()], self.model.device,
                              lambda: self._launch_step(plan, greedy, advance=True))

    def step_program(self, greedy: bool = True) -> StepProgram:
        """The instruction list the kernel walks (for the notebook and the tests)."""
        if self.plan is None:
            raise RuntimeError("this decoder has no valid plan; prefill again")
        return self._program(self.plan, greedy)[1]


def persistent_decoder(model: HybridLM, cache: HybridCache) -> PersistentDecoder:
    """A PersistentDecoder for (model, cache), reused while the cache lives (see :func:`labkit.decode.fused.fused_decoder`)."""
    key = ("labkit.decode.persistent", id(model))
    decoder = cache.attachments.get(key)
    if isinstance(decoder, PersistentDecoder) and decoder.model is model:
        decoder.refresh()
        return decoder
    decoder = PersistentDecoder(model, cache)
    cache.attachments[key] = decoder
    return decoder
