"""Studies behind the recipes' defaults, whole training runs each: the Post-LN blocks' lr scale in
continued pre-training (the rehearsal), the demo's lr per arm, and the Mix-LN paper reproduced from
scratch at small scale.
"""

import json
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from . import harness


def rehearsal(argv):
    """CPU rehearsal of continued pre-training right after a conversion (GPU-ready without a GPU).

    The real SmolLM2-135M-Instruct (the cached GGUF), converted (calibrated, alpha 0.25) and healed on
    --heal-tokens tokens, then --steps steps of --batch x 256 tokens, warmup --warmup steps to 3e-4,
    cosine to 10%, in three runs on the same data order:

      mixln-full    the Mix-LN arm, every block at the full lr
      mixln-scaled  the Mix-LN arm, the Post-LN blocks at --post-ln-scale x the lr (optim.post_ln_lr_scale)
      preln         the Pre-LN control

    Every step logs the gradient norm of each block. Prints per run: loss at steps 1, 10, 20, 40 and
    the last, skipped steps, and the largest block gradient norm of the Post-LN blocks and of the
    Pre-LN blocks over the run (and the ratio), then writes everything to OUT/rehearsal.json.
    """
    p = harness.parser(rehearsal)
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--heal-tokens", type=int, default=8192)
    p.add_argument("--post-ln-scale", type=float, default=0.25)
    args = p.parse_args(argv)
    from mixln_convert.training import load_recipe
    from mixln_convert.workflows.train import train

    common = ["micro_batch_size=4", f"global_batch_size={args.batch}", "seq_len=256",
              f"max_tokens={args.steps * args.batch * 256}", "optim.lr=3e-4", f"schedule.warmup_steps={args.warmup}",
              "schedule.min_lr_ratio=0.1", "grad_norm_interval=1", "log_interval=1", f"eval_interval={args.steps}",
              "checkpoint_interval=100000", "data.eval_tokens=4096"]
    healed = args.out / "mixln-full" / "mixln" / "healed"  # the same healed model for the scaled run: only the lr differs
    plans = {  # run: (arm, overrides)
        "mixln-full": ("mixln", [f"heal.tokens={args.heal_tokens}", "optim.post_ln_lr_scale=1"]),
        "mixln-scaled": ("mixln", [f"converted={healed}", "heal.tokens=0", f"optim.post_ln_lr_scale={args.post_ln_scale}"]),
        "preln": ("preln", []),
    }
    started = time.time()
    runs = {name: train(load_recipe("smollm2-135m-cpu", [*common, *extra]), args.out / name, arms=(arm,))[arm]
            for name, (arm, extra) in plans.items()}

    report = {"steps": args.steps, "batch": args.batch, "warmup": args.warmup, "heal_tokens": args.heal_tokens,
              "post_ln_lr_scale": args.post_ln_scale, "seconds": round(time.time() - started), "runs": {}}
    for name, summary in runs.items():
        arm = summary.arm
        records = [json.loads(line) for line in (args.out / name / arm / "metrics.jsonl").read_text().splitlines()]
        k = summary.post_ln_layers
        post = max((max(r["grad_norm_per_layer"][:k]) for r in records), default=None) if k else None
        pre = max(max(r["grad_norm_per_layer"][k:]) for r in records)
        report["runs"][name] = {
            "loss": {r["step"]: r["loss"] for r in records}, "skipped": [r["step"] for r in records if r.get("skipped")],
            "val_ppl": [summary.initial_val_ppl, summary.final_val_ppl],
            "max_block_grad_norm": {"post_ln": post, "pre_ln": pre},
            "first_step_block_grad_norms": records[0]["grad_norm_per_layer"],
        }
        at = [s for s in (1, args.warmup, 2 * args.warmup, args.steps) if s <= args.steps]
        print(f"{name}: loss " + ", ".join(f"step {s} {report['runs'][name]['loss'][s]:.3f}" for s in dict.fromkeys(at))
              + f"; val ppl {summary.initial_val_ppl:.2f} -> {summary.final_val_ppl:.2f}; skipped "
              f"{report['runs'][name]['skipped'] or 'none'}; max block grad norm Post-LN "
              f"{'-' if post is None else f'{post:.3g}'}, Pre-LN {pre:.3g}"
              + (f" ({post / pre:.1f}x)" if post else ""))
    (args.out / "rehearsal.json").write_text(json.dumps(report, indent=1) + "\n")


