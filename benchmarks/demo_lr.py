"""What the demo's training lr does to each arm: validation perplexity and the greedy
continuations' repeated-4-gram share after the demo's 8 steps, one lr (and Post-LN lr scale) per run.

Each run is the demo's training of one arm but for the lr: the Mix-LN arm starts from the healed
model a finished demo left (DEMO/train/mixln/healed, copied in so that no heal runs), the Pre-LN arm
from the original; the recipe is the demo's (smollm2-135m-cpu, its heal budget, which sizes the
token pool the batches are drawn from, 8 steps of 4 x 256 tokens, validation on 2,048 tokens), so
the demo's own lr reproduces the demo's figures.

    python benchmarks/demo_lr.py mixln-demo 1e-4:mixln 3e-5:mixln 1e-5:mixln 1e-4:mixln:0.01 3e-5:preln
"""

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
import yaml

from mixln_convert.evaluation.generation import greedy_continuations
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.options import DEMO_EVAL_TOKENS, DEMO_HEAL_TOKENS, DEMO_TRAIN_TOKENS
from mixln_convert.workflows.demo import DEMO_RECIPE
from mixln_convert.workflows.train import train
from mixln_convert.training.recipe import load_recipe


def measure(demo: str, lr: float, arm: str, post_ln_lr_scale: float) -> str:
    changes = {"heal.tokens": DEMO_HEAL_TOKENS, "max_tokens": DEMO_TRAIN_TOKENS,
               "eval_interval": DEMO_TRAIN_TOKENS // 1024, "data.eval_tokens": DEMO_EVAL_TOKENS, "optim.lr": lr,
               "optim.post_ln_lr_scale": post_ln_lr_scale}
    recipe = load_recipe(DEMO_RECIPE, changes=changes, changed_by="benchmarks/demo_lr.py")
    with tempfile.TemporaryDirectory() as out:
        if arm == "mixln":  # a resumed run: what it finds converted and healed it does not make again
            for stage in ("converted", "healed"):
                shutil.copytree(f"{demo}/train/mixln/{stage}", f"{out}/mixln/{stage}")
            (Path(out) / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        summary = train(recipe, out, arms=(arm,), resume=arm == "mixln", progress=False)[arm]
        final = open_checkpoint(f"{out}/{arm}/final")
        written = greedy_continuations(final.model(dtype=torch.float32, device="cpu"), final.tokenizer, progress=False)
    return (f"| {arm} | {lr:g} | {post_ln_lr_scale:g} | {summary['initial_val_ppl']:.2f} -> "
            f"{summary['final_val_ppl']:.2f} | {written['repeated_4gram_share']:.1%} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", help="a finished demo's folder (its healed model is the Mix-LN start)")
    parser.add_argument("runs", nargs="+", metavar="LR:ARM[:POST_LN_LR_SCALE]")
    args = parser.parse_args()
    print("| arm | lr | Post-LN lr scale | validation perplexity | repeated 4-grams |\n| --- | --- | --- | --- | --- |")
    for run in args.runs:
        lr, arm, *scale = run.split(":")
        print(measure(args.demo, float(lr), arm, float(scale[0]) if scale else 0.25), flush=True)


if __name__ == "__main__":
    main()
