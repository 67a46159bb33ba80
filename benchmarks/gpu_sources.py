"""Source checkpoints for benchmarks/gpu.sh. The GPU machine reaches no hub and cannot take the
98 MB SmolLM2 GGUF along (64 MiB travel with a call), so the sources are random-init models of
published shapes (a step costs the same whatever the weights) with SmolLM2's real tokenizer:

    python benchmarks/gpu_sources.py tokenizer .gpu/tokenizer    # here: from the cached GGUF, ~3.5 MB
    python3 benchmarks/gpu_sources.py build .gpu/tokenizer DIR [NAME...]   # there: DIR/smollm2-135m, DIR/llama-1b
"""

import sys

import torch

from shapes import random_model  # benchmarks/shapes.py, beside this script

# name -> (shape, overrides): the 1B-class model is TinyLlama-1.1B's shape with SmolLM2's vocabulary
# (the carried tokenizer's; TinyLlama's own 32000 words would not hold its ids): 1.2B parameters.
SOURCES = {"smollm2-135m": ("smollm2-135m", {}), "llama-1b": ("tinyllama-1.1b", {"vocab_size": 49152})}


def main(command: str, *paths: str) -> None:
    from transformers import AutoTokenizer

    if command == "tokenizer":
        from mixln_convert.fetch import smollm2_gguf
        from mixln_convert.model.loading import load_tokenizer

        load_tokenizer(smollm2_gguf()).save_pretrained(paths[0])
        return
    tokenizer_dir, out, *names = paths
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for name in names or SOURCES:
        shape, overrides = SOURCES[name]
        model = random_model(shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             **overrides)
        model.to(torch.bfloat16).save_pretrained(f"{out}/{name}")  # bf16 on disk; training loads fp32 masters
        tokenizer.save_pretrained(f"{out}/{name}")
        print(f"{out}/{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main(*sys.argv[1:])
