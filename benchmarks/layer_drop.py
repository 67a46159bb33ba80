"""Cost of the layer-drop sweep: L independent forward passes, each with one block skipped, against
the sweep that reuses the residual stream (what ``analysis.layers.removal_sweep`` does).

    PYTHONPATH=. python benchmarks/layer_drop.py [CKPT] [--seq-len 256] [--max-tokens 1024] [--device cpu]

CKPT defaults to the embedded SmolLM2-135M GGUF. Both variants run the same model on the same token
blocks through the same code (``BlockRunner``): the naive one recomputes the blocks before the
skipped one, the sweep runs each batch through the full model once (which also gives the baseline
perplexity) and continues from the stored input of each skipped block. The two are timed
interleaved, block by block, so that load from other processes on a shared machine weighs on both
alike; the sweep's time includes its full-model pass.

The sweep saves block work only: with b the cost of a block and h that of the head (final norm,
vocabulary projection, loss), it costs (L + L(L-1)/2) b + (L+1) h against L((L-1) b + h), i.e.
about 1/2 + 1/(L-1) where the head is cheap. SmolLM2-135M's head (vocabulary 49152 x hidden 576)
costs ~8 blocks, which lifts its ratio to ~0.65. Measured on a shared 2-core CPU, 4 x 256 tokens:

    SmolLM2-135M GGUF, 30 layers, 1 thread            naive 117 s, sweep  76 s, ratio 0.646
    SmolLM2-135M GGUF, 30 layers, 2 threads (loaded)  naive 560 s, sweep 345 s, ratio 0.616
    random LLaMA, 24 layers, hidden 512, vocab 4096   naive 179 s, sweep  94 s, ratio 0.526
"""

import argparse
import math
import time

import torch

from mixln_convert.analysis.layers import BlockRunner
from mixln_convert.data import read_texts, token_blocks
from mixln_convert.model.loading import load_model, load_tokenizer


@torch.no_grad()
def compare(runner: BlockRunner, blocks: torch.Tensor, batch_size: int) -> dict:
    """Seconds of both variants and their perplexities with each block skipped.

    Every timed step ends in ``nll(...).item()``, which waits for the device.
    """
    num_layers = runner.num_layers
    naive_nll, sweep_nll = [0.0] * num_layers, [0.0] * num_layers
    naive_s = sweep_s = 0.0
    for start in range(0, len(blocks), batch_size):
        batch = blocks[start:start + batch_size]
        clock = time.perf_counter()
        stream = runner.stream(batch)
        runner.nll(stream.residual[-1], batch)
        sweep_s += time.perf_counter() - clock
        for layer in range(num_layers):
            clock = time.perf_counter()
            hidden, block_kwargs = runner.embed(batch)
            naive_nll[layer] += runner.nll(runner.run(hidden, block_kwargs, skip={layer}), batch)
            naive_s += time.perf_counter() - clock
            clock = time.perf_counter()
            sweep_nll[layer] += runner.nll_without(stream, [layer])
            sweep_s += time.perf_counter() - clock
    tokens = blocks[:, 1:].numel()
    return {"naive_s": naive_s, "sweep_s": sweep_s,
            "naive": [math.exp(n / tokens) for n in naive_nll], "sweep": [math.exp(n / tokens) for n in sweep_nll]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", nargs="?", help="HF folder or .gguf (default: SmolLM2-135M GGUF)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=4 * 256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.ckpt is None:
        from mixln_convert.fetch import smollm2_gguf

        args.ckpt = smollm2_gguf()
    runner = BlockRunner(load_model(args.ckpt, dtype=torch.float32, device=args.device))
    blocks = token_blocks(load_tokenizer(args.ckpt), read_texts(None, "validation"), args.seq_len, args.max_tokens)
    blocks = blocks.to(args.device)
    compare(runner, blocks[:1], 1)  # warm-up: first calls allocate and pick kernels

    result = compare(runner, blocks, args.batch_size)
    worst = max(abs(a - b) / a for a, b in zip(result["naive"], result["sweep"]))
    print(f"{args.ckpt}: {runner.num_layers} layers, {blocks.shape[0]} x {blocks.shape[1]} tokens, "
          f"{args.device}, {torch.get_num_threads()} CPU threads")
    print(f"naive, {runner.num_layers} skipped forwards: {result['naive_s']:8.2f} s")
    print(f"reuse sweep, incl. its full pass: {result['sweep_s']:8.2f} s")
    print(f"ratio sweep / naive:              {result['sweep_s'] / result['naive_s']:8.3f}"
          f"   (largest relative perplexity difference {worst:.1e})")


if __name__ == "__main__":
    main()
