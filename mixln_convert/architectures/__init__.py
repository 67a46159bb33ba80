"""Architecture descriptions as data (one JSON file per family, mergekit style).

Each file names a family's tensors, the submodule holding its decoder and what a converted checkpoint
is called; ``"extends": "llama.json"`` takes another's and lists only what differs (tables merge key by
key). A family whose blocks are LLaMA's under another name is a JSON file alone (``mistral.json``); one
whose blocks hold more tensors lists them as roles of its own (``qwen3.json``'s per-head q/k norms) and
needs its Mix-LN classes in ``model/``, which the ``converted`` table names.
"""

import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from ..errors import MixLNError

# LayerNorm Scaling (LNS; arXiv 2502.05795): an LNS model multiplies each norm output of block l
# (counted from 1: layer index i + 1) by 1/sqrt(l). A Pre-LN model becomes an LNS model computing
# the same function when these norms' gains are multiplied by sqrt(l): the scaling cancels. Only
# training then differs: AdamW moves a gain by about the learning rate whatever its size, so a
# retrofitted gain's effective step is 1/sqrt(l) of the Pre-LN one's.
LNS_NORM_ROLES = ("input_norm", "post_attention_norm")


def lns_gain(i: int) -> float:
    """The factor of block ``i``'s LNS norm gains that cancels the model's 1/sqrt(i + 1)."""
    return math.sqrt(i + 1)


@dataclass(frozen=True)
class Architecture:
    description: str
    architectures: list[str]
    model_type: str
    gguf_architecture: str
    converted: dict
    decoder: str
    embed: str
    final_norm: str
    lm_head: str
    layer_prefix: str
    layer: dict
    # config keys the Mix-LN model does not implement -> what they are; a source converts only
    # where they are null, false or absent (Mistral's sliding_window, Qwen's use_sliding_window)
    unsupported_config: dict = field(default_factory=dict)
    # the same tensors' names in a GGUF file, and the GGUF metadata keys (after "<arch>.") of the config
    gguf: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.architectures[0]

    def layer_tensor(self, i: int, role: str) -> str | list[str]:
        """Full tensor name(s) of ``role`` (a key of the JSON ``layer`` table) in layer ``i``."""
        names = self.layer[role]
        prefix = self.layer_prefix.format(i=i)
        return [prefix + n for n in names] if isinstance(names, list) else prefix + names

    def layer_of(self, tensor_name: str) -> int | None:
        """The layer index a tensor belongs to, or None for embeddings, final norm, head."""
        match = re.match(re.escape(self.layer_prefix).replace(re.escape("{i}"), r"(\d+)"), tensor_name)
        return int(match.group(1)) if match else None

    def decoder_of(self, model):
        """The decoder (embeddings, blocks, final norm) of ``model``, a causal LM of this family."""
        return model.get_submodule(self.decoder)

    def blocks_of(self, model):
        """The decoder blocks of ``model``, a causal LM of this family: the module ``layer_prefix`` names."""
        return model.get_submodule(self.layer_prefix.removesuffix(".{i}."))

    def gguf_names(self, num_layers: int) -> dict[str, str]:
        """{GGUF tensor name: checkpoint tensor name} of a ``num_layers``-deep model."""
        names = {self.gguf[key]: getattr(self, key) for key in ("embed", "final_norm", "lm_head")}
        for i in range(num_layers):
            prefix = self.gguf["layer_prefix"].format(i=i)
            for role, gguf_names in self.gguf["layer"].items():
                ours = self.layer_tensor(i, role)
                gguf_names = [gguf_names] if isinstance(gguf_names, str) else gguf_names
                ours = [ours] if isinstance(ours, str) else ours
                names.update({prefix + g: o for g, o in zip(gguf_names, ours)})
        return names


def _read(name: str) -> dict:
    """A description's fields; ``"extends": "other.json"`` takes that file's and overrides some."""
    fields = json.loads(resources.files(__package__).joinpath(name).read_text())
    base = fields.pop("extends", None)
    return _merged(_read(base), fields) if base else fields


def _merged(base: dict, override: dict) -> dict:
    """``base`` with ``override``'s values, tables merged key by key (a list or a name replaces)."""
    merged = dict(base)
    for key, value in override.items():
        both_tables = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merged(base[key], value) if both_tables else value
    return merged


@cache
def all_architectures() -> tuple[Architecture, ...]:
    files = sorted(f.name for f in resources.files(__package__).iterdir() if f.name.endswith(".json"))
    return tuple(Architecture(**_read(name)) for name in files)


def converted_architecture(config: dict) -> Architecture | None:
    """The family of a converted (Mix-LN or LNS) checkpoint's config; None for a source checkpoint."""
    return next((arch for arch in all_architectures() if config.get("model_type") == arch.converted["model_type"]),
                None)


def architecture_of_model(model) -> Architecture:
    """The family of a loaded causal LM, a source or a converted one."""
    model_type = model.config.model_type
    return next(a for a in all_architectures() if model_type in (a.model_type, a.converted["model_type"]))


def model_blocks(model):
    """The decoder blocks (a ModuleList) of a loaded causal LM of any described family."""
    return architecture_of_model(model).blocks_of(model)


def architecture_for(config: dict, where: str) -> Architecture:
    """The architecture of a source checkpoint's ``config.json`` contents (``where`` names the file);
    refuses checkpoints that are already converted and families no JSON file describes."""
    model_type = config.get("model_type")
    if converted_architecture(config):
        raise MixLNError(f"{where}: already a Mix-LN checkpoint (model_type {model_type!r}); convert its Pre-LN "
                         "source instead")
    declared = config.get("architectures") or []
    for arch in all_architectures():
        if model_type == arch.model_type and (not declared or set(declared) & set(arch.architectures)):
            for key, feature in arch.unsupported_config.items():
                if config.get(key) is not None and config[key] is not False:
                    raise MixLNError(f"{where}: {key} {config[key]}: the Mix-LN model has no {feature}; "
                                     f"only {arch.name} checkpoints with {key} null or false convert")
            for key in ("attention_bias", "mlp_bias"):  # the conversion plan folds and fits bias-free weights
                if config.get(key):
                    raise MixLNError(f"{where}: {key} true: projections with biases are not supported "
                                     "(the conversion folds and fits LLaMA's bias-free blocks)")
            return arch
    supported = ", ".join(f"{a} (model_type {arch.model_type!r})" for arch in all_architectures()
                          for a in arch.architectures)
    found = f"model_type {model_type!r}" + (f" with architectures {', '.join(declared)}" if declared else "")
    raise MixLNError(f"{where}: unsupported architecture: {found}; supported: {supported}")


def architecture_of_gguf(gguf_arch: str, where: str) -> Architecture:
    """The architecture a GGUF file's ``general.architecture`` names."""
    for arch in all_architectures():
        if arch.gguf_architecture == gguf_arch and arch.gguf:
            return arch
    supported = sorted({a.gguf_architecture for a in all_architectures()})
    raise MixLNError(f"{where}: GGUF architecture {gguf_arch!r} is not supported "
                     f"(expected {', '.join(map(repr, supported))})")


def architecture_of_any(config: dict, where: str) -> Architecture:
    """The architecture of a source or an already converted checkpoint."""
    return converted_architecture(config) or architecture_for(config, where)
