"""Training recipes: a YAML file of (nested) keys, completed from ``DEFAULTS``, overridden with
``--set dotted.key=value``, type-checked and validated before any work starts.

Every key a recipe may hold is in ``DEFAULTS``; a key that is not there is an error, so a typo
never silently trains with a default. The shipped recipes and accelerate configs live in the
repository's top-level ``recipes/`` (linked as ``mixln_convert/recipes``, so the wheel carries them
as package data): ``train NAME`` takes one by name, or any YAML file by path.
"""

import copy
import glob
import math
import os
from importlib import resources
from pathlib import Path

import yaml

from ..errors import MixLNError
from ..io.hub import hub_name
from ..io.paths import check_readable, checkpoint_path, is_pattern
from ..limits import SPIKE_FACTORS, below_one_step, spike_factor_ok
from ..options import (ALPHA, ARMS, ATTENTIONS, DEFAULT_ARMS, EVAL_SEQ_LEN, EVAL_TOKENS, HEAL_BATCH_SIZE, HEAL_LOSS,
                       HEAL_LR, HEAL_SEQ_LEN, LOSSES, PRECISIONS, STRATEGIES)

SMOLLM2 = "smollm2"  # `source: smollm2` names the embedded default model (the cached GGUF)

DEFAULTS = {
    "source": None,  # the Pre-LN model: HF folder, .gguf, Hugging Face Hub name ORG/NAME[@REVISION], or "smollm2"
    "converted": None,  # an already converted Mix-LN checkpoint; None: convert `source` into OUT/mixln/converted
    # what `train` runs (its --arm overrides it), one arm after the other on the same data, order and
    # budget: mixln (the source converted), preln (the source itself, the control), lns (the source
    # retrofitted to LayerNorm Scaling, exactly: conversion/lns.py)
    "arms": list(DEFAULT_ARMS),
    # alpha: the paper's, for 71M-1B models. scaled_init: o_proj/down_proj std / sqrt(2L) for the
    # freshly initialized weights of reinit-post and scratch; with scratch the Pre-LN arm is
    # initialized by the same plan (alpha 0, same seed), so both arms start alike
    "conversion": {"alpha": ALPHA, "strategy": "calibrated", "scaled_init": True},
    # Distil the converted Post-LN blocks from the source before training (mixln-convert heal);
    # tokens 0 skips it.
    "heal": {"tokens": 0, "seq_len": HEAL_SEQ_LEN, "batch_size": HEAL_BATCH_SIZE, "lr": HEAL_LR, "loss": HEAL_LOSS,
             "activation_checkpointing": False, "spike_factor": 0.0},  # spike_factor: as guard's, for the heal
    "data": {
        # a tokenized folder (`mixln-convert tokenize`), or text: a file, folder, glob or Hugging Face Hub
        # dataset (see `read_texts`), tokenized into the user cache first; None: the embedded corpus's train split
        "train": None,
        "validation": None,  # None: embedded validation split, or a held-out fraction of data.train's documents
        "validation_fraction": 0.01,
        "eval_tokens": EVAL_TOKENS,  # validation tokens scored at each evaluation (eval's and analyze's default)
        "num_proc": 0,  # processes tokenizing text data.train; 0: one per core for text over 16 MiB
    },
    "seq_len": EVAL_SEQ_LEN,  # the paper's (LLaMA-71M..1B); validation blocks have it too
    "micro_batch_size": 4,  # sequences per forward pass and process
    "global_batch_size": 32,  # sequences per optimizer step, all processes and accumulation together
    "max_tokens": 1_000_000,  # training budget; steps = max_tokens // (global_batch_size * seq_len)
    # lr: the paper's from scratch; a pretrained source usually wants less (3e-4, 1e-4)
    # post_ln_lr_scale: the Post-LN blocks' lr as a multiple of lr (right after a conversion their
    # gradients are ~15x the Pre-LN blocks'; 0.25 recovered more than 1 in the CPU rehearsal of
    # docs/training.md, one run: a default to revisit on GPUs, not a finding)
    "optim": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8, "post_ln_lr_scale": 0.25},
    "schedule": {"warmup_steps": 100, "min_lr_ratio": 0.1},  # linear warmup, cosine (paper) down to min_lr_ratio * lr
    "grad_clip": 1.0,  # max global gradient norm; 0 disables clipping
    # a step whose loss exceeds spike_factor x the mean of the last spike_window steps' is not
    # applied (training/loop.py), up to max_skips in a row; spike_factor 0 turns the check off
    "guard": {"spike_factor": 3.0, "spike_window": 20, "max_skips": 5},
    # recompute each block's activations in the backward instead of keeping them (one more forward
    # of the blocks per step, activations no longer growing with depth)
    "activation_checkpointing": False,
    "fsdp": False,  # shard weights, gradients and AdamW state over the processes (FSDP2; training/sharding.py)
    "compile": False,  # torch.compile each decoder block (GPU speed; the first steps pay the compilation)
    "precision": "auto",  # bf16 autocast on a GPU with fp32 master weights; fp32 on CPU
    "attention": "sdpa",  # transformers' attention kernel: sdpa (flash/efficient on GPUs) or eager (plain matmuls)
    "log_interval": 1,
    "eval_interval": 100,
    "checkpoint_interval": 500,
    "keep_checkpoints": 2,  # most recent checkpoints kept per arm; 0 keeps all
    "grad_norm_interval": 10,
    "seed": 0,
    "allow_longer_seq": False,  # true: seq_len may exceed the source's max_position_embeddings
}
PATH_KEYS = ("source", "converted", "data.train", "data.validation")  # strings or None; others typed by default
CHECKPOINT_KEYS = ("source", "converted")  # the other path keys name text


