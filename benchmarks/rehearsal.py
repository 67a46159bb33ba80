"""CPU rehearsal of continued pre-training right after a conversion (issue: GPU-ready without a GPU):
the real SmolLM2-135M-Instruct (the cached GGUF), converted (calibrated, alpha 0.25) and healed on
HEAL_TOKENS tokens, then STEPS steps of BATCH x 256 tokens, warmup WARMUP steps to 3e-4, cosine to
10%, in three runs on the same data order:

  mixln-full    the Mix-LN arm, every block at the full lr
  mixln-scaled  the Mix-LN arm, the Post-LN blocks at POST_LN_SCALE x the lr (optim.post_ln_lr_scale)
  preln         the Pre-LN control

Every step logs the gradient norm of each block. Prints per run: loss at steps 1, 10, 20, 40 and
the last, skipped steps, and the largest block gradient norm of the Post-LN blocks and of the
Pre-LN blocks over the run (and the ratio), then writes everything to OUT/rehearsal.json.

    .venv/bin/python benchmarks/rehearsal.py OUT [--steps 40] [--batch 8] [--warmup 10] [--heal-tokens 8192]
        [--post-ln-scale 0.25]
"""

import argparse
import json
import time
from pathlib import Path

from mixln_convert.workflows.train import train
from mixln_convert.training import load_recipe


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--heal-tokens", type=int, default=8192)
    parser.add_argument("--post-ln-scale", type=float, default=0.25)
    args = parser.parse_args()
    common = ["micro_batch_size=4", f"global_batch_size={args.batch}", "seq_len=256",
              f"max_tokens={args.steps * args.batch * 256}", "optim.lr=3e-4", f"schedule.warmup_steps={args.warmup}",
              "schedule.min_lr_ratio=0.1", "grad_norm_interval=1",
              "log_interval=1", f"eval_interval={args.steps}", "checkpoint_interval=100000", "data.eval_tokens=4096"]
    runs = {}
    started = time.time()
    first = args.out / "mixln-full"
    runs["mixln-full"] = (first, train(load_recipe("smollm2-135m-cpu", [*common, f"heal.tokens={args.heal_tokens}",
                                                                        "optim.post_ln_lr_scale=1"]),
                                       first, arms=("mixln",))["mixln"])
    healed = first / "mixln" / "healed"  # the same healed model for the scaled run: only the lr differs
    scaled = args.out / "mixln-scaled"
    runs["mixln-scaled"] = (scaled, train(load_recipe("smollm2-135m-cpu", [
        *common, f"converted={healed}", "heal.tokens=0", f"optim.post_ln_lr_scale={args.post_ln_scale}"]),
        scaled, arms=("mixln",))["mixln"])
    control = args.out / "preln"
    runs["preln"] = (control, train(load_recipe("smollm2-135m-cpu", common), control, arms=("preln",))["preln"])

    report = {"steps": args.steps, "batch": args.batch, "warmup": args.warmup, "heal_tokens": args.heal_tokens,
              "post_ln_lr_scale": args.post_ln_scale,
              "seconds": round(time.time() - started), "runs": {}}
    for name, (folder, summary) in runs.items():
        arm = summary["arm"]
        records = [json.loads(line) for line in (folder / arm / "metrics.jsonl").read_text().splitlines()]
        k = summary["post_ln_layers"]
        post = max((max(r["grad_norm_per_layer"][:k]) for r in records), default=None) if k else None
        pre = max(max(r["grad_norm_per_layer"][k:]) for r in records)
        report["runs"][name] = {
            "loss": {r["step"]: r["loss"] for r in records}, "skipped": [r["step"] for r in records if r.get("skipped")],
            "val_ppl": [summary["initial_val_ppl"], summary["final_val_ppl"]],
            "max_block_grad_norm": {"post_ln": post, "pre_ln": pre},
            "first_step_block_grad_norms": records[0]["grad_norm_per_layer"],
        }
        at = [s for s in (1, args.warmup, 2 * args.warmup, args.steps) if s <= args.steps]
        print(f"{name}: loss " + ", ".join(f"step {s} {report['runs'][name]['loss'][s]:.3f}" for s in dict.fromkeys(at))
              + f"; val ppl {summary['initial_val_ppl']:.2f} -> {summary['final_val_ppl']:.2f}; skipped "
              f"{report['runs'][name]['skipped'] or 'none'}; max block grad norm Post-LN "
              f"{'-' if post is None else f'{post:.3g}'}, Pre-LN {pre:.3g}"
              + (f" ({post / pre:.1f}x)" if post else ""))
    (args.out / "rehearsal.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
