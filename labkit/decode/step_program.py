"""The persistent rung's step as a program: tiled instructions, what each reads and writes, and who waits for whom.

One decode step of the fused plan (:class:`labkit.decode.plan.StepPlan`) becomes a list of
instructions, each the work of one fused kernel of ``"fused"`` split in tiles:

    embed                      h = E[tokens]                                 B tiles
    per layer  in_proj (+ norm, + short conv)   h -> proj | mixed            tiles of outputs
               attention or GDN step            proj -> mixed (+ cache)      (kv head, chunk) / (v head, block)
               out_proj + residual              mixed -> h                   tiles of outputs
               gate_up (+ norm, SwiGLU)         h -> act
               down + residual                  act -> h
    head       final norm + LM head             h -> per-tile argmax (greedy) or logits

Each instruction names the buffers it reads and writes (``h``, ``act``, ``proj.<kind>``,
``mixed.<kind>``, a layer's ``conv_state.<i>`` / ``kv.<i>`` / ``state.<i>``, the ``best`` tiles or
``logits``) and waits for one earlier instruction: every tile of that one is done before any tile
of this one reads. :func:`check_waits` proves that this is enough: the last writer of everything an
instruction reads, and every earlier reader and writer of what it overwrites, is an instruction it
waits for, directly or through others. Today each waits for the one before it (a chain: every
projection needs its whole input vector, and the norms need the whole row); a finer schedule (the
down projection's K slices waiting only for the gate_up tiles that write them) must pass the same
check.

:func:`execute` runs a program instruction by instruction with the ops' plain-torch references
(the idea of HazyResearch's Python VM for their megakernel): on any device it gives the step's
logits, so the instruction list itself is checked against the model, apart from any kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .plan import AttentionLayerPlan, ConvLayerPlan, GdnLayerPlan, LinearPlan, StepPlan
from .. import tuning
from ..cache import HybridCache
from ..ops import attention_decode, gated_delta_decode
from ..ops.launch import cdiv, interpreting, next_pow2
from ..ops.persistent_decode import ARGS, Instruction, StepShapes


INTERPRETER_BLOCK_N = 256  # output tile in Triton's interpreter, where one program runs the whole step


@dataclass
class StepProgram:
    """The instructions of one step, with their names and the buffers each reads and writes."""

    instructions: list[Instruction] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    reads: list[frozenset[str]] = field(default_factory=list)
    writes: list[frozenset[str]] = field(default_factory=list)

    def add(self, name: str, ins: Instruction, reads: set[str], writes: set[str]) -> int:
        self.instructions.append(ins)
        self.names.append(name)
        self.reads.append(frozenset(reads))
        self.writes.append(frozenset(writes))
        return len(self.instructions) - 1


def block_n(n: int, programs: int, *, batch: int, min_block_n: int = 4, max_block_n: int = 32) -> int:
    """A projection's output tile: the largest power of two in [min, max] that still deals every one
    of ``programs`` programs a tile (at least 16 rows past batch 1, where the tile is a ``tl.dot``)."""
    lo = max(min_block_n, 16 if batch > 1 else 1)
    bn = max(lo, max_block_n)
    while bn > lo and cdiv(n, bn) < programs:
        bn //= 2
    return bn


def build_step_program(plan: StepPlan, cache: HybridCache, *, programs: int, greedy: bool,
                       settings: dict | None = None) -> tuple[StepProgram, StepShapes]:
    """The program of one step of ``plan`` over ``cache`` for a grid of ``programs``, and the sizes
    its kernel is compiled for. ``greedy``: end with the per-tile argmax (else the logits)."""
    s = dict(settings or tuning.HEURISTICS["persistent_decode"])
    cfg = cache.cfg
    B, H = cache.batch_size, cfg.hidden_size
    if not 1 <= B <= 16:
        raise ValueError(f"the persistent step runs batches of 1 to 16 sequences, got {B}")
    prog = StepProgram()

    def bn(n: int, op: str) -> int:
        if interpreting():  # one program runs every tile in order: fewer, wider tiles (no registers to spare)
            return max(16 if B > 1 else 1, min(INTERPRETER_BLOCK_N, next_pow2(n)))
        # the head is the one projection of a single row block with tens of tiles per program: wider
        # tiles share each tile's fixed work (the norm's reduction, the per-tile argmax) among more rows
        widest = s["head_block_n"] if op == "head" else s["max_block_n"]
        return block_n(n, programs, batch=B, min_block_n=s["min_block_n"], max_block_n=widest)

    sizes: dict[str, int] = {}

    def sized(op: str, n: int) -> int:
        """One tile width per linear op (the kernel's constexprs): fixed by the op's narrowest output."""
        if op not in sizes:
            sizes[op] = bn(n, op)
        return sizes[op]

    def linear(name: str, op: str, p: LinearPlan, x: torch.Tensor, out: torch.Tensor | None, wait: int,
               reads: set[str], writes: set[str], conv: tuple | None = None) -> int:
        # the plan's blocking and cuBLAS dispatch (p.config, p.impl) are the fused rung's: here every
        # projection is this kernel's own tiles
        n, k = p.outputs, p.weight.shape[1]
        width = sized("head" if op.startswith("head") else op, n)
        state, conv_w = conv or (None, None)
        ins = Instruction(op, cdiv(n, width), wait, (x, p.weight, p.norm_weight, out, state, conv_w), n=n, k=k)
        return prog.add(name, ins, reads, writes)

    last = prog.add("embed", Instruction("embed", B, -1, (plan.embed, plan.h)), {"tokens"}, {"h"})
    for layer in plan.layers:
        i, at = layer.index, f"layers.{layer.index}"
        if isinstance(layer, ConvLayerPlan):
            kind = "conv"
            last = linear(f"{at}.in_proj+conv", "conv_in", layer.in_proj, plan.h, plan.mixed["conv"], last,
                          {"h", f"conv_state.{i}"}, {"mixed.conv", f"conv_state.{i}"},
                          conv=(cache.conv_states[i], layer.conv_weight))
        elif isinstance(layer, AttentionLayerPlan):
            kind = "attention"
            last = linear(f"{at}.wqkv", "proj_in", layer.in_proj, plan.h, plan.proj[kind], last, {"h"}, {"proj.attention"})
            n_splits = cdiv(cache.max_len, plan.attn_args["chunk"])
            ins = Instruction("attention", B * cfg.num_kv_heads * n_splits, last,
                              (plan.proj[kind], layer.q_norm, layer.k_norm, layer.inv_freq, cache.keys[i],
                               cache.values[i], plan.mixed[kind]))
            last = prog.add(f"{at}.attention", ins, {"proj.attention", f"kv.{i}", "lengths"},
                            {"mixed.attention", f"kv.{i}"})
        elif isinstance(layer, GdnLayerPlan):
            kind = "gdn"
            last = linear(f"{at}.in_proj", "proj_in", layer.in_proj, plan.h, plan.proj[kind], last, {"h"}, {"proj.gdn"})
            dims = plan.gdn_dims
            n_vb = cdiv(dims.v_head_dim, plan.gdn_args["block_v"])
            ins = Instruction("gdn", B * dims.num_v_heads * n_vb, last,
                              (plan.proj[kind], cache.conv_states[i], layer.conv_weight, layer.A_log, layer.dt_bias,
                               layer.norm_weight, cache.recurrent_states[i], plan.mixed[kind]))
            last = prog.add(f"{at}.gdn", ins, {"proj.gdn", f"conv_state.{i}", f"state.{i}"},
                            {"mixed.gdn", f"conv_state.{i}", f"state.{i}"})
        else:  # pragma: no cover - build_step_plan refuses other kinds first
            raise TypeError(f"{at}: no instructions for {type(layer).__name__}")
        last = linear(f"{at}.out_proj", "residual", layer.out_proj, plan.mixed[kind], plan.h, last,
                      {f"mixed.{kind}", "h"}, {"h"})
        last = linear(f"{at}.mlp.gate_up", "gate_up", layer.mlp.gate_up, plan.h, plan.act, last, {"h"}, {"act"})
        last = linear(f"{at}.mlp.down", "residual", layer.mlp.down, plan.act, plan.h, last, {"act", "h"}, {"h"})
    if greedy:
        linear("head.argmax", "head_argmax", plan.greedy, plan.h, None, last, {"h"}, {"best"})
    else:
        linear("head.logits", "head_logits", plan.head, plan.h, plan.logits, last, {"h"}, {"logits"})

    ks = {ins.k for ins in prog.instructions if ins.k}
    if interpreting():
        block_k = max(s["block_k"], min(4096, next_pow2(max(ks))))
    else:
        # the setting counts 16-bit elements: a float32 model's K tile holds as many bytes (half the
        # elements), so the tl.dot tiles past batch 1 take the same shared memory and the same grid fits
        block_k = max(16, s["block_k"] * 2 // plan.h.element_size())
    shapes = StepShapes(
        batch=B, hidden=H, dtype=plan.h.dtype, eps=plan.eps, unit_offset=plan.unit_offset,
        conv_kernel=cfg.conv_kernel if "conv" in cfg.layer_types else 1,
        head_tiles=prog.instructions[-1].tiles, block_n=sizes, block_k=block_k,
        even_k=all(k % block_k == 0 for k in ks),
    )
    if plan.attn_dims is not None:
        d = plan.attn_dims
        chunk = plan.attn_args["chunk"]
        shapes.attention = dict(
            max_len=cache.max_len, scale=d.head_dim ** -0.5, proj_dim=d.proj_dim, n_splits=cdiv(cache.max_len, chunk),
            sizes=attention_decode.tile_sizes(d, chunk, attention_decode.attention_chunk(cache.max_len, d.head_dim)[1]),
        )
    if plan.gdn_dims is not None:
        d = plan.gdn_dims
        block_v = plan.gdn_args["block_v"]
        shapes.gdn = dict(
            q_scale=d.k_head_dim ** -0.5, proj_dim=d.proj_dim, conv_dim=d.conv_dim, n_vb=cdiv(d.v_head_dim, block_v),
            sizes=gated_delta_decode.tile_sizes(d, cfg.gdn_conv_kernel, block_v),
        )
    return prog, shapes


def ancestors(prog: StepProgram) -> list[set[int]]:
    """For each instruction, every instruction it waits for, directly or through others."""
    out: list[set[int]] = []
    for ins in prog.instructions:
        out.append(set() if ins.wait < 0 else {ins.wait, *out[ins.wait]})
    return out


def check_waits(prog: StepProgram) -> list[str]:
    """What an instruction could read before it is written, or overwrite before it is read: empty
    when every wait the hazards need is there (directly or through others)."""
    before = ancestors(prog)
    problems = []
    for i, (reads, writes) in enumerate(zip(prog.reads, prog.writes)):
        for j in range(i):
            if j in before[i]:
                continue
            for buf in sorted(reads & prog.writes[j]):
                problems.append(f"{prog.names[i]} reads {buf}, which {prog.names[j]} writes, without waiting for it")
            for buf in sorted(writes & (prog.reads[j] | prog.writes[j])):
                problems.append(f"{prog.names[i]} overwrites {buf}, which {prog.names[j]} uses, without waiting for it")
    return problems


@torch.no_grad()
def execute(prog: StepProgram, plan: StepPlan, cache: HybridCache, tokens: torch.Tensor) -> torch.Tensor:
    """Run ``prog`` instruction by instruction with the ops' references, in place of the kernel:
    the caches' states and ``plan``'s buffers are written as the kernel writes them (``lengths`` are
    not advanced). Returns the next tokens (greedy program) or the logits."""
    from ..ops.attention_decode import attention_decode_ref
    from ..ops.gated_delta_decode import gdn_decode_ref
    from ..ops.greedy_head import greedy_head_ref
    from ..ops.linear import linear_ref
    from ..ops.short_conv import short_conv_decode_ref

    norm = dict(norm_eps=plan.eps, norm_unit_offset=plan.unit_offset)
    result = None
    for i, ins in enumerate(prog.instructions):
        a = dict(zip(ARGS[ins.op], ins.args))
        if ins.op == "embed":
            a["out"].copy_(a["w"][tokens])
        elif ins.op == "conv_in":
            y = linear_ref(a["x"], a["w"], norm_weight=a["norm"], **norm)
            out, new_state = short_conv_decode_ref(y, a["conv_state"], a["conv_w"])
            a["out"].copy_(out)
            a["conv_state"].copy_(new_state)
        elif ins.op == "proj_in":
            a["out"].copy_(linear_ref(a["x"], a["w"], norm_weight=a["norm"], **norm))
        elif ins.op == "residual":
            a["out"].copy_(linear_ref(a["x"], a["w"], residual=a["out"]))
        elif ins.op == "gate_up":
            a["out"].copy_(linear_ref(a["x"], a["w"], norm_weight=a["norm"], swiglu=True, **norm))
        elif ins.op == "head_argmax":
            result = greedy_head_ref(a["x"], a["w"], norm_weight=a["norm"], **norm)
        elif ins.op == "head_logits":
            result = a["out"]
            result.copy_(linear_ref(a["x"], a["w"], norm_weight=a["norm"], **norm))
        elif ins.op == "attention":
            out, keys, values = attention_decode_ref(a["proj"], a["q_norm"], a["k_norm"], a["inv_freq"], a["keys"],
                                                     a["values"], cache.lengths, plan.attn_dims, plan.eps,
                                                     plan.unit_offset)
            a["out"].copy_(out)
            a["keys"].copy_(keys)
            a["values"].copy_(values)
        elif ins.op == "gdn":
            out, conv_state, state = gdn_decode_ref(a["proj"], a["conv_state"], a["conv_w"], a["A_log"],
                                                    a["dt_bias"], a["norm"], a["state"], plan.gdn_dims, plan.eps)
            a["out"].copy_(out)
            a["conv_state"].copy_(conv_state)
            a["state"].copy_(state)
        else:  # pragma: no cover - Instruction refuses unknown ops
            raise ValueError(f"instruction {i}: no reference for {ins.op!r}")
    return result
