"""Cost of a heal step (KL and residual loss) against a plain training step of the same model, side by side in one run:

    python benchmarks/heal_step.py [--shape smollm2-135m] [--batch 2] [--seq-len 256] [--rounds 3] [--steps 2]

A random model of a published shape (benchmarks/shapes.py) is saved, converted with ``move`` at
alpha 0.25, and, round after round (so that machine load falls on both alike):

- heal: ``heal()`` itself for ``--steps`` + 1 steps on random tokens, with the ``kl`` loss and
  with ``residual``; a step's time is the difference of consecutive ``seconds`` in its
  heal_metrics.jsonl (the first step, which warms up, is left out; the evaluations fall outside
  these differences);
- train: forward, backward and AdamW of the whole Pre-LN model, every parameter trainable, on
  windows of the same shape, ``--steps`` steps (one warm-up step in the first round).

It also times, on the heal's own models (``load_pair``), the parts of a heal step: the teacher's
forward without gradients, and the student's forward and backward with the teacher left out.
Prints the medians and the ratios heal / train (KL: limit 1.1; residual: against k/L, which a
step through the k blocks alone would cost); writes benchmarks/results/heal_step.json.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mixln_convert import convert
from mixln_convert.healing import heal
from mixln_convert.healing.losses import distribution_kl
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.surgery.shared_tail import load_pair
from shapes import SHAPES, docstring_tokenizer, random_model  # benchmarks/shapes.py, beside this script

LIMIT = 1.1
RESULT = Path(__file__).parent / "results" / "heal_step.json"


def heal_steps(converted, source, work: Path, stream, args, loss: str) -> list[float]:
    out = work / f"healed-{time.monotonic_ns()}"
    heal(converted, source, out, data=stream, tokens=(args.steps + 1) * args.batch * args.seq_len, loss=loss,
         seq_len=args.seq_len, batch_size=args.batch, eval_tokens=args.seq_len, perplexity=False, progress=False)
    seconds = [json.loads(line).get("seconds", 0.0) for line in (out / "heal_metrics.jsonl").read_text().splitlines()]
    return [b - a for a, b in zip(seconds[1:], seconds[2:])]


def train_steps(model, optimizer, batches) -> list[float]:
    times = []
    for batch in batches:
        started = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
    return times


def parts(student, teacher, batch) -> dict:
    """Seconds of the teacher's forward, and of the student's forward + KL + backward (against fixed logits)."""
    started = time.perf_counter()
    with torch.no_grad():
        target = teacher(input_ids=batch).logits
    middle = time.perf_counter()
    distribution_kl(student(input_ids=batch).logits, target).backward()
    student.zero_grad()
    return {"teacher_forward": middle - started, "student_forward_backward": time.perf_counter() - middle}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round and kind")
    args = parser.parse_args()

    tokenizer = docstring_tokenizer(vocab_size=1024)
    stream = np.random.default_rng(0).integers(0, len(tokenizer), 1 << 16).astype(np.int64)
    batches = torch.from_numpy(stream[: args.steps * args.batch * args.seq_len].copy()).view(
        args.steps, args.batch, args.seq_len)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        random_model(args.shape).save_pretrained(work / "source")
        tokenizer.save_pretrained(work / "source")
        converted = convert(work / "source", work / "converted", alpha=0.25, strategy="move", progress=False)
        source = open_checkpoint(work / "source")
        model = source.model(dtype=torch.float32).requires_grad_(True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_steps(model, optimizer, batches[:1])  # warm-up: allocator, AdamW state
        times = {"heal": [], "heal_residual": [], "train": [], "teacher_forward": [], "student_forward_backward": []}
        student_source = open_checkpoint(converted)
        k = student_source.config["post_ln_layers"]
        student, teacher, _ = load_pair(student_source, source, source.arch, k)
        for _ in range(args.rounds):
            times["heal"] += heal_steps(converted, work / "source", work, stream, args, "kl")
            times["heal_residual"] += heal_steps(converted, work / "source", work, stream, args, "residual")
            times["train"] += train_steps(model, optimizer, batches)
            for name, seconds in parts(student, teacher, batches[0]).items():
                times[name].append(seconds)

    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["heal"] / median["train"]
    residual_ratio = median["heal_residual"] / median["train"]
    k_over_l = k / source.config["num_hidden_layers"]
    result = {"ratio": round(ratio, 4), "limit": LIMIT, "residual_ratio": round(residual_ratio, 4),
              "k_over_L": round(k_over_l, 4), "median_s": {k: round(v, 4) for k, v in median.items()},
              "shape": args.shape, "post_ln_layers": k, "batch": args.batch, "seq_len": args.seq_len,
              "device": "cpu", "threads": torch.get_num_threads(), "rounds": args.rounds,
              "steps_per_round": args.steps, "torch": torch.__version__}
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.shape}, {k} Post-LN blocks, batch {args.batch} x {args.seq_len}: KL heal step "
          f"{median['heal']:.2f} s vs train step {median['train']:.2f} s, ratio {ratio:.3f} "
          f"({'ok' if ratio <= LIMIT else 'ABOVE'} the {LIMIT} limit); residual heal step {median['heal_residual']:.2f} s, "
          f"ratio {residual_ratio:.3f} (k/L = {k_over_l:.3f}); parts of a KL heal step: teacher forward "
          f"{median['teacher_forward']:.2f} s, student forward + backward {median['student_forward_backward']:.2f} s; "
          f"wrote {RESULT}")


if __name__ == "__main__":
    main()
