"""The training loop: initial weights, the loss, the learning-rate schedule, the loop itself and
the held-out loss.

Random crops of ``seq + 1`` tokens from the train stream (a seeded generator on the training
device), next-token cross-entropy of the model's own forward, AdamW (betas 0.9/0.95, weight decay
on matrices only), linear warmup then cosine decay to ``min_lr_ratio * lr``, gradient clipping,
bf16 autocast on CUDA and float32 on the CPU. With a time budget the schedule runs on whichever is
further along, steps or wall time, so the learning rate has decayed when the budget ends the run
(such a run is not step-for-step reproducible; one bounded by steps alone is on a CPU, and on a GPU
up to the order of its atomic reductions). The default of 1,600 steps (105 M tokens, about 3.6
passes over CPython 3.11's training split, 28.9 MB) is where the held-out loss stopped falling on
the H200: LFM2 reached 0.998 and 0.999 bits/byte in two runs of 1,600 steps, 1.018 in one of 3,000.
(On a standard library without its test suite, 8.8 MB, the best was about 1.57 bits/byte, after
500 steps; more overfit, and greedy text fell into runs of spaces.)
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..model import HybridLM
from .options import TrainOptions

LN2 = math.log(2.0)


@torch.no_grad()
def init_for_training(model: HybridLM, seed: int) -> HybridLM:
    """Initial weights for training from scratch (``labkit.model.init_random`` is for tests).

    Matrices ~ N(0, 0.02), the ones that write into the residual stream scaled by 1/sqrt(2 L);
    norms at their neutral value; depthwise conv taps ~ U(+-1/sqrt(K)); Gated DeltaNet decay
    rates A = exp(A_log) ~ U(1, 16) and dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1],
    so the per-step decay exp(g) starts spread between about 0.2 and 0.999.
    """
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    out_std = 0.02 / math.sqrt(2 * cfg.num_layers)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        r = torch.empty(p.shape, dtype=torch.float32)
        if "norm" in name and p.dim() == 1:  # RMSNorm weights, incl. q/k norms and GDN's gated norm
            unit = cfg.norm_unit_offset and leaf == "weight"  # GDN's norm_weight multiplies directly
            r.fill_(0.0 if unit else 1.0)
        elif leaf == "conv_weight":
            bound = 1.0 / math.sqrt(p.shape[1])
            r.uniform_(-bound, bound, generator=gen)
        elif leaf == "A_log":
            r.uniform_(1.0, 16.0, generator=gen).log_()
        elif leaf == "dt_bias":
            dt = torch.empty(p.shape).uniform_(math.log(1e-3), math.log(0.1), generator=gen).exp()
            r.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif leaf in ("wo", "out_proj", "down"):
            r.normal_(0.0, out_std, generator=gen)
        else:
            r.normal_(0.0, 0.02, generator=gen)
        p.copy_(r)
    return model


def loss_sum(model: HybridLM, windows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy (nats) over ``windows [B, L+1]``, and the target count.

    The logits are the model's own forward, input checks included; for T > 1 those read the id
    range back to the host, a sync per call on a GPU (and a graph break under ``--compile``)."""
    logits = model(windows[:, :-1])
    targets = windows[:, 1:]
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
    return loss, targets.numel()


@torch.no_grad()
def heldout_loss(model: HybridLM, windows: torch.Tensor, batch: int, autocast: bool = False) -> float:
    """Mean next-token loss in nats over ``windows`` [N, L+1]."""
    device = model.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            s, n = loss_sum(model, w)
        total += s.double()
        count += n
    return float(total) / count


