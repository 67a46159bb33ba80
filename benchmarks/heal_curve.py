"""Held-out perplexity of SmolLM2-135M-Instruct converted to Mix-LN, as healing goes on.

    python benchmarks/heal_curve.py [--alpha 0.25] [--tokens 1048576] [--checkpoints 65536,131072,...]
                                    [--lr 1e-4] [--loss residual] [--eval-tokens 8192]

Converts the GGUF (calibrated strategy), heals the Post-LN blocks against the original in one run
of ``--tokens`` tokens (one warmup + cosine schedule), measures the held-out perplexity (embedded
validation split) at each checkpoint, and prints a Markdown table: perplexity, ratio to the
original's, residual relative error and wall time. Checkpoints before the end are taken at a
learning rate not yet annealed, so they understate what a run of that budget reaches.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from mixln_convert import convert
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.healing import heal


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--checkpoints", default=None,
                        help="token counts to evaluate at, comma-separated (default: 64k, 128k, ... doubling)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--loss", default="residual")
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument("--model", default=None, help="Pre-LN source (default: the SmolLM2 GGUF)")
    args = parser.parse_args()
    checkpoints = ([int(t) for t in args.checkpoints.split(",")] if args.checkpoints else
                   [1 << p for p in range(16, args.tokens.bit_length()) if 1 << p < args.tokens])

    source = args.model or smollm2_gguf()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        converted = convert(source, Path(tmp) / "converted", alpha=args.alpha, strategy="calibrated")
        convert_seconds = time.time() - started
        result = heal(converted, source, Path(tmp) / "healed", tokens=args.tokens, seq_len=args.seq_len,
                      batch_size=args.batch_size, lr=args.lr, loss=args.loss, eval_tokens=args.eval_tokens,
                      eval_at=checkpoints)
        rows = [json.loads(line) for line in (Path(tmp) / "healed" / "heal_metrics.jsonl").read_text().splitlines()]
    teacher = result["perplexity"]["teacher"]
    print(f"\n{Path(source).name}, alpha {args.alpha} ({result['post_ln_layers']} Post-LN blocks), loss {args.loss}, "
          f"lr {args.lr}, {args.batch_size} x {args.seq_len} tokens a step; held-out: {args.eval_tokens} tokens of "
          f"the embedded validation split; original perplexity {teacher:.3f}; conversion {convert_seconds:.0f} s, "
          f"heal {result['seconds']:.0f} s\n")
    print("| tokens | perplexity | x original | residual relative error | heal wall time (s) |")
    print("| --- | --- | --- | --- | --- |")
    for row in (r for r in rows if "val_ppl" in r):
        print(f"| {row['tokens']:,} | {row['val_ppl']:.3f} | {row['val_ppl'] / teacher:.3f}x | "
              f"{row['val_relative_error']:.4f} | {row.get('seconds', 0):.0f} |")


if __name__ == "__main__":
    main()
