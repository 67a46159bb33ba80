"""Train-step time of Mix-LN against HF's LlamaForCausalLM on the same shapes (CPU by default).

    python benchmarks/train_step.py [--layers 12] [--hidden 512] [--batch 4] [--seq-len 256] [--rounds 7]

One train step is forward, backward and an AdamW update on random tokens. The two models are
timed alternately, round after round, so that machine load falls on both alike; the ratio of the
median step times is printed and written to benchmarks/results/train_step.json. Mix-LN makes
floor(alpha * L) blocks Post-LN: one RMSNorm more per such block, nothing else, so the ratio
should be ~1 (the check is <= 1.05). The vocabulary is small (8192) so that the blocks, not the
LM head, dominate the step.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mixln_convert.conversion.layout import post_ln_count
from mixln_convert.model.configuration_mixln import MixLNConfig
from mixln_convert.model.modeling_mixln import MixLNForCausalLM

LIMIT = 1.05
RESULT = Path(__file__).parent / "results" / "train_step.json"


def step_seconds(model, optimizer, tokens, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - started) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds; each times --steps steps per model")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    shape = dict(vocab_size=8192, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                 num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                 num_key_value_heads=args.hidden // 64, max_position_embeddings=args.seq_len)
    n_post = post_ln_count(args.layers, args.alpha)
    torch.manual_seed(0)
    models = {"llama": LlamaForCausalLM(LlamaConfig(**shape)),
              "mixln": MixLNForCausalLM(MixLNConfig(**shape, post_ln_layers=n_post, alpha=args.alpha))}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    tokens = torch.randint(0, shape["vocab_size"], (args.batch, args.seq_len))
    times = {name: [] for name in models}
    for name in models:  # warm-up: allocator, AdamW state
        step_seconds(models[name], optimizers[name], tokens, 1)
    for _ in range(args.rounds):
        for name in models:
            times[name].append(step_seconds(models[name], optimizers[name], tokens, args.steps))

    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["mixln"] / median["llama"]
    result = {"ratio": round(ratio, 4), "limit": LIMIT, "median_step_s": {k: round(v, 4) for k, v in median.items()},
              "shape": {**shape, "post_ln_layers": n_post, "batch": args.batch, "seq_len": args.seq_len},
              "device": "cpu", "threads": torch.get_num_threads(), "rounds": args.rounds, "steps_per_round": args.steps,
              "torch": torch.__version__}
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.layers} layers, hidden {args.hidden}, batch {args.batch} x {args.seq_len} tokens, {n_post} Post-LN: "
          f"train step Mix-LN {median['mixln'] * 1e3:.0f} ms vs LLaMA {median['llama'] * 1e3:.0f} ms, "
          f"ratio {ratio:.3f} ({'ok' if ratio <= LIMIT else 'ABOVE'} the {LIMIT} limit); wrote {RESULT}")


if __name__ == "__main__":
    main()
