"""Peak RSS of `heal` on a TinyLlama-1.1B-shaped model (or another ``--shape``), its variants side by side:

    python benchmarks/heal_memory.py [--before REV] [--tokens 64] [--seq-len 64] [--batch-size 1] [--no-bf16] [--no-checkpointing] [--repeat 1]

Builds a synthetic bf16 checkpoint of TinyLlama-1.1B's shape (random weights, benchmarks/shapes.py),
converts it with ``move`` at alpha 0.25 (5 of 22 blocks Post-LN), and heals it against it (default
loss ``kl``, one step of ``--tokens`` tokens in windows of ``--seq-len``, the evaluations on
``--eval-tokens``) in a fresh process per run: REV from a temporary git worktree first on
``PYTHONPATH`` (with ``--before``: the float32 default and ``--activation-checkpointing``), then
the installed package with the float32 default, with
``--activation-checkpointing`` and (unless ``--no-bf16``) with ``--dtype bf16``. Peak RSS is the
OS's figure for the child (``wait4``'s ru_maxrss, its VmHWM), printed as a multiple of the model's
float32 parameter bytes, beside each run's wall time. ``--repeat N`` runs the variants N times in
turn (variant 1, 2, ..., then again), so that drift of the machine falls on all of them alike, and
prints every run and the medians.
"""

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from shapes import SHAPES, synthetic_checkpoint  # benchmarks/shapes.py, beside this script
from train_run import measure, worktree


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=None, help="git revision of a 'before' version to run first")
    parser.add_argument("--tokens", type=int, default=64, help="training tokens (one step)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--eval-tokens", type=int, default=64, help="held-out tokens")
    parser.add_argument("--no-bf16", action="store_true", help="leave out the --dtype bf16 run (slow on CPUs)")
    parser.add_argument("--shape", choices=SHAPES, default="tinyllama-1.1b")
    parser.add_argument("--no-checkpointing", action="store_true", help="leave out the --activation-checkpointing runs")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of all the variants, run in turn")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat: {args.repeat} is not a whole number of rounds >= 1")
    from mixln_convert import convert
    from mixln_convert.io.loader import open_checkpoint

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        synthetic_checkpoint(work / "source", args.shape, "2GB")
        source = open_checkpoint(work / "source")
        fp32_bytes = 4 * sum(math.prod(source.shape(name)) for name in source.names())
        convert(work / "source", work / "converted", alpha=0.25, strategy="move", progress=False)
        heal = [sys.executable, "-m", "mixln_convert.cli", "heal", str(work / "converted"), "--teacher",
                str(work / "source"), "--tokens", str(args.tokens), "--seq-len", str(args.seq_len), "--batch-size",
                str(args.batch_size), "--eval-tokens", str(args.eval_tokens)]
        versions = {}
        if args.before:
            before = {"PYTHONPATH": str(work / "before")}
            versions[f"before ({args.before}), fp32"] = ([], before)
            if not args.no_checkpointing:
                versions[f"before ({args.before}), fp32, --activation-checkpointing"] = (["--activation-checkpointing"], before)
        versions["after (installed), fp32"] = ([], {})
        if not args.no_checkpointing:
            versions["after (installed), fp32, --activation-checkpointing"] = (["--activation-checkpointing"], {})
        if not args.no_bf16:
            versions["after (installed), --dtype bf16"] = (["--dtype", "bf16"], {})
        runs = {name: [] for name in versions}
        with worktree(args.before, work / "before") if args.before else contextlib.nullcontext():
            for round_ in range(args.repeat):
                for n, (name, (extra, env)) in enumerate(versions.items()):
                    env = {**os.environ, "MIXLN_CONVERT_CACHE": str(work / f"cache-{n}"), **env}
                    out = work / f"healed-{n}-{round_}"
                    runs[name].append(measure([*heal, *extra, "--out", str(out)], env))
                    shutil.rmtree(out, ignore_errors=True)  # the next round writes its own
                    seconds, peak = runs[name][-1]
                    print(f"round {round_ + 1}, {name}: {seconds:.0f} s, {peak / 2**30:.2f} GiB", file=sys.stderr)
    steps = args.tokens // (args.batch_size * args.seq_len)
    print(f"\n`heal` of {args.shape}'s shape (move, alpha 0.25), {steps} step(s) of {args.batch_size} x {args.seq_len} "
          f"tokens, {args.eval_tokens} held-out tokens; float32 parameter bytes {fp32_bytes / 2**30:.2f} GiB; "
          f"{args.repeat} round(s), medians (every run's figure in brackets)\n")
    print("| version | peak RSS GiB | x fp32 parameter bytes | wall time s |")
    print("| --- | --- | --- | --- |")
    for name, measured in runs.items():
        seconds, peaks = [m[0] for m in measured], [m[1] for m in measured]
        every = f" ({', '.join(f'{p / 2**30:.2f}' for p in peaks)})" if len(peaks) > 1 else ""
        every_s = f" ({', '.join(f'{x:.0f}' for x in seconds)})" if len(seconds) > 1 else ""
        print(f"| {name} | {statistics.median(peaks) / 2**30:.2f}{every} | {statistics.median(peaks) / fp32_bytes:.2f} "
              f"| {statistics.median(seconds):.0f}{every_s} |")


if __name__ == "__main__":
    main()
