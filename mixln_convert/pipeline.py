"""The pipeline, convert -> heal -> train -> analyze -> report, as ``train`` and the demo run it.
Each stage is the function its command runs; this module only chains them: :func:`train` (every
arm of a recipe on the same token stream) and :func:`run_demo` (every stage into one report).
"""

import logging
import os
from dataclasses import asdict
from pathlib import Path

import yaml

from .errors import MixLNError, warn
from .fetch import cache_dir
from .io.atomic import scratch_dir, write_atomic
from .io.loader import open_checkpoint
from .io.paths import check_destination, check_readable, checkpoint_path
from .io.runs import SUMMARY, Stages, claim_run, read_summary
from .limits import check_force_or_resume, check_one_step, check_seq_len, check_tokens
from .options import (ARMS, DEMO_LR, EVAL_DATA, HEAL_BATCH_SIZE, HEAL_SEQ_LEN, ConvertOptions, DemoOptions, arms_ok,
                      measured_on)
from .runtime import map_large_allocations
from .training.recipe import Recipe, load_recipe

log = logging.getLogger(__name__)  # the demo's progress: the CLI shows it, a library caller may silence it
DEMO_RECIPE = "smollm2-135m-cpu"  # shipped with the package
# the whole demo at its defaults on 2 idle cores, measured (docs/measurements.md, "The demo, as it ran here"):
# 12 min 38 s on a Zen 4 machine, 27 to 33 min on a Zen 1 one
DEMO_MINUTES = (13, 33)


