"""What each output tensor of a conversion is: the logic, kept apart from reading and writing.

A plan yields ``(name, tensor)`` for each output tensor, one at a time, so that a conversion can
stream. Per strategy, a Post-LN layer i (i < post_ln_layers):

==============  ====================  =====================  ====================
strategy        input_layernorm       post_attention gain    post_feedforward gain
==============  ====================  =====================  ====================
move            dropped               kept                   ones
calibrated      folded into q/k/v     fitted (calibrate.py)  fitted (calibrate.py)
reinit-post     dropped               ones                   ones (layer re-initialized)
scratch         every tensor of the model is freshly initialized
==============  ====================  =====================  ====================

``lns_gains`` (the LNS retrofit: no Post-LN block) multiplies every block's norm gains by
sqrt(layer index + 1) and carries every other tensor over.

``calibrated`` folds ``gain / typical_rms`` into the input columns of the projections that read a
norm's output (:mod:`.calibrate`). A family's own tensors stay as the source has them: Qwen2's q/k/v
biases are added after the scaled product (W (gain * x / rms) + b, the Pre-LN projection of a token at
the typical RMS); Qwen3's per-head q/k norms act on the projections' outputs.
"""

from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..architectures import LNS_NORM_ROLES, Architecture, lns_gain
from ..io.checkpoint import StoredTensor
from .initialization import fresh_tensor, init_std

# calibrated: the projections a norm is folded into -> (that norm, its typical RMS in the stats)
FOLDED = {"attention_inputs": ("input_norm", "input_scale"), "mlp_inputs": ("post_attention_norm", "mid_scale")}


@dataclass
class ConversionPlan:
    arch: Architecture
    config: dict
    post_ln_layers: int
    strategy: str
    scaled_init: bool = True
    seed: int = 0
    stats: dict | None = None  # calibrate() of the source, for "calibrated"
    dtype: torch.dtype = torch.float32
    lns_gains: bool = False  # each block's norm gains x sqrt(l): the exact LNS retrofit
    roles: dict = field(init=False)  # per-layer tensor suffix -> role ("attention_inputs", ...)

    def __post_init__(self):
        self.roles = {n: role for role, names in self.arch.layer.items()
                      for n in (names if isinstance(names, list) else [names])}

    def _fresh(self, name: str, role: str | None, shape) -> torch.Tensor:
        if (role or "").endswith("biases"):  # Qwen2's q/k/v biases: zeros, as transformers initializes them
            return torch.zeros(shape)
        is_norm = name == self.arch.final_norm or (role or "").endswith(("norm", "norms"))  # norms: Qwen3's q/k
        std = None if is_norm else init_std(role or "", self.config.get("initializer_range", 0.02),
                                             self.config["num_hidden_layers"], self.scaled_init)
        return fresh_tensor(name, shape, std, self.seed)

    def tensors(self, source) -> Iterator[tuple[str, torch.Tensor | StoredTensor]]:
        tied = self.config.get("tie_word_embeddings", False)
        for name in source.names():
            if tied and name == self.arch.lm_head:
                continue  # written once, as the embeddings
            i = self.arch.layer_of(name)
            if self.strategy == "scratch":
                yield from self._scratch(source, name, i)
            elif i is None or i >= self.post_ln_layers:
                yield name, self._carried(source, name, i)
            else:
                yield from self._post_ln(source, name, i)

    def _scratch(self, source, name: str, i: int | None):
        shape = source.shape(name)
        role = None if i is None else self._role(name, i)
        if role == "input_norm" and i < self.post_ln_layers:
            return
        yield name, self._fresh(name, role, shape).to(self.dtype)
        if role == "post_attention_norm" and i < self.post_ln_layers:
            pf = self.arch.layer_tensor(i, "post_feedforward_norm")
            yield pf, self._fresh(pf, "post_feedforward_norm", shape).to(self.dtype)

    def _role(self, name: str, i: int) -> str:
        return self.roles[name.removeprefix(self.arch.layer_prefix.format(i=i))]

    def _carried(self, source, name: str, i: int | None) -> torch.Tensor | StoredTensor:
        """A tensor as the source holds it (streamed through uncopied), an LNS retrofit's norm gains
        scaled (in float64, so the cast to ``dtype`` is the only rounding)."""
        stored = source.stored(name)
        suffix = None if i is None else name.removeprefix(self.arch.layer_prefix.format(i=i))
        if self.lns_gains and self.roles.get(suffix) in LNS_NORM_ROLES:
            return (stored.tensor.double() * lns_gain(i)).to(self.dtype)
        return stored.to(self.dtype)

    def _post_ln(self, source, name: str, i: int):
        role = self._role(name, i)
        if role == "input_norm":
            return
        if self.strategy == "reinit-post":
            tensor = self._fresh(name, role, source.shape(name))
        elif self.strategy == "calibrated" and role in FOLDED:  # the fold computes in float32
            norm, scale = FOLDED[role]
            tensor = source.get(name)
            gain = source.get(self.arch.layer_tensor(i, norm)).float()
            tensor = tensor * (gain / self.stats[scale][i])[None, :]
        else:  # as stored: moved tensors stream through uncopied
            tensor = source.stored(name)
        calibrated_norm = role == "post_attention_norm" and self.strategy == "calibrated"
        if calibrated_norm:
            tensor = self.stats["post_attention_gain"][i].clone()
        yield name, tensor.to(self.dtype)
        if role == "post_attention_norm":
            pf = self.stats["post_feedforward_gain"][i].clone() if calibrated_norm else torch.ones(source.shape(name))
            yield self.arch.layer_tensor(i, "post_feedforward_norm"), pf.to(self.dtype)
