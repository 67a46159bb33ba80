"""Training recipes: nested dataclasses (:class:`Recipe` and its sections) whose defaults are the
recipe defaults, read from a YAML file of (nested) keys, overridden with ``--set dotted.key=value``,
type-checked and validated once, before any work starts. A key that is not a field is an error, so a
typo never silently trains with a default. ``train NAME`` takes a shipped recipe (``recipes/``) by
name, or any YAML file by path.
"""

import dataclasses
import glob
import os
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from ..conversion.options import STRATEGIES, alpha
from ..data.options import TokenizeOptions
from ..errors import MixLNError, shown
from ..evaluation.options import EVAL_TOKENS
from ..healing.options import HealSettings
from ..io.hub import hub_name
from ..io.paths import check_readable, checkpoint_path, is_pattern
from ..options import SEQ_LEN, SET
from ..schema import (BATCH, FRACTION, NONNEGATIVE, POSITIVE_NUMBER, SEED, TOKENS, TOKENS_OR_ZERO, Choice, Count, Flag,
                      Names, Number, Numbers, SpikeFactor, Text, Window, declared, default_of, key_in, same_as,
                      setting)
from .options import ARM_NAMES, ATTENTIONS, DEFAULT_ARMS, PRECISIONS

SMOLLM2 = "smollm2"  # `source: smollm2` names the embedded default model (the cached GGUF)
# accelerate's trackers a run may log to -> its availability check (accelerate.utils) and the pip package it needs
TRACKERS = {"tensorboard": ("is_tensorboard_available", "tensorboard"), "wandb": ("is_wandb_available", "wandb"),
            "mlflow": ("is_mlflow_available", "mlflow")}
NO_TRACKER = "none"
INTERVAL = Count(1)  # steps between logs, evaluations, checkpoints


@dataclass(frozen=True)
class Conversion:
    """alpha: the paper's, for 71M-1B models. scaled_init: o_proj/down_proj std / sqrt(2L) for the
    freshly initialized weights of reinit-post and scratch; with scratch the Pre-LN arm is
    initialized by the same plan (alpha 0, same seed), so both arms start alike."""
    alpha: float = alpha()
    strategy: str = setting("calibrated", Choice(STRATEGIES))
    scaled_init: bool = setting(True, Flag())


@dataclass(kw_only=True)
class Heal(HealSettings):
    """Distil the converted Post-LN blocks from the source before training (mixln-convert heal,
    with these of its settings); tokens 0 skips it."""
    tokens: int = HealSettings.budget()


@dataclass(frozen=True)
class Data:
    # a tokenized folder (`mixln-convert tokenize`), or text: a file, folder, glob or Hugging Face Hub
    # dataset (see `read_texts`), tokenized into the user cache first; None: the embedded corpus's train split
    train: str | None = setting(None, Text())
    # None: embedded validation split, or a held-out fraction of train's documents
    validation: str | None = setting(None, Text())
    validation_fraction: float = same_as(TokenizeOptions, "validation_fraction")
    # validation tokens scored at each evaluation (eval's and analyze's default)
    eval_tokens: int = setting(EVAL_TOKENS, TOKENS)
    # processes tokenizing a text train; at most the cores: data/stream.py, once known
    num_proc: int = same_as(TokenizeOptions, "num_proc")


@dataclass(frozen=True)
class Optim:
    """AdamW. lr: the paper's from scratch; a pretrained source usually wants less. post_ln_lr_scale:
    the Post-LN blocks' lr as a multiple of lr (right after a conversion their gradients are far
    larger than the Pre-LN blocks'; docs/training.md has the rehearsal behind the default)."""
    lr: float = setting(1e-3, POSITIVE_NUMBER)
    betas: tuple[float, float] = setting((0.9, 0.95), Numbers(Number(0, 1, high_open=True), 2, 2))
    weight_decay: float = setting(0.1, NONNEGATIVE)
    eps: float = setting(1e-8, POSITIVE_NUMBER)
    post_ln_lr_scale: float = setting(0.25, Number(0, 10, low_open=True))


@dataclass(frozen=True)
class Schedule:
    """Linear warmup, then cosine (the paper's) down to min_lr_ratio x lr."""
    warmup_steps: int = setting(100, TOKENS_OR_ZERO)
    min_lr_ratio: float = setting(0.1, FRACTION)


@dataclass(frozen=True)
class Guard:
    """A step whose loss exceeds spike_factor x the mean of the last spike_window steps' is not
    applied (training/loop.py), up to max_skips in a row; spike_factor 0 turns the check off."""
    spike_factor: float = setting(3.0, SpikeFactor())
    spike_window: int = setting(20, Count(1, 10_000))
    max_skips: int = setting(5, Count(0, 10_000))


