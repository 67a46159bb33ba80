"""``demo``: every stage on SmolLM2-135M (or ``--source``) into one folder and one report, with the CPU
recipe: convert, heal, both arms trained, every stage analyzed, compared.
"""

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..analysis.result import Analysis
from ..evaluation.options import EVAL_DATA, Measured, measured_on
from ..fetch import cache_dir
from ..io.loader import open_checkpoint
from ..io.paths import checkpoint_path
from ..options import check_force_or_resume
from ..schema import ByName, Nested
from ..training.recipe import Recipe, load_recipe
from ..training.summary import TrainSummary
from .options import CPU_RECIPE, CPU_STEP_TOKENS, DemoOptions
from .runs import Stages, claim_run
from .train import check_launch, train

if TYPE_CHECKING:  # the report imports matplotlib, which the demo needs only at its end
    from ..report.compare import Comparison

log = logging.getLogger(__name__)  # the demo's progress: the CLI shows it, a library caller may silence it
# the whole demo at its defaults on 2 idle cores, measured (docs/measurements.md, "The demo, as it ran here"):
# 12 min 38 s on a Zen 4 machine, 27 to 33 min on a Zen 1 one
DEMO_MINUTES = (13, 33)


def run_demo(out, options: DemoOptions | None = None, *, force: bool = False, resume: bool = False,
             **settings) -> "Comparison":
    """Every stage on ``options.source`` (default: SmolLM2-135M-Instruct) into ``out`` with the CPU
    recipe (at its lr): convert, heal (``heal_tokens``; 0 skips it), train both arms, analyze each
    stage, compare; returns the comparison. ``options``: a :class:`~mixln_convert.workflows.options.DemoOptions`, or
    its fields as ``settings``. ``resume`` keeps what an earlier run with the same settings finished;
    ``force`` starts afresh."""
    options = DemoOptions.given(options, settings)
    check_force_or_resume(force, resume)
    check_launch()
    source, recipe, settings = _demo_plan(options)
    with claim_run(out, "demo", settings, {"the model cache": cache_dir(), options.flag("source"): source}, resume,
                   force) as claim:
        claim.start()
        log.info(_expected(options))
        return _demo(claim.path, options, recipe, resume)


def _demo(out: Path, options: DemoOptions, recipe: Recipe, resume: bool) -> "Comparison":
    """The demo's stages into ``out``, claimed for it."""
    from ..analysis.analyze import analyze
    from ..report import compare

    heal_tokens, eval_tokens = options.heal_tokens, options.eval_tokens
    # training validation and every analysis score the same windows, so their perplexities agree
    # as the results record it: the tokens scored, seq_len - 1 of each window
    scored = eval_tokens // recipe.seq_len * (recipe.seq_len - 1)
    where = measured_on(Measured(data=EVAL_DATA, tokens=scored, seq_len=recipe.seq_len))
    log.info(f"[1/4] source model: {recipe.source}")
    healing = f"heal ({heal_tokens:,} tokens) + " if heal_tokens else ""
    log.info(f"[2/4] convert + {healing}recovery training of both arms ({recipe.max_tokens:,} tokens each) "
             f"-> {out / 'train'}")
    stages = Stages(resume)
    # training resumes within an arm itself: the stage works in its folder
    summaries = stages.record(ByName(Nested(TrainSummary, TrainSummary.WHAT)), "train", out / "train",
                              lambda folder: train(recipe, folder, resume=True), atomic=False)
    for summary in summaries.values():
        log.info(f"      {summary.arm}: validation perplexity {summary.initial_val_ppl:.2f} -> "
                 f"{summary.final_val_ppl:.2f} ({where})")
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
        result = stages.record(Nested(Analysis, Analysis.WHAT), name, out / "analysis" / name,
                               lambda folder, ckpt=ckpt, sweep=name in swept: analyze(
                                   ckpt, folder, seq_len=recipe.seq_len, max_tokens=eval_tokens, layer_sweep=sweep,
                                   prune_curve=options.prune_curve and sweep, generate=True, force=True))
        took = _took(stages, name)
        log.info(f"      {name}: perplexity {result.perplexity:.2f}; greedy continuations repeat "
                 f"{result.generation.repeated_4gram_share:.1%} of their 4-grams"
                 f"{f' (analysis{took})' if took else ''}")
    log.info(f"[4/4] report -> {out / 'report'}")
    return compare([out / "analysis" / name for name in checkpoints] + [out / "train"], out / "report",
                   labels=list(checkpoints) + ["train"], force=True)


def _demo_plan(options: DemoOptions) -> tuple[str | None, Recipe, dict]:
    """Every check of the demo's inputs before any work: (``--source`` resolved, the CPU recipe with the
    demo's settings, the settings a --resume must find unchanged)."""
    source = options.source and str(Path(checkpoint_path(options.source, options.flag("source"))).absolute())
    recipe = load_recipe(CPU_RECIPE, changes={"source": source} if source else None, changed_by="demo")
    recipe = recipe.replace("demo", conversion=replace(recipe.conversion, alpha=options.alpha),
                            max_tokens=options.train_tokens, data=replace(recipe.data, eval_tokens=options.eval_tokens),
                            eval_interval=max(1, options.train_tokens // CPU_STEP_TOKENS))
    # the heal budget is checked here, once, against the recipe's heal step, naming the demo's flag
    recipe = recipe.replace(options.flag("heal_tokens"), heal=replace(recipe.heal, tokens=options.heal_tokens))
    settings = {options.flag("source"): source,
                **options.flagged("alpha", "heal_tokens", "train_tokens", "eval_tokens", "prune_curve"),
                "optim.lr": recipe.optim.lr}  # the lr: a demo before it was the recipe's
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