def train(recipe: Recipe, out, arms=None, resume: bool = False, progress: bool = True) -> dict:
    """Train each arm of ``arms`` (default: the recipe's ``arms``) in turn into ``out``; returns
    {arm: summary}. With ``resume`` an interrupted run continues from each arm's last checkpoint
    (finished arms are kept as they are); the recipe must be the one the run started with."""
    map_large_allocations()
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    from .data import data_fingerprint, load_splits
    from .training.trainer import split_windows, train_arm

    out = Path(out).absolute()
    arms = recipe.arms if arms is None else arms
    if not arms_ok(arms):  # the recipe's are checked; an API caller's "mixln" would train five arms, m, i, x...
        raise MixLNError(f"arms: must list distinct arms of {', '.join(ARMS)}, got {arms!r}")
    # Accelerator reads `accelerate launch --cpu` (ACCELERATE_USE_CPU) itself; PartialState does not.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    accumulation = _accumulation(recipe, state.num_processes)
    if recipe.fsdp and state.num_processes < 2:
        raise MixLNError("fsdp: true shards over several processes, and this run has one; launch it with "
                         "accelerate launch --config_file \"$(mixln-convert recipes --path fsdp)\" (or torchrun)")
    source = open_checkpoint(recipe.source)
    check_seq_len("seq_len", recipe.seq_len, source.config, "allow_longer_seq: true", recipe.allow_longer_seq)
    if recipe.heal.tokens:
        check_seq_len("heal.seq_len", recipe.heal.seq_len, source.config, "allow_longer_seq: true",
                      recipe.allow_longer_seq)
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
        finished = {arm: _finished(out / arm / SUMMARY, arm) for arm in arms if stages.done(out / arm, SUMMARY)}
        with state.main_process_first():  # the main process tokenizes into the cache, the others read it
            splits = load_splits(recipe.data, source.tokenizer, train_tokens, progress)
        split_windows(recipe, splits)
        state.wait_for_everyone()  # every process has checked before the main one writes
        if state.is_main_process:
            claim.start()
            if not (out / "recipe.yaml").is_file():  # the resolved recipe, for a user to read or rerun
                write_atomic(out / "recipe.yaml", yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        sources = {arm: prepare(recipe, arm, out / arm, splits, progress) for arm in arms if arm not in finished}
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


def prepare(recipe: Recipe, arm: str, folder: Path, splits, progress: bool) -> str:
    """The checkpoint an arm trains from: the source (Pre-LN); the source converted exactly into
    ``folder/converted`` (LNS); the recipe's converted model, else the source converted into ``folder/converted``
    and, with ``heal.tokens``, healed into ``folder/healed`` on the run's own training stream (Mix-LN). From
    scratch (``conversion.strategy: scratch``) every arm is initialized by the same seeded plan (Pre-LN into
    ``folder/initialized`` at alpha 0, LNS with its gains at 1): every tensor the layouts share starts equal,
    so a gap between the arms is the layout's, not the initialization's."""
    from accelerate import PartialState

    from .conversion.converter import convert
    from .healing import heal
    from .training.trainer import mixed_precision

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
            heal(converted, recipe.source, healed, data=splits.train, perplexity=False, seed=recipe.seed,
                 progress=progress, seq_len_flag="heal.seq_len",
                 dtype="bf16" if mixed_precision(recipe.precision) == "bf16" else "fp32", **asdict(recipe.heal))
    return str(healed)


def convert_and_heal(src, dst, options: ConvertOptions | None = None, *, heal_tokens: int, heal_data=None,
                     force: bool = False, progress: bool = True, **settings) -> dict:
    """One command from a pretrained model to a usable Mix-LN one: ``src`` converted (``options`` or
    ``settings``, as :func:`~mixln_convert.conversion.converter.convert` takes them) into a temporary
    folder beside ``dst``, then healed on ``heal_tokens`` tokens into ``dst``; returns heal's result."""
    from .conversion.converter import convert
    from .conversion.layout import post_ln_count
    from .data import read_texts, token_stream, windows
    from .healing import heal

    options = ConvertOptions.given(options, settings)
    src = checkpoint_path(src, "SRC")
    check_readable(heal_data, "--heal-data")
    layers = open_checkpoint(src).config["num_hidden_layers"]
    if options.lns or post_ln_count(layers, options.alpha, options.post_ln_layers) == 0:
        # a heal trains the Post-LN blocks: said before converting
        given = ("--layout lns" if options.lns else f"--post-ln-layers {options.post_ln_layers}"
                 if options.post_ln_layers is not None else f"--alpha {options.alpha:g}" if options.alpha is not None
                 else "the default --alpha")
        raise MixLNError(f"--heal-tokens: {given} makes no block Post-LN (of {layers}), so there is nothing to "
                         "heal; convert without --heal-tokens, or make some blocks Post-LN")
    check_tokens("--heal-tokens", heal_tokens)
    check_one_step(heal_tokens, HEAL_BATCH_SIZE, HEAL_SEQ_LEN, "--heal-tokens", None, "one heal step")
    target = check_destination(dst, {"SRC": src, "--heal-data": heal_data}, force)
    # the heal's text is read and tokenized (into the cache heal reads it from) before the long conversion
    what = str(heal_data) if heal_data else "embedded:train"
    windows(token_stream(open_checkpoint(src).tokenizer, read_texts(heal_data, split="train"), heal_tokens, what),
            HEAL_SEQ_LEN, what, flag=None)
    with scratch_dir(target) as work:  # a kill leaves it to the next run to DST, like any temporary
        converted = convert(src, work / "converted", options, progress=progress)
        return heal(converted, src, dst, data=heal_data, tokens=heal_tokens, force=force, progress=progress,
                    seq_len_flag=None)


def _accumulation(recipe: Recipe, processes: int) -> int:
    per_pass = recipe.micro_batch_size * processes
    if recipe.global_batch_size % per_pass:
        raise MixLNError(f"global_batch_size {recipe.global_batch_size} is not a multiple of micro_batch_size x "
                         f"processes = {recipe.micro_batch_size} x {processes}")
    return recipe.global_batch_size // per_pass


def _finished(file: Path, arm: str) -> dict:
    """The summary (``file``) of an arm finished before the interruption."""
    try:
        summary = read_summary(file)
        if summary["arm"] != arm:
            raise MixLNError(f"{file}: arm is {summary['arm']!r}, not {arm!r}")
    except MixLNError as e:
        raise MixLNError(f"{e}; remove it to train the {arm} arm again") from None
    return summary


def run_demo(out, options: DemoOptions | None = None, *, force: bool = False, resume: bool = False,
             **settings) -> dict:
    """Every stage on ``options.source`` (default: SmolLM2-135M-Instruct) into ``out`` with the CPU
    recipe at lr ``DEMO_LR``: convert, heal (``heal_tokens``; 0 skips it), train both arms, analyze each
    stage, compare; returns the comparison. ``options``: a :class:`~mixln_convert.options.DemoOptions`, or
    its fields as ``settings``. ``resume`` keeps what an earlier run with the same settings finished;
    ``force`` starts afresh."""
    options = DemoOptions.given(options, settings)
    check_force_or_resume(force, resume)
    check_launch()
    source, recipe, settings = _demo_plan(options)
    with claim_run(out, "demo", settings, {"the model cache": cache_dir(), "--source": source}, resume,
                   force) as claim:
        claim.start()
        log.info(_expected(options))
        return _demo(claim.path, options, recipe, resume)


def _demo(out: Path, options: DemoOptions, recipe: Recipe, resume: bool) -> dict:
    """The demo's stages into ``out``, claimed for it."""
    from .analysis.analyze import analyze
    from .report import compare

    heal_tokens, eval_tokens = options.heal_tokens, options.eval_tokens
    # training validation and every analysis score the same windows, so their perplexities agree
    # as the results record it: the tokens scored, seq_len - 1 of each window
    scored = eval_tokens // recipe.seq_len * (recipe.seq_len - 1)
    where = measured_on({"data": EVAL_DATA, "tokens": scored, "seq_len": recipe.seq_len})
    log.info(f"[1/4] source model: {recipe.source}")
    healing = f"heal ({heal_tokens:,} tokens) + " if heal_tokens else ""
    log.info(f"[2/4] convert + {healing}recovery training of both arms ({recipe.max_tokens:,} tokens each) "
             f"-> {out / 'train'}")
    stages = Stages(resume)
    # training resumes within an arm itself: the stage works in its folder
    summaries = stages.run("train", out / "train", lambda folder: train(recipe, folder, resume=True), atomic=False)
    for summary in summaries.values():
        log.info(f"      {summary['arm']}: validation perplexity {summary['initial_val_ppl']:.2f} -> "
                 f"{summary['final_val_ppl']:.2f} ({where})")
    log.info(f"      (conversion, heal and training{_took(stages, 'train') or ': finished by an earlier run'})")
    checkpoints = {
        "original": recipe.source,
        "converted": out / "train" / "mixln" / "converted",
        **({"healed": out / "train" / "mixln" / "healed"} if heal_tokens else {}),
        "mixln-trained": out / "train" / "mixln" / "final",
        "preln-trained": out / "train" / "preln" / "final",
    }
    # the intermediate stages are judged by perplexity and what they write; the layer sweep (most of an
    # analysis's time) compares the original with the trained arms
    swept = ("original", "mixln-trained", "preln-trained")
    log.info(f"[3/4] analysis of {', '.join(checkpoints)} ({where}; the layer sweep of {', '.join(swept)})")
    for name, ckpt in checkpoints.items():
        result = stages.run(name, out / "analysis" / name, lambda folder, ckpt=ckpt, sweep=name in swept: analyze(
            ckpt, folder, seq_len=recipe.seq_len, max_tokens=eval_tokens, layer_sweep=sweep,
            prune_curve=options.prune_curve and sweep, generate=True, force=True))
        took = _took(stages, name)
        log.info(f"      {name}: perplexity {result['perplexity']:.2f}; greedy continuations repeat "
                 f"{result['generation']['repeated_4gram_share']:.1%} of their 4-grams"
                 f"{f' (analysis{took})' if took else ''}")
    log.info(f"[4/4] report -> {out / 'report'}")
    return compare([out / "analysis" / name for name in checkpoints] + [out / "train"], out / "report",
                   labels=list(checkpoints) + ["train"], force=True)


def _demo_plan(options: DemoOptions) -> tuple[str | None, Recipe, dict]:
    """Every check of the demo's inputs before any work: (``--source`` resolved, the CPU recipe with the
    demo's settings, the settings a --resume must find unchanged)."""
    source = options.source and str(Path(checkpoint_path(options.source, "--source")).absolute())
    settings = {"--source": source, "--alpha": options.alpha, "--heal-tokens": options.heal_tokens,
                "--train-tokens": options.train_tokens, "--eval-tokens": options.eval_tokens,
                "--prune-curve": options.prune_curve, "optim.lr": DEMO_LR}  # the lr: a demo before it was the recipe's
    changes = {"conversion.alpha": options.alpha, "heal.tokens": options.heal_tokens,
               "max_tokens": options.train_tokens, "optim.lr": DEMO_LR,
               "eval_interval": max(1, options.train_tokens // 1024), "data.eval_tokens": options.eval_tokens,
               **({"source": source} if source else {})}
    recipe = load_recipe(DEMO_RECIPE, changes=changes, changed_by="demo")
    open_checkpoint(recipe.source)  # a bad --source is refused before --force empties out (opened once: cached)
    return source, recipe, settings


def _expected(options: DemoOptions) -> str:
    """What the demo is expected to take, said at its start: the measured range, and whether it applies."""
    low, high = DEMO_MINUTES
    said = f"expected: {low} to {high} min on 2 idle CPU cores at the defaults (SmolLM2-135M; measured)"
    changed = [name for name in ("source", "heal_tokens", "train_tokens", "eval_tokens", "prune_curve")
               if getattr(options, name) != getattr(DemoOptions, name)]
    if changed:
        said += f"; this run changes {', '.join(changed)}, so it may take more or less"
    return said + "; more cores are faster, and a resumed run skips what is done"


def _took(stages: Stages, name: str) -> str:
    """How long a stage of this run took ("" for one an earlier run finished)."""
    seconds = stages.times.get(name)
    return "" if seconds is None else f": {int(seconds // 60)} min {seconds % 60:.0f} s"
