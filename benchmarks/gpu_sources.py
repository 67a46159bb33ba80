"""Source checkpoints for benchmarks/gpu.sh. The GPU machine reaches no hub and cannot take the
98 MB SmolLM2 GGUF along (64 MiB travel with a call), so the sources are random-init models of
published shapes (benchmarks/shapes.py) with SmolLM2's real tokenizer (or any other: the
vocabulary is the tokenizer's):

    python benchmarks/gpu_sources.py tokenizer .gpu/tokenizer    # here: from the cached GGUF, ~3.5 MB
    python3 benchmarks/gpu_sources.py build .gpu/tokenizer DIR SHAPE...   # there: DIR/SHAPE for each
"""

import sys

import torch

from shapes import random_model  # benchmarks/shapes.py, beside this script


def main(command: str, *paths: str) -> None:
    from transformers import AutoTokenizer

    if command == "tokenizer":
        from mixln_convert.fetch import smollm2_gguf
        from mixln_convert.surgery.loading import load_tokenizer

        load_tokenizer(smollm2_gguf()).save_pretrained(paths[0])
        return
    tokenizer_dir, out, *shapes = paths
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for shape in shapes:
        model = random_model(shape, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)
        model.to(torch.bfloat16).save_pretrained(f"{out}/{shape}")  # bf16 on disk; training loads fp32 masters
        tokenizer.save_pretrained(f"{out}/{shape}")
        print(f"{out}/{shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main(*sys.argv[1:])