class _RecipeLoader(yaml.SafeLoader):
    """YAML with aliases of single values only: an alias of a mapping or list can refer to itself
    or, nested, expand exponentially (a "billion laughs" file), and no recipe needs one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if not isinstance(self.anchors.get(event.anchor), (yaml.ScalarNode, type(None))):
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} of a mapping or list: recipes allow aliases of single "
                    "values only", event.start_mark)
        return super().compose_node(parent, index)


def _parse(text: str):
    return yaml.load(text, Loader=_RecipeLoader)


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
    if leaf not in node:
        raise MixLNError(f"{where}: unknown key {dotted!r}")
    if isinstance(node[leaf], dict):
        keys = ", ".join(f"{dotted}.{key}" for key in _flatten(node[leaf]))
        raise MixLNError(f"{where}: {dotted!r} is a section, not a key: set one of {keys}")
    node[leaf] = value


def _typed(key: str, value, default, where: str):
    """`value` converted to the type of the key's default. YAML reads 3e-4 (no dot) as a string,
    so numbers are also accepted as strings."""
    if key in PATH_KEYS:
        return None if value is None else str(value)
    try:
        if isinstance(default, list) and all(isinstance(v, str) for v in default):  # names, any number of them
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
        if isinstance(default, list):
            if not isinstance(value, list) or len(value) != len(default):
                raise ValueError
            return [float(v) for v in value]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError
            return value
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
        kind = ("a list of names" if isinstance(default, list) and isinstance(default[0], str) else
                f"a list of {len(default)} numbers" if isinstance(default, list) else "true or false"
                if isinstance(default, bool) else type(default).__name__)
        raise MixLNError(f"{where}: {key} must be {kind}, got {value!r}") from None


def _resolve_path(key: str, value: str | None, where: str) -> str | None:
    if value is None:
        return None
    if key == "source" and value == SMOLLM2:
        from ..fetch import smollm2_gguf

        return str(smollm2_gguf())
    if hub_name(value, "model" if key in CHECKPOINT_KEYS else "dataset") is not None:
        flag = f"{where}: {key}"
        if key in CHECKPOINT_KEYS:
            return checkpoint_path(value, flag)  # its snapshot folder: an input like any folder
        check_readable(value, flag)
        return value  # datasets reads it by name
    path = os.path.abspath(os.path.expanduser(value))
    if not (os.path.exists(path) or (is_pattern(path) and glob.glob(path, recursive=True))):
        raise MixLNError(f"{where}: {key}: {value} does not exist")
    return path


def _check(r: dict, where: str, origin: dict) -> None:
    """Ranges and budgets; a message names what set the key (``origin``: the file or a --set item),
    else ``where``, the recipe."""
    def need(ok: bool, message: str, key: str | None = None):
        if not ok:
            raise MixLNError(f"{origin.get(key, where)}: {message}")

    def number(key: str, ok, interval: str):
        value = flat[key]
        need(math.isfinite(value) and ok(value), f"{key} must be {interval}, got {value!r}", key)

    flat = _flatten(r)
    need(r["source"] is not None, "source is required (a Pre-LN checkpoint folder, a .gguf, or smollm2)")
    need(r["conversion"]["strategy"] in STRATEGIES, f"conversion.strategy must be one of {', '.join(STRATEGIES)}")
    need(bool(r["arms"]) and set(r["arms"]) <= set(ARMS) and len(set(r["arms"])) == len(r["arms"]),
         f"arms must list distinct arms of {', '.join(ARMS)}, got {r['arms']!r}", "arms")
    need(r["heal"]["loss"] in LOSSES, f"heal.loss must be one of {', '.join(LOSSES)}")
    need(r["precision"] in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}")
    need(r["attention"] in ATTENTIONS, f"attention must be one of {', '.join(ATTENTIONS)}", "attention")
    for key in ("seq_len", "micro_batch_size", "global_batch_size", "max_tokens", "data.eval_tokens",
                "log_interval", "eval_interval", "checkpoint_interval", "grad_norm_interval", "heal.seq_len",
                "heal.batch_size"):
        number(key, lambda v: v > 0, "a positive integer")
    for key in ("heal.tokens", "schedule.warmup_steps", "keep_checkpoints", "data.num_proc"):
        number(key, lambda v: v >= 0, "an integer >= 0")
    number("conversion.alpha", lambda v: 0 <= v <= 1, "in [0, 1]")
    number("data.validation_fraction", lambda v: 0 < v < 1, "in (0, 1)")
    number("optim.lr", lambda v: v > 0, "a number > 0")
    number("heal.lr", lambda v: v > 0, "a number > 0")
    number("optim.eps", lambda v: v > 0, "a number > 0")
    number("optim.weight_decay", lambda v: v >= 0, "a number >= 0")
    number("grad_clip", lambda v: v >= 0, "a number >= 0 (0 disables clipping)")
    number("schedule.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    number("optim.post_ln_lr_scale", lambda v: 0 < v <= 10, "in (0, 10]")
    for key in ("guard.spike_factor", "heal.spike_factor"):
        number(key, spike_factor_ok, SPIKE_FACTORS)
    number("guard.spike_window", lambda v: 1 <= v <= 10_000, "an integer in [1, 10000]")
    number("guard.max_skips", lambda v: 0 <= v <= 10_000, "an integer in [0, 10000]")
    number("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)")
    for i, beta in enumerate(r["optim"]["betas"]):
        need(math.isfinite(beta) and 0 <= beta < 1, f"optim.betas[{i}] must be in [0, 1), got {beta!r}", "optim.betas")
    need(r["global_batch_size"] % r["micro_batch_size"] == 0,
         f"global_batch_size {r['global_batch_size']} is not a multiple of micro_batch_size {r['micro_batch_size']}")
    step_tokens = r["global_batch_size"] * r["seq_len"]
    need(r["max_tokens"] >= step_tokens, f"max_tokens {r['max_tokens']} is less than one optimizer step "
                                         f"(global_batch_size x seq_len = {step_tokens} tokens)")
    short = r["heal"]["tokens"] and below_one_step(r["heal"]["tokens"], r["heal"]["batch_size"], r["heal"]["seq_len"],
                                                   "heal.batch_size x heal.seq_len", "one heal step")
    need(not short, f"heal.tokens {short}; 0 skips the heal")


RECIPES = resources.files("mixln_convert") / "recipes"


def shipped_recipes(folder=RECIPES) -> dict[str, str]:
    """{name: first comment line} of the recipes (or, given their folder, accelerate configs)
    that ship with the package."""
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            first = next((line for line in entry.read_text().splitlines() if line.startswith("#")), "#")
            found[entry.name.removesuffix(".yaml")] = first.lstrip("# ").strip()
    return found


def shipped_file(name: str) -> Path:
    """Path of a shipped recipe (``smollm2-135m-cpu``) or accelerate config (``fsdp`` or
    ``accelerate/fsdp``). Only listed names: a name is never a path (``../tasks/x`` would reach
    a package file that is neither)."""
    recipes, configs = shipped_recipes(), shipped_recipes(RECIPES / "accelerate")
    if name in recipes:
        return Path(str(RECIPES / f"{name}.yaml"))
    if name.removeprefix("accelerate/") in configs:
        return Path(str(RECIPES / "accelerate" / f"{name.removeprefix('accelerate/')}.yaml"))
    names = ", ".join([*recipes, *(f"accelerate/{config}" for config in configs)])
    raise MixLNError(f"{name}: not a shipped recipe or config ({names})")


def recipe_path(name_or_path) -> Path:
    """A recipe argument: a file that exists, or a path the user meant as one (named in the
    error when it cannot be read), else the name of a shipped recipe (accelerate configs are
    not recipes)."""
    path = Path(os.path.expanduser(str(name_or_path)))
    if path.is_file() or path.suffix in (".yaml", ".yml") or os.sep in str(name_or_path):
        return path
    recipes = shipped_recipes()
    if str(name_or_path) not in recipes:
        raise MixLNError(f"{name_or_path}: neither a recipe file nor a shipped recipe ({', '.join(recipes)})")
    return Path(str(RECIPES / f"{name_or_path}.yaml"))


def load_recipe(path, overrides=()) -> dict:
    """The fully resolved recipe of the YAML file ``path`` with ``overrides`` ("dotted.key=value").

    Paths become absolute (``source: smollm2`` the cached SmolLM2 GGUF, fetched if missing; a Hub
    model name its snapshot folder; a Hub dataset name stays a name, checked); any unknown key,
    wrong type, missing file or impossible budget raises a one-line MixLNError.
    """
    path = recipe_path(path)
    try:
        loaded = _parse(path.read_text()) or {}
    except OSError as e:
        raise MixLNError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except UnicodeDecodeError:
        raise MixLNError(f"{path}: the recipe is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise MixLNError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise MixLNError(f"{path}: a recipe must be a mapping of keys to values")
    recipe = copy.deepcopy(DEFAULTS)
    origin = {}  # dotted key -> what set it (the file, or the --set item), for messages
    for key, value in _flatten(loaded).items():
        _assign(recipe, str(key), value, str(path))
        origin[str(key)] = str(path)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise MixLNError(f"--set {item}: expected KEY=VALUE, e.g. --set optim.lr=3e-4")
        try:
            value = _parse(text)
        except yaml.YAMLError:
            raise MixLNError(f"--set {item}: the value is not valid YAML") from None
        _assign(recipe, key.strip(), value, f"--set {item}")
        origin[key.strip()] = f"--set {item}"
    defaults = _flatten(DEFAULTS)
    for key, value in _flatten(recipe).items():
        where = origin.get(key, str(path))
        value = _typed(key, value, defaults[key], where)
        _assign(recipe, key, _resolve_path(key, value, where) if key in PATH_KEYS else value, where)
    _check(recipe, str(path), origin)
    return recipe


def optimizer_steps(recipe: dict) -> int:
    """Optimizer steps the token budget pays for (whole steps; the remainder is not trained)."""
    return recipe["max_tokens"] // (recipe["global_batch_size"] * recipe["seq_len"])
