"""Training recipes: a YAML file of (nested) keys, completed from ``DEFAULTS``, overridden with
``--set dotted.key=value``, type-checked and validated before any work starts.

Every key a recipe may hold is in ``DEFAULTS``; a key that is not there is an error, so a typo
never silently trains with a default.
"""

import copy
import glob
import math
import os
from pathlib import Path

import yaml

from ..conversion.plan import STRATEGIES
from ..errors import MixLNError

SMOLLM2 = "smollm2"  # `source: smollm2` names the embedded default model (the cached GGUF)
PRECISIONS = ("auto", "bf16", "fp32")  # auto: bf16 autocast on GPU, fp32 on CPU

DEFAULTS = {
    "source": None,  # the Pre-LN model: HF folder, .gguf, or "smollm2"
    "converted": None,  # an already converted Mix-LN checkpoint; None: convert `source` into OUT/mixln/converted
    "conversion": {"alpha": 0.25, "strategy": "calibrated"},
    # Distil the converted Post-LN blocks from the source before training (mixln-convert heal);
    # tokens 0 skips it. KL on the final logits recovers SmolLM2 to 1.007x in 64k tokens.
    "heal": {"tokens": 0, "seq_len": 256, "batch_size": 4, "lr": 1e-4, "loss": "kl"},
    "data": {
        "train": None,  # file, folder or glob (see `read_texts`); None: the embedded corpus's train split
        "validation": None,  # None: embedded validation split, or a held-out fraction of data.train's documents
        "validation_fraction": 0.01,
        "eval_tokens": 65536,  # validation tokens scored at each evaluation
    },
    "seq_len": 256,
    "micro_batch_size": 4,  # sequences per forward pass and process
    "global_batch_size": 32,  # sequences per optimizer step, all processes and accumulation together
    "max_tokens": 1_000_000,  # training budget; steps = max_tokens // (global_batch_size * seq_len)
    "optim": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8},
    "schedule": {"warmup_steps": 100, "min_lr_ratio": 0.1},  # linear warmup, cosine down to min_lr_ratio * lr
    "grad_clip": 1.0,  # max global gradient norm; 0 disables clipping
    "precision": "auto",
    "log_interval": 1,
    "eval_interval": 100,
    "checkpoint_interval": 500,
    "keep_checkpoints": 2,  # most recent checkpoints kept per arm; 0 keeps all
    "grad_norm_interval": 10,
    "seed": 0,
}
PATH_KEYS = ("source", "converted", "data.train", "data.validation")  # strings or None; others typed by default


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _assign(recipe: dict, dotted: str, value, where: str) -> None:
    *parents, leaf = dotted.split(".")
    node = recipe
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            raise MixLNError(f"{where}: unknown key {dotted!r}")
    if leaf not in node or isinstance(node[leaf], dict):
        raise MixLNError(f"{where}: unknown key {dotted!r}")
    node[leaf] = value


def _typed(key: str, value, default, where: str):
    """`value` converted to the type of the key's default. YAML reads 3e-4 (no dot) as a string,
    so numbers are also accepted as strings."""
    if key in PATH_KEYS:
        return None if value is None else str(value)
    try:
        if isinstance(default, list):
            if not isinstance(value, list) or len(value) != len(default):
                raise ValueError
            return [float(v) for v in value]
        if isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError
            return float(value)
        if isinstance(default, int):
            number = float(value) if isinstance(value, str) else value  # "2e8" from --set
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
                raise ValueError
            return int(number)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (ValueError, TypeError, OverflowError):
        kind = f"a list of {len(default)} numbers" if isinstance(default, list) else type(default).__name__
        raise MixLNError(f"{where}: {key} must be {kind}, got {value!r}") from None


def _resolve_path(key: str, value: str | None, where: str) -> str | None:
    if value is None:
        return None
    if key == "source" and value == SMOLLM2:
        from ..fetch import smollm2_gguf

        return str(smollm2_gguf())
    path = os.path.abspath(os.path.expanduser(value))
    if not (os.path.exists(path) or (any(c in path for c in "*?[") and glob.glob(path, recursive=True))):
        raise MixLNError(f"{where}: {key}: {value} does not exist")
    return path


def _check(r: dict, where: str) -> None:
    def need(ok: bool, message: str):
        if not ok:
            raise MixLNError(f"{where}: {message}")

    need(r["source"] is not None, "source is required (a Pre-LN checkpoint folder, a .gguf, or smollm2)")
    need(r["conversion"]["strategy"] in STRATEGIES, f"conversion.strategy must be one of {', '.join(STRATEGIES)}")
    need(0 <= r["conversion"]["alpha"] <= 1, "conversion.alpha must be in [0, 1]")
    need(r["precision"] in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}")
    flat = _flatten(r)
    for key in ("seq_len", "micro_batch_size", "global_batch_size", "max_tokens", "data.eval_tokens",
                "log_interval", "eval_interval", "checkpoint_interval", "grad_norm_interval"):
        need(flat[key] > 0, f"{key} must be positive")
    need(0 < r["data"]["validation_fraction"] < 1, "data.validation_fraction must be in (0, 1)")
    need(r["optim"]["lr"] > 0 and math.isfinite(r["optim"]["lr"]), "optim.lr must be a positive number")
    need(0 <= r["schedule"]["min_lr_ratio"] <= 1, "schedule.min_lr_ratio must be in [0, 1]")
    need(r["schedule"]["warmup_steps"] >= 0 and r["keep_checkpoints"] >= 0 and r["grad_clip"] >= 0,
         "schedule.warmup_steps, keep_checkpoints and grad_clip must not be negative")
    need(r["global_batch_size"] % r["micro_batch_size"] == 0,
         f"global_batch_size {r['global_batch_size']} is not a multiple of micro_batch_size {r['micro_batch_size']}")
    step_tokens = r["global_batch_size"] * r["seq_len"]
    need(r["max_tokens"] >= step_tokens, f"max_tokens {r['max_tokens']} is less than one optimizer step "
                                         f"(global_batch_size x seq_len = {step_tokens} tokens)")


def load_recipe(path, overrides=()) -> dict:
    """The fully resolved recipe of the YAML file ``path`` with ``overrides`` ("dotted.key=value").

    Paths become absolute (``source: smollm2`` the cached SmolLM2 GGUF, fetched if missing); any
    unknown key, wrong type, missing file or impossible budget raises a one-line MixLNError.
    """
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise MixLNError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise MixLNError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise MixLNError(f"{path}: a recipe must be a mapping of keys to values")
    recipe = copy.deepcopy(DEFAULTS)
    for key, value in _flatten(loaded).items():
        _assign(recipe, key, value, str(path))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise MixLNError(f"--set {item}: expected KEY=VALUE, e.g. --set optim.lr=3e-4")
        _assign(recipe, key.strip(), yaml.safe_load(text), f"--set {item}")
    defaults = _flatten(DEFAULTS)
    for key, value in _flatten(recipe).items():
        value = _typed(key, value, defaults[key], str(path))
        _assign(recipe, key, _resolve_path(key, value, str(path)) if key in PATH_KEYS else value, str(path))
    _check(recipe, str(path))
    return recipe


def optimizer_steps(recipe: dict) -> int:
    """Optimizer steps the token budget pays for (whole steps; the remainder is not trained)."""
    return recipe["max_tokens"] // (recipe["global_batch_size"] * recipe["seq_len"])
