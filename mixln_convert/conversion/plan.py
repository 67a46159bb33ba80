"""What each output tensor of a conversion is: the logic, kept apart from reading and writing.

A plan walks the source's tensor names once and yields ``(name, tensor)`` for the output, one
tensor at a time (so a conversion can stream). Per strategy, a Post-LN layer i (i < n_post):

==============  ====================  =====================  ====================
strategy        input_layernorm       post_attention gain    post_feedforward gain
==============  ====================  =====================  ====================
move            dropped               kept                   ones
calibrated      folded into q/k/v     fitted (calibrate.py)  fitted (calibrate.py)
reinit-post     dropped               ones                   ones (layer re-initialized)
scratch         every tensor of the model is freshly initialized
==============  ====================  =====================  ====================

``calibrated`` folds ``gain / typical_rms`` into the input columns of the projections that
read a norm's output, because a Post-LN block feeds them a residual stream normalized to a
constant RMS instead of the Pre-LN norm's output (docs/mixln.md).
"""

from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..architectures import Architecture
from .initialization import fresh_tensor, init_std



@dataclass
class ConversionPlan:
    arch: Architecture
    config: dict
    n_post: int
    strategy: str
    scaled_init: bool = True
    seed: int = 0
    stats: dict | None = None  # calibrate() of the source, for "calibrated"
    dtype: torch.dtype = torch.float32
    roles: dict = field(init=False)  # per-layer tensor suffix -> role ("attention_inputs", ...)

    def __post_init__(self):
        self.roles = {}
        for role, names in self.arch.layer.items():
            for n in names if isinstance(names, list) else [names]:
                self.roles[n] = role

    def _fresh(self, name: str, role: str | None, shape) -> torch.Tensor:
        is_norm = name == self.arch.final_norm or (role or "").endswith("norm")
        std = None if is_norm else init_std(role or "", self.config.get("initializer_range", 0.02),
                                             self.config["num_hidden_layers"], self.scaled_init)
        return fresh_tensor(name, shape, std, self.seed)

    def tensors(self, source) -> Iterator[tuple[str, torch.Tensor]]:
        tied = self.config.get("tie_word_embeddings", False)
        for name in source.names():
            if tied and name == self.arch.lm_head:
                continue  # written once, as the embeddings
            i = self.arch.layer_of(name)
            if self.strategy == "scratch":
                yield from self._scratch(source, name, i)
            elif i is None or i >= self.n_post:
                yield name, source.get(name).to(self.dtype)
            else:
                yield from self._post_ln(source, name, i)

    def _scratch(self, source, name: str, i: int | None):
        shape = source.shape(name)
        if i is None:
            yield name, self._fresh(name, None, shape).to(self.dtype)
            return
        role = self.roles[name.removeprefix(self.arch.layer_prefix.format(i=i))]
        if i < self.n_post and role == "input_norm":
            return
        yield name, self._fresh(name, role, shape).to(self.dtype)
        if i < self.n_post and role == "post_attention_norm":
            pf = self.arch.layer_tensor(i, "post_feedforward_norm")
            yield pf, self._fresh(pf, "post_feedforward_norm", shape).to(self.dtype)

    def _post_ln(self, source, name: str, i: int):
        role = self.roles[name.removeprefix(self.arch.layer_prefix.format(i=i))]
        if role == "input_norm":
            return
        if self.strategy == "reinit-post":
            tensor = self._fresh(name, role, source.shape(name))
        else:  # as stored: moved tensors stream through uncopied; the folds below compute in float32
            tensor = source.get(name)
        if role == "post_attention_norm":
            pf_name = self.arch.layer_tensor(i, "post_feedforward_norm")
            pf = torch.ones_like(tensor)
            if self.strategy == "calibrated":
                a, b = self._channel_scale("post_attention", i), self._channel_scale("post_feedforward", i)
                tensor = self.stats["post_attention_gain"][i] * b / a
                pf = self.stats["post_feedforward_gain"][i] * self._channel_scale("post_attention", i + 1) / b
            yield name, tensor.to(self.dtype)
            yield pf_name, pf.to(self.dtype)
            return
        if self.strategy == "calibrated":
            tensor = self._calibrated(source, role, tensor, i)
        yield name, tensor.to(self.dtype)

    def _channel_scale(self, norm: str, i: int) -> torch.Tensor:
        """The per-channel scale in which block i holds the sum its ``norm`` reads (calibrate.py);
        ones past the Post-LN blocks, whose input is the unscaled residual stream."""
        if i >= self.n_post:
            return torch.ones_like(self.stats[f"{norm}_gain"][0])
        return self.stats[f"{norm}_scale"][i].float()

    def _calibrated(self, source, role: str, tensor: torch.Tensor, i: int) -> torch.Tensor:
        """A projection of Post-LN block i, calibrated: the Pre-LN gain it read folded in, divided by
        the stream's typical RMS, and the channel scales of the sums it reads or writes."""
        a, b = self._channel_scale("post_attention", i), self._channel_scale("post_feedforward", i)
        if role == "attention_inputs":
            gain = source.get(self.arch.layer_tensor(i, "input_norm")).float()
            return tensor * (gain / (self.stats["input_scale"][i] * a))[None, :]
        if role == "attention_output":
            return tensor * a[:, None]
        if role == "mlp_inputs":
            gain = source.get(self.arch.layer_tensor(i, "post_attention_norm")).float()
            return tensor * (gain / (self.stats["mid_scale"][i] * b))[None, :]
        if role == "mlp_output":
            return tensor * b[:, None]
        return tensor
