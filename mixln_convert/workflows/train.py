"""``train``: every arm of a recipe on the same token stream, each prepared (converted, healed) first;
and ``convert --heal-tokens``: a conversion healed in one command. Each stage is the function its command
runs; this module chains them.
"""

import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..conversion.options import ConvertHealOptions, ConvertOptions
from ..errors import MixLNError, warn
from ..io.atomic import scratch_dir, write_atomic
from ..io.lineage import history
from ..io.loader import open_checkpoint
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..runtime import map_large_allocations
from ..schema import check_windows, key_in
from ..training.options import ARM_NAMES
from ..training.recipe import Recipe
from ..training.summary import TrainSummary
from .runs import Stages, claim_run

if TYPE_CHECKING:  # heal's module imports torch; this one is imported before a command needs it
    from ..healing.result import HealResult


def train(recipe: Recipe, out, arms=None, resume: bool = False, progress: bool = True) -> dict[str, TrainSummary]:
    """Train each arm of ``arms`` (default: the recipe's ``arms``) in turn into ``out``; returns
    {arm: summary}. With ``resume`` an interrupted run continues from each arm's last checkpoint
    (finished arms are kept as they are); the recipe must be the one the run started with."""
    map_large_allocations()
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    from ..data import data_fingerprint, load_splits
    from ..training.memory import check_heal_fits
    from ..training.trainer import split_windows, train_arm

    out = Path(out).absolute()
    arms = recipe.arms if arms is None else arms
    ARM_NAMES.check("arms", arms)  # the recipe's are checked; an API caller's "mixln" would train five arms, m, i, x...
    # Accelerator reads `accelerate launch --cpu` (ACCELERATE_USE_CPU) itself; PartialState does not.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    per_pass = recipe.micro_batch_size * state.num_processes
    if recipe.global_batch_size % per_pass:
        raise MixLNError(f"global_batch_size {recipe.global_batch_size} is not a multiple of micro_batch_size x "
                         f"processes = {recipe.micro_batch_size} x {state.num_processes}")
    accumulation = recipe.global_batch_size // per_pass
    if recipe.fsdp and state.num_processes < 2:
        raise MixLNError("fsdp: true shards over several processes, and this run has one; launch it with "
                         "accelerate launch --config_file \"$(mixln-convert recipes --path fsdp)\" (or torchrun)")
    source = open_checkpoint(recipe.source)
    history(source.config, where=source.where)  # the records the arms' cards carry on, checked before any work
    check_windows(recipe, source.config)  # seq_len; the heal's below, which the heal then checks no more
    if recipe.heal.tokens and "mixln" in arms:
        check_windows(recipe.heal, source.config, key_in("heal"))
        # a heal every process shares (its batch in equal parts) and that fits them, before any weight is loaded
        check_heal_fits(recipe.replace(arms=list(arms)), state.num_processes)
    warmup = recipe.schedule.warmup_steps
    if warmup > recipe.steps and state.is_main_process:  # legal, but a huge one trains at lr ~0 and changes nothing
        warn(f"schedule.warmup_steps {warmup} is more than the run's {recipe.steps} steps: the learning rate "
             f"peaks at {recipe.steps / warmup:.3g} x optim.lr, at the last step")
    check_launch()
    settings = {**recipe.flat(), **{f"data {file}": digest for file, digest in data_fingerprint(
        recipe.data.train, recipe.data.validation).items()}}  # what --resume must find unchanged
    inputs = {"source": recipe.source, "converted": recipe.converted, "data.train": recipe.data.train,
              "data.validation": recipe.data.validation}
    # the main process holds the folder; a refusal before the first training step leaves it as it was
    with claim_run(out, "training run", settings, inputs, resume, force_hint=False,
                   held=state.is_main_process) as claim:
        train_tokens = max(recipe.steps * recipe.global_batch_size * recipe.seq_len, recipe.heal.tokens)
        stages = Stages(resume)  # an arm is a stage; its summary.json, written last, says it is done
        finished = {arm: _finished(out / arm / TrainSummary.FILE, arm) for arm in arms
                    if resume and (out / arm / TrainSummary.FILE).is_file()}
        with state.main_process_first():  # the main process tokenizes into the cache, the others read it
            splits = load_splits(recipe.data, source.tokenizer, train_tokens, progress)
        split_windows(recipe, splits)
        state.wait_for_everyone()  # every process has checked before the main one writes
        if state.is_main_process:
            claim.start()
            if not (out / "recipe.yaml").is_file():  # the resolved recipe, for a user to read or rerun
                write_atomic(out / "recipe.yaml", yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        sources = {arm: prepare(recipe, arm, out / arm, splits, resume, progress) for arm in arms
                   if arm not in finished}
        claim.working()
        summaries = {arm: finished.get(arm) or stages.run(arm, out / arm, lambda folder, arm=arm: train_arm(
            recipe, arm, folder, sources[arm], splits, source.tokenizer, accumulation, resume, progress),
            atomic=False, checked=False) for arm in arms}
    state.destroy_process_group()
    return summaries


def check_launch() -> None:
    """How the process was launched, refused before a run claims its folder where the trainer cannot train:
    accelerate's own FSDP (the trainer shards the model itself)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true"):
        raise MixLNError("the accelerate config asks for FSDP (distributed_type: FSDP); the trainer shards the model "
                         "itself: launch with the multi-GPU config (mixln-convert recipes --path fsdp) and the "
                         "recipe key fsdp: true")


def prepare(recipe: Recipe, arm: str, folder: Path, splits, resume: bool, progress: bool) -> str:
    """The checkpoint an arm trains from: the source (Pre-LN); the source converted exactly into
    ``folder/converted`` (LNS); the recipe's converted model, else the source converted into ``folder/converted``
    and, with ``heal.tokens``, healed into ``folder/healed`` on the run's own training stream by every process of
    the run (Mix-LN; with ``resume`` a heal a kill interrupted continues from its last checkpoint). From
    scratch (``conversion.strategy: scratch``) every arm is initialized by the same seeded plan (Pre-LN into
    ``folder/initialized`` at alpha 0, LNS with its gains at 1): every tensor the layouts share starts equal,
    so a gap between the arms is the layout's, not the initialization's."""
    from accelerate import PartialState

    from ..conversion.converter import convert
    from ..healing import heal
    from ..training.trainer import mixed_precision

    conversion = recipe.conversion
    from_scratch = conversion.strategy == "scratch"
    if arm == "preln" and not from_scratch:
        return recipe.source
    if arm == "lns":  # convert()'s default strategy is the exact retrofit for this layout
        converted = folder / "converted"
        layout = {"layout": "lns", "strategy": "scratch" if from_scratch else "calibrated"}
    else:
        converted = folder / "initialized" if arm == "preln" else recipe.converted or folder / "converted"
        layout = {"alpha": 0.0 if arm == "preln" else conversion.alpha, "strategy": conversion.strategy}
    with PartialState().main_process_first():  # the main process converts, the others then find the folder
        if not (Path(converted) / "config.json").is_file():
            convert(recipe.source, converted, **layout, scaled_init=conversion.scaled_init, seed=recipe.seed,
                    progress=progress)
    if arm != "mixln" or not recipe.heal.tokens:
        return str(converted)
    healed = folder / "healed"
    if not (healed / "config.json").is_file():
        heal(converted, recipe.source, healed, data=splits.train, perplexity=False, seed=recipe.seed, resume=resume,
             fsdp=recipe.fsdp, progress=progress, named=key_in("heal"), checked=True,
             dtype="bf16" if mixed_precision(recipe.precision) == "bf16" else "fp32", **asdict(recipe.heal))
    return str(healed)


def convert_and_heal(src, dst, options: ConvertOptions | None = None, healing: ConvertHealOptions | None = None, *,
                     force: bool = False, progress: bool = True, **settings) -> "HealResult":
    """One command from a pretrained model to a usable Mix-LN one: ``src`` converted (``options``, as
    :func:`~mixln_convert.conversion.converter.convert` takes them) into a temporary folder beside ``dst``,
    then healed as ``healing`` says (its ``heal_tokens`` and ``heal_data``) into ``dst``; ``settings``: the
    fields of either; returns heal's result."""
    from ..conversion.converter import convert
    from ..conversion.layout import post_ln_count
    from ..data import read_texts, token_stream, windows
    from ..healing import heal

    healing = ConvertHealOptions.given(healing, {key: settings.pop(key) for key in ("heal_tokens", "heal_data")
                                                 if key in settings})
    options = ConvertOptions.given(options, settings)
    tokens_flag, data_flag = healing.flag("heal_tokens"), healing.flag("heal_data")
    if not healing.heal_tokens:
        raise MixLNError(f"{tokens_flag}: a heal in the same run needs a budget of at least one heal step")
    heal_data = healing.heal_data
    src = checkpoint_path(src, "SRC")
    check_readable(heal_data, data_flag)
    config = open_checkpoint(src).config
    healing.check_model(config)
    layers = config["num_hidden_layers"]
    if options.lns or post_ln_count(layers, options.resolved_alpha, options.post_ln_layers) == 0:
        # a heal trains the Post-LN blocks: said before converting
        alpha = options.flag("alpha")
        given = (f"{options.flag('layout')} lns" if options.lns else f"{options.flag('post_ln_layers')} "
                 f"{options.post_ln_layers}" if options.post_ln_layers is not None else f"{alpha} {options.alpha:g}"
                 if options.alpha is not None else f"the default {alpha}")
        raise MixLNError(f"{tokens_flag}: {given} makes no block Post-LN (of {layers}), so there is nothing to "
                         f"heal; convert without {tokens_flag}, or make some blocks Post-LN")
    target = check_destination(dst, {"SRC": src, data_flag: heal_data}, force)
    # the heal's text is read and tokenized (into the cache heal reads it from) before the long conversion
    what = str(heal_data) if heal_data else "embedded:train"
    windows(token_stream(open_checkpoint(src).tokenizer, read_texts(heal_data, split="train"), healing.heal_tokens,
                         what), healing.heal.seq_len, what, flag=None)
    with scratch_dir(target) as work:  # a kill leaves it to the next run to DST, like any temporary
        converted = convert(src, work / "converted", options, progress=progress)
        return heal(converted, src, dst, data=heal_data, force=force, progress=progress, named=None, checked=True,
                    **asdict(healing.heal))


def _finished(file: Path, arm: str) -> TrainSummary:
    """The summary (``file``) of an arm finished before the interruption."""
    try:
        summary = TrainSummary.read(file)
        if summary.arm != arm:
            raise MixLNError(f"{file}: arm is {summary.arm!r}, not {arm!r}")
    except MixLNError as e:
        raise MixLNError(f"{e}; remove it to train the {arm} arm again") from None
    return summary