def demo_lr(argv):
    """What the demo's training lr does to each arm: validation perplexity and repetition.

    Validation perplexity and the greedy continuations' repeated-4-gram share after the demo's 8
    steps, one lr (and Post-LN lr scale) per run.

    Each run is the demo's training of one arm but for the lr: the recipe is the demo's
    (smollm2-135m-cpu, its heal budget, which also sizes the token pool the batches are drawn from,
    8 steps of 4 x 256 tokens, validation on 2,048 tokens), so the Mix-LN arm is converted and healed
    as the demo does it (the heal is deterministic: the demo's healed model) and the demo's own lr
    reproduces the demo's figures.

        python -m benchmarks studies demo-lr 1e-4:mixln 3e-5:mixln 1e-5:mixln 1e-4:mixln:0.01 3e-5:preln
    """
    from mixln_convert.workflows.options import DemoOptions

    p = harness.parser(demo_lr)
    p.add_argument("runs", nargs="+", metavar="LR:ARM[:POST_LN_LR_SCALE]")
    p.add_argument("--heal-tokens", type=int, default=DemoOptions.heal_tokens, help="the demo's --heal-tokens")
    p.add_argument("--train-tokens", type=int, default=DemoOptions.train_tokens, help="the demo's --train-tokens")
    args = p.parse_args(argv)
    import torch

    from mixln_convert.evaluation.generation import greedy_continuations
    from mixln_convert.io.loader import open_checkpoint
    from mixln_convert.training.recipe import load_recipe
    from mixln_convert.workflows.train import train

    print(harness.table(["arm", "lr", "Post-LN lr scale", "validation perplexity", "repeated 4-grams"], []))
    for run in args.runs:
        lr, arm, *scale = run.split(":")
        lr, scale = float(lr), float(scale[0]) if scale else 0.25
        recipe = load_recipe("smollm2-135m-cpu")  # the demo's recipe (workflows/demo.py)
        recipe = recipe.replace("python -m benchmarks studies demo-lr", max_tokens=args.train_tokens,
                                eval_interval=max(1, args.train_tokens // 1024),
                                heal=replace(recipe.heal, tokens=args.heal_tokens),
                                data=replace(recipe.data, eval_tokens=DemoOptions.eval_tokens),
                                optim=replace(recipe.optim, lr=lr, post_ln_lr_scale=scale))
        with tempfile.TemporaryDirectory() as out:
            summary = train(recipe, out, arms=(arm,), progress=False)[arm]
            final = open_checkpoint(f"{out}/{arm}/final")
            written = greedy_continuations(final.model(dtype=torch.float32, device="cpu"), final.tokenizer,
                                           progress=False)
        print(harness.row([arm, f"{lr:g}", f"{scale:g}", f"{summary.initial_val_ppl:.2f} -> "
                           f"{summary.final_val_ppl:.2f}", f"{written.repeated_4gram_share:.1%}"]), flush=True)


SCRATCH_VOCAB = 4096
SEQ_LEN, MICRO_BATCH, GLOBAL_BATCH = 128, 16, 16
STEP_TOKENS = SEQ_LEN * GLOBAL_BATCH


def scratch(argv):
    """Small-scale, like-for-like reproduction of the Mix-LN paper (arXiv 2412.13795) from scratch on CPU.

    Trains a byte-level BPE tokenizer (vocab 4096) on the training documents (the embedded corpus's
    train split, or ``--text``'s documents less 3% held out) and saves it, both splits and a
    12-layer LLaMA of ``--hidden`` in the user cache (its weights only give the shape: every arm is
    initialized afresh), then runs ``mixln-convert study`` on it: Pre-LN and Mix-LN
    (alpha 0.25) arms, plus Post-LN with ``--post-ln``, each from the same seeded initialization,
    scaled init on and off, ``--seeds`` seeds; the report is OUT/report/report.md. Without
    ``--tokens`` the budget per run comes from the tokens/s of a 2-step trial, so that the whole
    study takes about ``--minutes``. The same study on any shape: ``mixln-convert study SRC --out
    DIR --set max_tokens=N ...`` (README).
    """
    from mixln_convert.fetch import cache_dir

    p = harness.parser(scratch)
    p.add_argument("--out", type=Path, default=cache_dir() / "reproduce-scratch",
                   help="output folder (must not exist yet, unless --resume)")
    p.add_argument("--tokens", type=int, default=None, help="training tokens per run (default: fit --minutes)")
    p.add_argument("--minutes", type=float, default=60.0, help="time for the whole study when --tokens is unset")
    p.add_argument("--hidden", type=int, default=128, help="model width (a multiple of 32)")
    p.add_argument("--text", default=None,
                   help="documents to train and validate on: a file, folder or glob (default: the embedded "
                        "corpus); 3%% of them, chosen by a seeded shuffle, are held out")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--post-ln", action="store_true", help="also train a Post-LN arm (alpha 1)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted study in --out")
    args = p.parse_args(argv)
    from mixln_convert.workflows.study import arms_for, study

    started = time.time()
    train_docs, validation_docs, name = scratch_corpus(args.text)
    source = scratch_source(cache_dir() / f"scratch-source-h{args.hidden}-{name}", args.hidden, train_docs,
                            validation_docs)
    tokens = args.tokens
    if tokens is None:
        runs = 2 * args.seeds * len(arms_for(0.25, args.post_ln))
        tokens, rate = scratch_tokens(source, args.minutes, runs)
        print(f"trial: {rate:.0f} tokens/s -> {tokens:,} tokens per run ({runs} runs)", flush=True)
    result = study(source, args.out, overrides=scratch_overrides(tokens, source), seeds=args.seeds,
                   post_ln=args.post_ln, resume=args.resume)
    print((args.out / "report" / "report.md").read_text())
    print(f"wall time, trial and set-up included: {(time.time() - started) / 60:.1f} min; study "
          f"{result.wall_time_s / 60:.1f} min")


def scratch_corpus(text: str | None) -> tuple[list[str], list[str], str]:
    """(train documents, validation documents, a name for them): the embedded corpus's splits, or
    ``text``'s documents (a file, folder or glob) split by a seeded shuffle, 3% for validation."""
    import hashlib

    from mixln_convert.data import embedded_corpus, read_texts

    if text is None:
        return embedded_corpus("train"), embedded_corpus("validation"), "embedded"
    documents = read_texts(text)
    if len(documents) < 2:
        raise SystemExit(f"--text {text}: one document cannot be split into training and validation text")
    random.Random(0).shuffle(documents)
    held_out = max(1, len(documents) * 3 // 100)
    digest = hashlib.sha256("\0".join(documents).encode()).hexdigest()[:12]
    return documents[held_out:], documents[:held_out], digest


def scratch_source(folder: Path, hidden: int, train_docs: list[str], validation_docs: list[str]) -> Path:
    """A byte-level BPE tokenizer trained on ``train_docs``, a random 12-layer LLaMA of width
    ``hidden`` and both splits as JSON lines (train.jsonl, validation.jsonl), in ``folder``."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = harness.bpe_tokenizer(train_docs, SCRATCH_VOCAB)
    config = LlamaConfig(vocab_size=SCRATCH_VOCAB, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 8 * 8,
                         num_hidden_layers=12, num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32,
                         max_position_embeddings=SEQ_LEN, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # complete or absent, never half-written
        LlamaForCausalLM(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        harness.write_jsonl(Path(tmp) / "train.jsonl", train_docs)
        harness.write_jsonl(Path(tmp) / "validation.jsonl", validation_docs)
        Path(tmp).rename(folder)
    return folder


def scratch_overrides(tokens: int, source: Path) -> list[str]:
    """The CPU recipe as a from-scratch run on the source's two splits: the paper's small-model lr,
    5% warmup, ~10 evaluations, no heal."""
    steps = tokens // STEP_TOKENS
    return [f"data.train={source / 'train.jsonl'}", f"data.validation={source / 'validation.jsonl'}",
            f"seq_len={SEQ_LEN}", f"micro_batch_size={MICRO_BATCH}", f"global_batch_size={GLOBAL_BATCH}",
            f"max_tokens={tokens}", "optim.lr=1e-3", f"schedule.warmup_steps={max(1, steps // 20)}",
            "data.eval_tokens=16384", f"eval_interval={max(1, steps // 10)}",
            f"grad_norm_interval={max(1, steps // 10)}", f"checkpoint_interval={max(1, steps // 4)}",
            "keep_checkpoints=1", f"log_interval={max(1, steps // 50)}",
            "heal.tokens=0"]  # like for like: every arm from one initialization plan, none healed toward another


def scratch_tokens(source: Path, minutes: float, runs: int) -> tuple[int, float]:
    """Tokens per run that make ``runs`` runs fit ``minutes``, from an 8-step Pre-LN trial's tokens/s
    (no evaluation, gradient norms or checkpoints in between: they are not training steps)."""
    from mixln_convert.training import load_recipe
    from mixln_convert.workflows.options import StudyOptions
    from mixln_convert.workflows.train import train

    with tempfile.TemporaryDirectory() as tmp:
        trial = {"source": source, "conversion.strategy": "scratch", "eval_interval": 8, "grad_norm_interval": 8,
                 "checkpoint_interval": 8, "data.eval_tokens": 2048}
        recipe = load_recipe(StudyOptions().recipe, [  # the recipe a study trains with; a key once (twice is refused)
            *(item for item in scratch_overrides(8 * STEP_TOKENS, source) if item.split("=")[0] not in trial),
            *(f"{key}={value}" for key, value in trial.items())])
        rate = train(recipe, Path(tmp) / "trial", arms=("preln",), progress=False)["preln"].tokens_per_s
    # about a third of each run's time goes to evaluations, initialization and the analysis
    tokens = int(rate * minutes * 60 / runs * 0.65) // STEP_TOKENS * STEP_TOKENS
    return max(tokens, 2 * STEP_TOKENS), rate


CASES = {
    "rehearsal": harness.Case(rehearsal, "~65 min", ["{tmp}/rehearsal", "--steps", "2", "--batch", "4", "--warmup", "1",
                                                     "--heal-tokens", "1024"], needs="OUT"),
    "demo-lr": harness.Case(demo_lr, "~6 min a run", ["3e-5:mixln", "--heal-tokens", "1024", "--train-tokens", "1024"],
                            needs="LR:ARM..."),
    "scratch": harness.Case(scratch, "~60 min (--minutes)", ["--out", "{tmp}/study", "--tokens", "4096",
                                                             "--hidden", "32", "--seeds", "1"]),
}