def lr_at(step: int, progress: float, lr: float, warmup: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from ``lr`` to ``min_lr_ratio * lr``
    as ``progress`` (the fraction of the run done, by steps or by time) goes from 0 to 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(max(progress, 0.0), 1.0)
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


class Progress:
    """A tqdm bar, or none; ``say`` prints either way (flushed, so logs survive a kill)."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, mininterval=1.0)
        self.say = self.bar.write if self.bar is not None else functools.partial(print, flush=True)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def show(self, loss: float, lr: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class Fit:
    """What a training loop did: ``history`` holds the logged train losses and held-out evaluations."""

    steps: int
    stopped_by: str  # "steps" or "time_budget"
    warmup_steps: int
    train_loss: float | None  # mean over the last logged steps, in the training precision
    seconds: float
    autocast: bool  # bfloat16 autocast (on CUDA)
    history: dict[str, list[dict[str, Any]]]


def fit(model: HybridLM, stream: torch.Tensor, periodic: torch.Tensor, opts: TrainOptions, progress: Progress) -> Fit:
    """Train ``model`` in place on random crops of ``stream`` (on the model's device), evaluating
    on the held-out ``periodic`` windows every ``opts.eval_every`` steps and at the end."""
    dev = model.device
    use_bf16 = dev.type == "cuda"
    steps, batch, seq = opts.steps, opts.batch, opts.seq
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opts.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opts.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if dev.type == "cuda" else {}),
    )
    step_loss = torch.compile(loss_sum, dynamic=False) if opts.compile else loss_sum
    gen = torch.Generator(device=dev).manual_seed(opts.seed + 1)
    offsets = torch.arange(seq + 1, device=dev)
    warm = min(opts.warmup, max(1, steps // 10))
    history: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}

    def batch_at() -> torch.Tensor:
        starts = torch.randint(0, stream.numel() - seq, (batch, 1), device=dev, generator=gen)
        return stream[starts + offsets].long()

    def periodic_eval(step: int, train_loss: float | None, elapsed: float) -> None:
        model.eval()
        loss = heldout_loss(model, periodic, batch, autocast=use_bf16)
        model.train()
        history["eval"].append({"step": step, "tokens": step * batch * seq, "heldout_loss": loss,
                                "heldout_bits_per_byte": loss / LN2, "train_loss": train_loss,
                                "elapsed_s": round(elapsed, 2)})
        progress.say(f"step {step:6d}  train {train_loss if train_loss is not None else float('nan'):.4f}  "
                     f"held-out {loss:.4f} nats/byte = {loss / LN2:.3f} bits/byte  ({elapsed:.0f} s)")

    def log_train(step: int, loss: float, lr: float, now: float, **extra: float) -> None:
        history["train"].append({"step": step, "tokens": step * batch * seq, "loss": loss, "lr": lr, **extra,
                                 "elapsed_s": round(now - t0, 2),
                                 "steps_per_s": round((step - last_log_step) / max(now - last_log_t, 1e-9), 3)})

    # On a CPU the first steps of a fresh model (LFM2's gated conv multiplies three small numbers)
    # produce float32 denormals, which x86 cores handle many times slower: flush them to zero
    # while training.
    flushing = dev.type == "cpu" and torch.set_flush_denormal(True)
    t0 = time.perf_counter()
    acc = torch.zeros((), device=dev)
    acc_n, last_log_t, last_log_step = 0, t0, 0
    last_train_loss: float | None = None
    step, stopped_by = 0, "steps"
    try:
        while step < steps:
            elapsed = time.perf_counter() - t0
            if opts.time_budget_s is not None and step > 0 and elapsed >= opts.time_budget_s:  # at least one step
                stopped_by = "time_budget"
                break
            progress_frac = max(step / steps, elapsed / opts.time_budget_s if opts.time_budget_s else 0.0)
            cur_lr = lr_at(step, progress_frac, opts.lr, warm, opts.min_lr_ratio)
            for group in optim.param_groups:
                group["lr"] = cur_lr
            w = batch_at()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                s, n = step_loss(model, w)
            loss = s / n
            optim.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            optim.step()
            acc += loss.detach()
            acc_n += 1
            step += 1
            progress.step()
            if step % opts.log_every == 0 or step == steps:
                mean = float(acc) / acc_n  # the loop's own host sync, once per log interval
                now = time.perf_counter()
                log_train(step, mean, cur_lr, now, grad_norm=float(grad_norm))
                progress.show(mean, cur_lr)
                last_train_loss, acc_n, last_log_t, last_log_step = mean, 0, now, step
                acc.zero_()
            if opts.eval_every and step % opts.eval_every == 0 and step < steps:
                periodic_eval(step, last_train_loss, time.perf_counter() - t0)
    finally:
        if flushing:
            torch.set_flush_denormal(False)
    if acc_n:
        last_train_loss = float(acc) / acc_n
        log_train(step, last_train_loss, cur_lr, time.perf_counter())
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    progress.close()
    if not history["eval"] or history["eval"][-1]["step"] != step:
        periodic_eval(step, last_train_loss, seconds)
    return Fit(step, stopped_by, warm, last_train_loss, seconds, use_bf16, history)
