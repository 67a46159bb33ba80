"""Cost of a sweep's conversions against one conversion at its largest alpha, side by side in one
process on warm caches (the source opened, dequantized and tokenized once before either is timed):

- single: ``convert(src, alpha=max)``, which calibrates the first floor(max * L) blocks and writes;
- sweep: ``calibration_statistics`` once for that many blocks, then ``convert(..., statistics=...)``
  for every alpha with a Post-LN block (what ``mixln-convert sweep`` does before healing,
  training and analysis; alpha 0 is the original model, which the sweep measures as such).

Each is timed ``--repeats`` times, alternating, the fastest counted; the ratio is the figure.

    python benchmarks/sweep_cost.py [SRC] [--alphas 0,0.0625,0.125,0.25,0.5]
"""

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from mixln_convert.conversion.converter import calibration_statistics, convert
from mixln_convert.conversion.layout import post_ln_count
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.options import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS, parse_alphas


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", help="HF folder or .gguf (default: SmolLM2-135M GGUF)")
    parser.add_argument("--alphas", default="0,0.0625,0.125,0.25,0.5")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.src is None:
        from mixln_convert.fetch import smollm2_gguf

        args.src = str(smollm2_gguf())
    alphas = parse_alphas(args.alphas)
    source = open_checkpoint(args.src)
    num_layers = source.config["num_hidden_layers"]
    largest = max(post_ln_count(num_layers, a, None) for a in alphas)
    work = Path(tempfile.mkdtemp(prefix="sweep-cost-"))
    convert(args.src, work / "warm-up", alpha=max(alphas), progress=False)  # loads, dequantizes, tokenizes

    def single():
        convert(args.src, work / "single", alpha=max(alphas), force=True, progress=False)

    def swept():
        stats = calibration_statistics(source, source.arch, largest, None, CALIBRATION_TOKENS, CALIBRATION_SEQ_LEN,
                                       False)
        for i, alpha in enumerate(alphas):  # as the sweep: alpha 0 is the original, nothing to convert
            if post_ln_count(num_layers, alpha, None):
                convert(args.src, work / f"alpha-{i}", alpha=alpha, statistics=stats, force=True, progress=False)

    fastest = {"single": float("inf"), "sweep": float("inf")}
    for _ in range(args.repeats):
        for name, run in (("single", single), ("sweep", swept)):
            clock = time.perf_counter()
            run()
            fastest[name] = min(fastest[name], time.perf_counter() - clock)
    shutil.rmtree(work)
    print(f"{args.src}: {num_layers} layers; alphas {args.alphas} (largest: {largest} Post-LN blocks); "
          f"fastest of {args.repeats}")
    print(f"one conversion at the largest alpha: {fastest['single']:.1f} s")
    print(f"the sweep's {len(alphas)} conversions, one calibration: {fastest['sweep']:.1f} s")
    print(f"ratio: {fastest['sweep'] / fastest['single']:.2f}x")


if __name__ == "__main__":
    main()
