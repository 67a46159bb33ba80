"""Cost of the layer-drop sweep (what ``analysis.layers.removal_sweep`` does: one full pass that
keeps the residual stream, then each skipped block's run continues from its stored input) against
L independent forward passes: with one block skipped each (a naive sweep) and full ones (the
issue's yardstick, L forward passes of the model).

    PYTHONPATH=. python benchmarks/layer_drop.py [CKPT | --shape tinyllama-1.1b] [--seq-len 256] [--max-tokens 1024]

CKPT defaults to the embedded SmolLM2-135M GGUF; ``--shape`` builds a published LLaMA-family
configuration with random weights and scores random tokens (a pass costs the same whatever the
values, so the ratio is that of the real model; its perplexities mean nothing). All three run the
same model on the same token windows through the same code (``BlockRunner``), timed interleaved,
block by block, so that load from other processes on a shared machine weighs on all alike; the
sweep's time includes its full-model pass.

The sweep saves block work only: with b the cost of a block and h that of the head (final norm,
vocabulary projection, loss), it costs (L + L(L-1)/2) b + (L+1) h against L((L-1) b + h) skipped
or L(L b + h) full, i.e. about 1/2 + 1/L where the head is cheap. SmolLM2-135M's head (vocabulary
49152 x hidden 576) costs ~8 of its 30 blocks, which lifts its ratio to ~0.63 whatever the code
(an exact perplexity needs every logit); TinyLlama-1.1B's (32000 x 2048) costs ~1.5 of its 22.
Measured on the 2-core CPU (figures in the README).
"""

import argparse
import math
import time

import torch

from mixln_convert.analysis.layers import BlockRunner
from mixln_convert.data import read_texts, token_windows
from mixln_convert.surgery.loading import load_model, load_tokenizer
from shapes import SHAPES, random_model  # benchmarks/shapes.py, beside this script


@torch.no_grad()
def compare(runner: BlockRunner, windows: torch.Tensor, batch_size: int, repeats: int) -> dict:
    """Seconds of the three variants, and the perplexities with each block skipped (naive and sweep).

    Each step is timed ``repeats`` times back to back and counts its fastest run, the one least
    disturbed by other processes. Every timed step ends in ``nll(...)``, whose ``.item()`` waits
    for the device.
    """
    num_layers = runner.num_layers
    skipped_nll, sweep_nll = [0.0] * num_layers, [0.0] * num_layers
    seconds = {"skipped": 0.0, "full": 0.0, "sweep": 0.0}

    def timed(variant: str, work):
        fastest = math.inf
        for _ in range(repeats):
            clock = time.perf_counter()
            result = work()
            fastest = min(fastest, time.perf_counter() - clock)
        seconds[variant] += fastest
        return result

    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        stream = timed("sweep", lambda: runner.stream(batch))
        timed("sweep", lambda: runner.nll(stream.residual[-1], batch))
        for layer in range(num_layers):
            skipped_nll[layer] += timed("skipped", lambda: runner.nll(runner.run(*runner.embed(batch), skip={layer}),
                                                                    batch)).sum().item()
            timed("full", lambda: runner.nll(runner.run(*runner.embed(batch)), batch))
            sweep_nll[layer] += timed("sweep", lambda: runner.nll_without(stream, [layer])).sum().item()
    tokens = windows[:, 1:].numel()
    return {**seconds, "skipped_ppl": [math.exp(n / tokens) for n in skipped_nll],
            "sweep_ppl": [math.exp(n / tokens) for n in sweep_nll]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", nargs="?", help="HF folder or .gguf (default: SmolLM2-135M GGUF)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a published configuration with random weights")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=4 * 256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="timings per step, the fastest counted")
    args = parser.parse_args()
    if args.shape:
        runner = BlockRunner(random_model(args.shape).to(args.device))
        windows = torch.randint(SHAPES[args.shape]["vocab_size"], (args.max_tokens // args.seq_len, args.seq_len))
        args.ckpt = f"{args.shape} (random weights)"
    else:
        if args.ckpt is None:
            from mixln_convert.fetch import smollm2_gguf

            args.ckpt = smollm2_gguf()
        runner = BlockRunner(load_model(args.ckpt, dtype=torch.float32, device=args.device))
        windows = token_windows(load_tokenizer(args.ckpt), read_texts(None, "validation"), args.seq_len,
                                args.max_tokens)
    windows = windows.to(args.device)
    with torch.no_grad():  # warm-up: first calls allocate and pick kernels
        runner.nll(runner.run(*runner.embed(windows[:args.batch_size])), windows[:args.batch_size])

    result = compare(runner, windows, args.batch_size, args.repeats)
    worst = max(abs(a - b) / a for a, b in zip(result["skipped_ppl"], result["sweep_ppl"]))
    print(f"{args.ckpt}: {runner.num_layers} layers, {windows.shape[0]} x {windows.shape[1]} tokens, "
          f"{args.device}, {torch.get_num_threads()} CPU threads, fastest of {args.repeats} timings per step")
    print(f"{runner.num_layers} forwards, one block skipped each: {result['skipped']:8.2f} s")
    print(f"{runner.num_layers} full forwards:                   {result['full']:8.2f} s")
    print(f"reuse sweep, incl. its full pass:        {result['sweep']:8.2f} s")
    print(f"ratio sweep / skipped forwards:          {result['sweep'] / result['skipped']:8.3f}"
          f"   (largest relative perplexity difference {worst:.1e})")
    print(f"ratio sweep / full forwards:             {result['sweep'] / result['full']:8.3f}")

if __name__ == "__main__":
    main()