@dataclass(frozen=True)
class Recipe:
    """Everything a ``train`` run depends on; ``OUT/recipe.yaml`` holds it resolved, and --resume
    compares it (in ``OUT/run.json``)."""
    # the Pre-LN model: HF folder, .gguf, Hub name ORG/NAME[@REVISION], or "smollm2"
    source: str | None = setting(None, Text())
    # an already converted Mix-LN checkpoint; None: source converted into OUT/mixln
    converted: str | None = setting(None, Text())
    # what `train` runs (its --arm overrides it), one arm after the other on the same data: mixln (the
    # source converted), preln (the source itself, the control), lns (retrofitted to LayerNorm Scaling)
    arms: tuple[str, ...] = setting(DEFAULT_ARMS, ARM_NAMES)
    conversion: Conversion = field(default_factory=Conversion)
    heal: Heal = field(default_factory=Heal)
    data: Data = field(default_factory=Data)
    # the paper's (LLaMA-71M..1B); validation windows have it too
    seq_len: int = setting(SEQ_LEN, Window(opt_in="allow_longer_seq"))
    micro_batch_size: int = setting(4, BATCH)  # sequences per forward pass and process
    # sequences per optimizer step, all processes and accumulation together
    global_batch_size: int = setting(32, Count(1))
    max_tokens: int = setting(1_000_000, TOKENS)  # training budget; steps = max_tokens // (global_batch_size * seq_len)
    optim: Optim = field(default_factory=Optim)
    schedule: Schedule = field(default_factory=Schedule)
    grad_clip: float = setting(1.0, NONNEGATIVE)  # max global gradient norm; 0 disables clipping
    guard: Guard = field(default_factory=Guard)
    # recompute each block's activations in the backward instead of keeping them (one more forward
    # of the blocks per step, activations no longer growing with depth)
    activation_checkpointing: bool = setting(False, Flag())
    # shard weights, gradients and AdamW state over the processes (FSDP2; training/sharding.py)
    fsdp: bool = setting(False, Flag())
    # torch.compile each decoder block (GPU speed; the first steps pay the compilation)
    compile: bool = setting(False, Flag())
    precision: str = setting("auto", Choice(PRECISIONS))  # bf16 autocast on a GPU with fp32 master weights; fp32 on CPU
    # transformers' attention kernel: sdpa (flash/efficient on GPUs) or eager (plain matmuls)
    attention: str = setting("sdpa", Choice(ATTENTIONS))
    # accelerate's trackers each arm logs to (run name: the arm; config: the resolved recipe): tensorboard,
    # wandb, mlflow, or none (saved as []); null: tensorboard where installed, else none (resolved when loaded)
    trackers: tuple[str, ...] | None = setting(None, Names((*TRACKERS, NO_TRACKER), low=0, noun="tracker"))
    log_interval: int = setting(1, INTERVAL)
    eval_interval: int = setting(100, INTERVAL)
    checkpoint_interval: int = setting(500, INTERVAL)
    keep_checkpoints: int = setting(2, TOKENS_OR_ZERO)  # most recent checkpoints kept per arm; 0 keeps all
    grad_norm_interval: int = setting(10, INTERVAL)
    seed: int = setting(0, SEED)
    allow_longer_seq: bool = setting(False, Flag())  # true: seq_len may exceed the source's max_position_embeddings

    @property
    def steps(self) -> int:
        """Optimizer steps the token budget pays for (whole steps; the remainder is not trained)."""
        return self.max_tokens // (self.global_batch_size * self.seq_len)

    def to_dict(self) -> dict:
        """The nested mapping recipe.yaml holds (lists, not tuples: YAML's plain types)."""
        return _plain(dataclasses.asdict(self))

    def flat(self) -> dict:
        """{"dotted.key": value} of every key, as ``--set`` names them."""
        return _flatten(self.to_dict())

    def replace(self, changed_by: str = "the caller", **changes) -> "Recipe":
        """A copy with ``changes`` (top-level keys, each a value or a whole section:
        ``heal=dataclasses.replace(recipe.heal, tokens=0)``) applied, typed, resolved and checked like ``--set``
        items (``changed_by`` names them in an error)."""
        values, origin = self.flat(), {}
        _assign_all(values, origin, changes, changed_by)
        return _complete(values, origin, changed_by)  # it was valid before


def _plain(value):
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return [_plain(item) for item in value] if isinstance(value, (list, tuple)) else value


def _fields(cls=Recipe, prefix: str = "") -> dict:
    """{dotted key: (kind, default)} of every leaf of ``cls``: its declared settings."""
    found = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found.update(_fields(hints[f.name], f"{prefix}{f.name}."))
    found.update({f"{prefix}{name}": (declaration.kind, default_of(f))
                  for name, (f, declaration) in declared(cls).items()})
    return found


