"""What every optimizer step of heal and train shares: AdamW over parameter groups (the Post-LN
blocks at their own learning rate), the warmup-cosine schedule, and the guard that decides,
after the backward and before the update, whether the step may touch the weights.

The guard exists because a non-finite gradient with a finite loss is clipped into NaN gradients
and AdamW then writes NaN weights even at lr 0: the loss alone does not tell. So the loss and the
global gradient norm are both checked before any update, and a non-finite one stops the run with
one line naming the step, the first block whose gradient is non-finite and the samples of the
step (a batch is a pure function of its sample indices, :class:`~mixln_convert.data.PackedWindows`,
so it can be replayed on CPU). A loss spike (``spike_factor`` times the mean of the last
``spike_window`` losses) skips the update instead, up to ``max_skips`` in a row.
"""

import math
from collections import deque
from dataclasses import dataclass, field, replace

import torch
from torch.optim.lr_scheduler import LambdaLR

from ..errors import MixLNError
from ..io.records import NUMBER_LIST, MetricRecord, Record
from ..schema import Count, read_record, setting


def is_post_ln(layer) -> bool:
    return bool(getattr(layer, "is_post_ln", False))


def parameter_groups(layers, other, *, lr: float, weight_decay: float, post_ln_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups of the trainable parameters of ``layers`` (decoder blocks) and of ``other``
    (parameters outside the blocks): the Post-LN blocks' at ``lr * post_ln_lr_scale``, everything
    else at ``lr``; no weight decay on 1-D tensors (norm gains, biases: decay would pull a
    calibrated Post-LN gain toward 0). Empty groups are left out."""
    sets = {}  # (post_ln, decayed) -> parameters
    blocks = [(is_post_ln(layer), p) for layer in layers for p in layer.parameters()]
    for post_ln, p in blocks + [(False, p) for p in other]:
        if p.requires_grad:
            sets.setdefault((post_ln, p.ndim >= 2), []).append(p)
    return [{"params": params, "lr": lr * (post_ln_lr_scale if post_ln else 1.0),
             "weight_decay": weight_decay if decayed else 0.0, "post_ln": post_ln}
            for (post_ln, decayed), params in sorted(sets.items())]


def adamw(groups: list[dict], *, betas: tuple[float, float], eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW, fused where torch has the kernel for every parameter (one kernel per step and no
    temporaries the size of the trained weights); DTensor shards (FSDP2) take the foreach path."""
    from torch.distributed.tensor import DTensor

    fused = all(p.device.type in ("cpu", "cuda") and not isinstance(p, DTensor) and p.is_floating_point()
                for group in groups for p in group["params"])
    return torch.optim.AdamW(groups, betas=tuple(betas), eps=eps, fused=fused or None)


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> LambdaLR:
    """Each group's lr times: (s + 1) / warmup_steps over the first ``warmup_steps`` steps (the
    first step already learns: a step at lr 0 is wasted and hides where a first-step failure comes
    from), then a cosine from 1 toward ``min_lr_ratio``, which the step after the last would reach
    (a run of one step, or without warmup, starts at the peak)."""
    def factor(s: int) -> float:  # s: optimizer steps taken before this one
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


class NonFiniteStep(MixLNError):
    """A step whose loss or gradient norm is not a number; raised before the update."""


@dataclass(frozen=True, kw_only=True)
class GuardState(Record):
    """:class:`StepGuard`'s state as a checkpoint keeps it: what a resumed run decides from."""
    recent: list[float] = setting(kind=NUMBER_LIST)
    skips_in_a_row: int = setting(kind=Count(0))


@dataclass
class StepGuard:
    """Checks a step before its update (see the module's docstring); its state (the recent losses
    and the skips in a row) is checkpointed with the run, so a resumed run decides alike."""

    spike_factor: float = 0.0  # 0: no spike check
    spike_window: int = 20
    max_skips: int = 5
    recent: deque = field(default_factory=deque)
    skips_in_a_row: int = 0

    def check(self, step: int, loss: float, grad_norm: float, block_norms, samples: range) -> bool:
        """True when the step may update the weights, False when it is skipped as a spike; raises
        :class:`NonFiniteStep` when the loss or gradient norm is not finite. ``block_norms()``
        gives each block's gradient norm and the blocks (only called on a failure)."""
        for name, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not math.isfinite(value):
                norms, layers = block_norms()
                raise NonFiniteStep(f"{name} is {value} at step {step}{nonfinite_blocks(norms, layers)}; "
                                    f"its samples are {samples.start}..{samples.stop - 1} of the seeded order")
        mean = sum(self.recent) / len(self.recent) if len(self.recent) == self.spike_window else None
        if self.spike_factor and mean is not None and loss > self.spike_factor * mean:
            self.skips_in_a_row += 1
            if self.skips_in_a_row > self.max_skips:
                raise MixLNError(f"loss spiked above {self.spike_factor:g} x the mean of the last {self.spike_window} "
                                 f"steps ({mean:.4g}) {self.skips_in_a_row} steps in a row, up to step {step} "
                                 f"(loss {loss:.4g}): the run is diverging; lower the learning rate")
            return False
        self.skips_in_a_row = 0
        self.recent.append(loss)
        if len(self.recent) > self.spike_window:
            self.recent.popleft()
        return True

    def state_dict(self) -> dict:
        return GuardState(recent=list(self.recent), skips_in_a_row=self.skips_in_a_row).to_dict()

    def load_state_dict(self, state: dict, where: str = "the step guard's state") -> None:
        """``state`` as :meth:`state_dict` gave it (read from ``where``), checked."""
        state = read_record(GuardState, state, where, "a step guard's state")
        self.recent, self.skips_in_a_row = deque(state.recent), state.skips_in_a_row


def clip_gradients(parameters, max_norm: float) -> float:
    """The global L2 norm of the gradients of ``parameters``, which are then clipped to
    ``max_norm`` (0: not clipped). A non-finite norm leaves every gradient as it is: clipping
    would scale them all by NaN, and the message would blame the first block instead of the
    one that overflowed. Sharded gradients (DTensors) give the norm over all shards."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    value = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()
    if max_norm and math.isfinite(value):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return value


def take_step(optimizer, scheduler, guard: StepGuard, record: MetricRecord, *, loss: float, clip, block_norms,
              samples: range) -> MetricRecord:
    """The update after a backward: ``clip()`` (the global gradient norm, gradients clipped), the guard,
    then AdamW and the schedule; the gradients are cleared either way. Returns ``record`` (the step's) with
    its ``loss``, ``grad_norm``, ``lr`` (the first group's) and ``skipped`` when the guard held the update back."""
    lr, grad_norm = scheduler.get_last_lr()[0], clip()
    taken = guard.check(record.step, loss, grad_norm, block_norms, samples)
    if taken:
        optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return replace(record, loss=loss, lr=lr, grad_norm=grad_norm, skipped=None if taken else True)


def nonfinite_blocks(norms: list[float], layers) -> str:
    """Where a non-finite step went wrong first, for its error message: '' if every block's
    gradient norm is finite (the loss alone overflowed)."""
    bad = [i for i, norm in enumerate(norms) if not math.isfinite(norm)]
    if not bad:
        return ""
    kind = "Post-LN" if is_post_ln(layers[bad[0]]) else "Pre-LN"
    return f" (non-finite gradients in {len(bad)} of {len(norms)} blocks, the first block {bad[0]}, {kind})"


def block_grad_norms(layers, reduce=None) -> list[float]:
    """L2 norm of each decoder block's parameter gradients. A sharded gradient (a DTensor under
    FSDP2) contributes its local shard, and ``reduce`` (a sum over processes) completes the squares."""
    squares = []
    for layer in layers:
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for p in layer.parameters() if p.grad is not None]
        squares.append(sum((grad.float().square().sum() for grad in grads), torch.zeros(())))
    device = next((s.device for s in squares if s.device.type != "cpu"), torch.device("cpu"))
    squares = torch.stack([s.to(device) for s in squares])
    if reduce is not None:
        squares = reduce(squares)
    return squares.sqrt().tolist()
