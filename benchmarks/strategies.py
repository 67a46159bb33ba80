"""Perplexity of SmolLM2-135M-Instruct before and after each conversion strategy (no training).

    python benchmarks/strategies.py [--alpha 0.25] [--data PATH] [--windows 16] [--seq-len 512]

Evaluates the original GGUF and a conversion per strategy on the same held-out tokens (default:
the embedded validation split, which never overlaps the calibration split) and prints a
Markdown table with the ratio to the original, the figures quoted in the README.
"""

import argparse
import tempfile
import time
from pathlib import Path

from mixln_convert import convert, evaluate_perplexity, load_model, load_tokenizer
from mixln_convert.data import read_texts, token_windows
from mixln_convert.fetch import smollm2_gguf


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--data", default=None, help="held-out text (default: embedded validation split)")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--strategies", default="calibrated,move,reinit-post,scratch")
    args = parser.parse_args()

    gguf = smollm2_gguf()
    windows = token_windows(load_tokenizer(gguf), read_texts(args.data, split="validation"), args.seq_len,
                            args.windows * args.seq_len)
    rows = [("none (original Pre-LN)", evaluate_perplexity(load_model(gguf), windows)["perplexity"], 0.0)]
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies.split(","):
            started = time.time()
            out = convert(gguf, Path(tmp) / strategy, alpha=args.alpha, strategy=strategy)
            seconds = time.time() - started
            rows.append((strategy, evaluate_perplexity(load_model(out), windows)["perplexity"], seconds))
    base = rows[0][1]
    print(f"\nSmolLM2-135M-Instruct, alpha {args.alpha}, {windows.numel()} held-out tokens "
          f"({args.data or 'embedded validation split'})\n")
    print("| conversion | perplexity | x original | convert time (s) |\n| --- | --- | --- | --- |")
    for name, ppl, seconds in rows:
        print(f"| {name} | {ppl:,.2f} | {ppl / base:.2f}x | {seconds:.0f} |")


if __name__ == "__main__":
    main()
