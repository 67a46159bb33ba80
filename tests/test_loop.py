"""The optimizer step heal and train share (training/loop.py): schedule, groups, guards."""

import math

import pytest
import torch

from mixln_convert.errors import MixLNError
from mixln_convert.io.records import MetricRecord
from mixln_convert.surgery.loading import load_model
from mixln_convert.training.loop import (NonFiniteStep, StepGuard, adamw, block_grad_norms, clip_gradients,
                                         parameter_groups, take_step, warmup_cosine)
from mixln_convert.training.trainer import loader_options


def _lrs(warmup: int, total: int, min_ratio: float) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, warmup, total, min_ratio)
    lrs = []
    for _ in range(total):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


def test_the_first_step_learns_and_the_schedule_ends_at_its_floor():
    lrs = _lrs(warmup=10, total=40, min_ratio=0.1)
    assert lrs[0] == pytest.approx(0.1)  # 1/10 of the peak, not 0
    assert lrs[9] == pytest.approx(1.0) and max(lrs) == pytest.approx(1.0)
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))  # cosine down after the warmup
    assert lrs[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 29 / 30)))  # near the floor of 0.1
    assert _lrs(warmup=0, total=5, min_ratio=0.0)[0] == 1.0 and _lrs(warmup=0, total=1, min_ratio=0.0) == [1.0]


def test_post_ln_blocks_get_their_own_learning_rate_and_norms_no_decay(converted):
    model = load_model(converted)
    layers = model.model.layers
    outside = [p for name, p in model.named_parameters() if not name.startswith("model.layers.")]
    groups = parameter_groups(layers, outside, lr=1e-3, weight_decay=0.1, post_ln_lr_scale=0.25)
    post = {id(p) for layer in layers if layer.is_post_ln for p in layer.parameters()}
    assert post and len(post) < sum(1 for layer in layers for _ in layer.parameters())
    for group in groups:
        assert all((id(p) in post) == group["post_ln"] for p in group["params"])
        assert group["lr"] == pytest.approx(0.25e-3 if group["post_ln"] else 1e-3)
        assert group["weight_decay"] == (0.1 if group["params"][0].ndim >= 2 else 0.0)
        assert all((p.ndim >= 2) == (group["params"][0].ndim >= 2) for p in group["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    peaks = [group["lr"] for group in groups]
    optimizer = adamw(groups, betas=(0.9, 0.95))
    assert optimizer.defaults["fused"]  # CPU tensors: torch's fused kernel
    scheduler = warmup_cosine(optimizer, 4, 10)
    assert scheduler.get_last_lr() == pytest.approx([peak / 4 for peak in peaks])  # first of 4 warmup steps


def _one_backward(model, corrupt: float | None):
    batch = torch.arange(16).view(2, 8) % model.config.vocab_size
    model(input_ids=batch, labels=batch).loss.backward()
    if corrupt is not None:  # a finite loss whose gradient overflowed in one Post-LN block
        model.model.layers[1].mlp.down_proj.weight.grad[0, 0] = corrupt


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_nonfinite_gradient_with_a_finite_loss_never_reaches_the_weights(converted, bad):
    """Nothing is updated, and the block to blame is the one that overflowed: a NaN norm must not be
    clipped into every gradient first (torch's clip_grad_norm_ scales them all by NaN)."""
    model = load_model(converted).train()
    layers = model.model.layers
    assert layers[1].is_post_ln
    optimizer = adamw(parameter_groups(layers, [], lr=1e-3, weight_decay=0.0), betas=(0.9, 0.999))
    scheduler = warmup_cosine(optimizer, 0, 10)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _one_backward(model, corrupt=bad)
    with pytest.raises(NonFiniteStep) as error:
        take_step(optimizer, scheduler, StepGuard(), MetricRecord(step=7, tokens=28), loss=3.0,
                  clip=lambda: clip_gradients(model.parameters(), 1.0),
                  block_norms=lambda: (block_grad_norms(layers), layers), samples=range(24, 28))
    assert str(error.value) == (f"gradient norm is {bad} at step 7 (non-finite gradients in 1 of {len(layers)} blocks, "
                                "the first block 1, Post-LN); its samples are 24..27 of the seeded order")
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_a_loss_spike_is_skipped_and_a_run_of_them_stops(converted):
    model = load_model(converted).train()
    layers = model.model.layers
    guard = StepGuard(spike_factor=2.0, spike_window=3, max_skips=1)
    outside = [p for name, p in model.named_parameters() if not name.startswith("model.layers.")]
    optimizer = adamw(parameter_groups(layers, outside, lr=1e-3, weight_decay=0.0), betas=(0.9, 0.999))
    scheduler = warmup_cosine(optimizer, 0, 100)

    def step(n: int, loss: float) -> MetricRecord:
        _one_backward(model, corrupt=None)
        return take_step(optimizer, scheduler, guard, MetricRecord(step=n, tokens=n), loss=loss,
                         clip=lambda: clip_gradients(model.parameters(), 1.0),
                         block_norms=lambda: (block_grad_norms(layers), layers), samples=range(n, n + 1))

    for n, loss in enumerate([4.0, 4.2, 3.9], 1):
        assert step(n, loss).skipped is None
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert step(4, 9.0).skipped  # above 2 x 4.03
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())
    assert guard.state_dict() == {"recent": [4.0, 4.2, 3.9], "skips_in_a_row": 1}
    with pytest.raises(MixLNError, match=r"loss spiked above 2 x the mean of the last 3 steps .* 2 steps in a row"):
        step(5, 9.5)
    restored = StepGuard(spike_factor=2.0, spike_window=3)
    restored.load_state_dict(guard.state_dict())
    assert restored.recent == guard.recent and restored.skips_in_a_row == guard.skips_in_a_row == 2
    for damaged, key in [({"recent": "4.0", "skips_in_a_row": 0}, "recent"), ({"recent": [4.0]}, "missing"),
                         ({"recent": [float("nan")], "skips_in_a_row": 0}, "recent"),
                         ({"recent": [], "skips_in_a_row": -1}, "skips_in_a_row")]:
        with pytest.raises(MixLNError, match=f"^step_guard.json: .*{key}"):
            restored.load_state_dict(damaged, "step_guard.json")
    assert restored.recent == guard.recent  # a refused state leaves the guard as it was


def test_batches_go_to_a_gpu_through_pinned_memory_and_workers():
    assert loader_options(torch.device("cpu")) == {}
    assert loader_options(torch.device("cuda", 0)) == {"pin_memory": True, "num_workers": 2,
                                                        "persistent_workers": True}