FIELDS = _fields()
PATH_KEYS = ("source", "converted", "data.train", "data.validation")  # strings or None, resolved to paths
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

    def construct_document(self, node):
        _refuse_duplicate_keys(node)
        return super().construct_document(node)


class DuplicateKey(ValueError):
    """A key given twice in one mapping of a recipe: YAML would keep the last silently."""


def _refuse_duplicate_keys(node, prefix: str = "") -> None:
    """Every mapping under ``node``, at any depth, holds each key once; else :class:`DuplicateKey`
    naming the dotted key and both lines."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, prefix)
    if not isinstance(node, yaml.MappingNode):
        return
    first_line = {}
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}" if isinstance(key_node, yaml.ScalarNode) else None
        if key is not None:
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise DuplicateKey(f"{shown(key)} is given twice (lines {first_line[key]} and {line}); YAML would "
                                   "keep the last silently: give it once")
            first_line[key] = line
        _refuse_duplicate_keys(value_node, f"{key}." if key is not None else prefix)


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


def _assign(values: dict, origin: dict, dotted: str, value, where: str) -> None:
    if dotted not in FIELDS:
        inside = [key for key in FIELDS if key.startswith(f"{dotted}.")]
        if inside:
            raise MixLNError(f"{where}: {dotted!r} is a section, not a key: set one of {', '.join(inside)}")
        raise MixLNError(f"{where}: unknown key {dotted!r}")
    values[dotted] = value
    origin[dotted] = where


def _assign_all(values: dict, origin: dict, changes: dict, where: str) -> None:
    """:func:`_assign` of each key of ``changes`` ({top-level key: a value, or a section's dataclass})."""
    tree = {key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            for key, value in changes.items()}
    for key, value in _flatten(_plain(tree)).items():
        _assign(values, origin, key, value, where)


def _typed(key: str, value, where: str):
    """``value`` read as the key's kind reads it (YAML reads 3e-4, no dot, as a string: numbers are
    read from strings too); None where the key's default is None."""
    kind, default = FIELDS[key]
    if value is None and default is None:
        return None
    try:
        return kind.read(value)
    except (ValueError, TypeError, OverflowError):
        raise MixLNError(f"{where}: {key}: must be {kind.describe()}, got {shown(repr(value))}") from None


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
        shipped = Path(where).parent == Path(str(RECIPES))  # a shipped recipe's path is a placeholder
        hint = f" (the shipped recipe's placeholder: {SET} {key}=PATH)" if shipped else ""
        raise MixLNError(f"{where}: {key}: {value} does not exist{hint}")
    return path


def _check(recipe: "Recipe", flat: dict, where: str, origin: dict) -> None:
    """``recipe`` (``flat``: its typed values by key): each key's range (its kind's), then what keys say of each
    other; a message names what set the key (``origin``: the file or a --set item), else ``where``, the recipe."""
    def need(ok: bool, message: str, key: str | None = None):
        if not ok:
            raise MixLNError(f"{origin.get(key, where)}: {message}")

    need(recipe.source is not None, f"source is required: {SET} source=PATH (a Pre-LN checkpoint folder, a .gguf, a "
                                    "Hub model ORG/NAME, or smollm2)")
    for key, (kind, default) in FIELDS.items():
        if not (flat[key] is None and default is None):
            try:
                kind.check(key, flat[key])
            except MixLNError as e:
                need(False, str(e), key)
    need(recipe.global_batch_size % recipe.micro_batch_size == 0, f"global_batch_size {recipe.global_batch_size} "
         f"is not a multiple of micro_batch_size {recipe.micro_batch_size}", "global_batch_size")
    step_tokens = recipe.global_batch_size * recipe.seq_len
    need(recipe.max_tokens >= step_tokens, f"max_tokens {recipe.max_tokens} is less than one optimizer step "
                                           f"(global_batch_size x seq_len = {step_tokens} tokens)", "max_tokens")
    try:
        recipe.heal.check_one_step(key_in("heal"))
    except MixLNError as e:
        need(False, f"{e}; 0 skips the heal", "heal.tokens")
    trackers = recipe.trackers or ()
    need(NO_TRACKER not in trackers or len(trackers) == 1,
         f"trackers: {NO_TRACKER} logs to no tracker, so it comes alone, got {list(trackers)!r}", "trackers")
    for name in (name for name in trackers if name != NO_TRACKER):
        need(_installed(name), f"trackers: {name} is not installed (pip install {TRACKERS[name][1]}), or set "
                               f"trackers: {NO_TRACKER}", "trackers")


def _installed(tracker: str) -> bool:
    """accelerate's own check that ``tracker`` (a key of TRACKERS) can log (accelerate, and torch, imported here)."""
    import accelerate.utils

    return getattr(accelerate.utils, TRACKERS[tracker][0])()


def _resolve_trackers(trackers: tuple[str, ...] | None) -> tuple[str, ...]:
    """The trackers a run logs to, once, when its recipe is loaded: null is tensorboard where installed."""
    if trackers is None:
        return ("tensorboard",) if _installed("tensorboard") else ()
    return tuple(name for name in trackers if name != NO_TRACKER)


def _build(cls, values: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _build(hints[f.name], values, f"{prefix}{f.name}.")
                  if dataclasses.is_dataclass(hints[f.name]) else values[f"{prefix}{f.name}"]
                  for f in dataclasses.fields(cls)})


def _complete(values: dict, origin: dict, where: str, reads_data: bool = True) -> Recipe:
    """The Recipe of the flat ``values`` (every key), typed, its paths resolved, checked (the text paths only
    where the caller ``reads_data``)."""
    typed = {}
    for key, value in values.items():
        at = origin.get(key, where)
        typed[key] = _typed(key, value, at)
        if key in PATH_KEYS and (reads_data or key in CHECKPOINT_KEYS):
            typed[key] = _resolve_path(key, typed[key], at)
    recipe = _build(Recipe, typed)
    _check(recipe, typed, where, origin)
    return dataclasses.replace(recipe, trackers=_resolve_trackers(recipe.trackers))


RECIPES = resources.files("mixln_convert") / "recipes"


def shipped_recipes(folder=RECIPES) -> dict[str, str]:
    """{name: the first sentence of its opening comment} of the shipped recipes (or, given their folder, accelerate
    configs): comment lines joined up to the one that ends a sentence, never past the "Sized for:" line."""
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            description = ""
            for line in entry.read_text().splitlines():
                part = line.lstrip("# ").strip()
                if not line.startswith("#") or not part or part.startswith("Sized for"):
                    break
                description = f"{description} {part}".strip()
                if description.endswith("."):
                    break
            found[entry.name.removesuffix(".yaml")] = description
    return found


def shipped_file(name: str) -> Path:
    """Path of a shipped recipe (``smollm2-135m-cpu``) or accelerate config (``fsdp`` or
    ``accelerate/fsdp``). Only listed names: a name is never a path (``../evaluation/tasks/x``
    would reach a package file that is neither)."""
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


def load_recipe(path, overrides=(), changes: dict | None = None, changed_by: str = "the caller",
                reads_data: bool = True) -> Recipe:
    """The fully resolved recipe of the YAML file ``path`` with ``overrides`` (the user's
    "dotted.key=value" items), then ``changes`` (:meth:`Recipe.replace`'s, typed and checked alike;
    ``changed_by`` names them in an error). Paths become absolute (``source: smollm2``: the cached
    SmolLM2 GGUF, fetched if missing; a Hub model name: its snapshot folder; a Hub dataset name stays
    a name, checked); any unknown key, wrong type, missing file or impossible budget raises a one-line
    MixLNError. ``reads_data`` False (``estimate``): data.train and data.validation are left as given, unchecked."""
    path = recipe_path(path)
    try:
        loaded = yaml.load(path.read_text(), Loader=_RecipeLoader) or {}
    except OSError as e:
        raise MixLNError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except UnicodeDecodeError:
        raise MixLNError(f"{path}: the recipe is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise MixLNError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    except DuplicateKey as e:
        raise MixLNError(f"{path}: {e}") from None
    if not isinstance(loaded, dict):
        raise MixLNError(f"{path}: a recipe must be a mapping of keys to values")
    values = {key: default for key, (_, default) in FIELDS.items()}
    origin = {}  # dotted key -> what set it (the file, or the --set item), for messages
    for key, value in _flatten(loaded).items():
        _assign(values, origin, str(key), value, str(path))
    given = {}  # key -> its --set value: a key set twice is refused, as in a recipe file
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise MixLNError(f"{SET} {item}: expected KEY=VALUE, e.g. {SET} optim.lr=3e-4")
        key = key.strip()
        if key in given:
            raise MixLNError(f"{SET} {shown(key)} is given twice ({shown(given[key])} and {shown(text)}): give it once")
        given[key] = text
        try:
            value = yaml.load(text, Loader=_RecipeLoader)
        except yaml.YAMLError:
            raise MixLNError(f"{SET} {item}: the value is not valid YAML") from None
        except DuplicateKey as e:
            raise MixLNError(f"{SET} {item}: {e}") from None
        _assign(values, origin, key, value, f"{SET} {item}")
    _assign_all(values, origin, changes or {}, changed_by)
    return _complete(values, origin, str(path), reads_data)
