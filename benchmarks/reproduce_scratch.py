"""Small-scale reproduction of the Mix-LN paper (arXiv 2412.13795) from scratch on CPU.

    python benchmarks/reproduce_scratch.py [--out DIR] [--tokens N] [--minutes 20]

Trains a byte-level BPE tokenizer (vocab 4096) on the embedded corpus's train split, saves a
random 12-layer LLaMA (hidden 256) beside it in the user cache, then trains three arms from
scratch for the same token budget with the engine (``mixln_convert.training.train``):
Pre-LN, Mix-LN (alpha 0.25) and Post-LN (alpha 1.0). Each arm's final checkpoint goes through
``mixln_convert.analysis.analyze`` (layer drop, per-layer gradient norms). Prints a Markdown
table and the paper's three claims checked against the numbers; writes OUT/reproduction.json
and OUT/reproduction.md. Without ``--tokens`` the budget per arm comes from the tokens/s of a
2-step trial, so that the three arms take about ``--minutes`` together.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mixln_convert.analysis.analyze import analyze
from mixln_convert.data import embedded_corpus
from mixln_convert.fetch import cache_dir
from mixln_convert.pipeline import train
from mixln_convert.training import load_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPE = "smollm2-135m-cpu"  # shipped with the package
VOCAB = 4096
MODEL = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=12, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1,
             eos_token_id=2)
SEQ_LEN, MICRO_BATCH, GLOBAL_BATCH = 256, 8, 16
STEP_TOKENS = SEQ_LEN * GLOBAL_BATCH
# arm name in the report -> (conversion alpha, engine arm); the engine's preln arm trains the random source as is
ARMS = {"Pre-LN": (0.25, "preln"), "Mix-LN (alpha 0.25)": (0.25, "mixln"), "Post-LN (alpha 1.0)": (1.0, "mixln")}


def build_source(folder: Path, seed: int = 0) -> Path:
    """A byte-level BPE tokenizer trained on the embedded train split, and a random LLaMA, in ``folder``."""
    if (folder / "config.json").is_file():
        return folder
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(embedded_corpus("train"), trainer)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # complete or absent, never half-written
        LlamaForCausalLM(LlamaConfig(**MODEL)).save_pretrained(tmp)
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                eos_token="</s>").save_pretrained(tmp)
        Path(tmp).rename(folder)
    return folder


def recipe_for(source: Path, alpha: float, tokens: int) -> dict:
    """The CPU recipe turned into a from-scratch run: the paper's small-model LR, 10% warmup."""
    steps = tokens // STEP_TOKENS
    return load_recipe(RECIPE, [
        f"source={source}", f"conversion.alpha={alpha}", "conversion.strategy=scratch", f"seq_len={SEQ_LEN}",
        f"micro_batch_size={MICRO_BATCH}", f"global_batch_size={GLOBAL_BATCH}", f"max_tokens={tokens}",
        "optim.lr=1e-3", f"schedule.warmup_steps={max(1, steps // 10)}", "data.eval_tokens=16384",
        f"eval_interval={max(1, steps // 4)}", f"grad_norm_interval={max(1, steps // 10)}",
        f"checkpoint_interval={steps}", "keep_checkpoints=1", f"log_interval={max(1, steps // 20)}"])


def coefficient_of_variation(values) -> float:
    return statistics.pstdev(values) / statistics.mean(values)


def measure(arm_dir: Path, analysis: dict) -> dict:
    """The figures the claims are judged on, from the arm's metrics, summary and analysis."""
    records = [json.loads(line) for line in (arm_dir / "metrics.jsonl").read_text().splitlines()]
    last_grads = [r for r in records if "grad_norm_per_layer" in r][-1]
    drop = analysis["layer_drop"]
    half = len(drop) // 2
    summary = json.loads((arm_dir / "summary.json").read_text())
    return {
        "final_val_ppl": summary["final_val_ppl"], "tokens": summary["tokens"], "wall_time_s": summary["wall_time_s"],
        "grad_cv_training": coefficient_of_variation(last_grads["grad_norm_per_layer"]),
        "grad_cv_training_step": last_grads["step"],
        "grad_norm_per_layer_training": last_grads["grad_norm_per_layer"],
        "grad_cv_analysis": coefficient_of_variation(analysis["grad_norm_per_layer"]),
        "grad_norm_per_layer_analysis": analysis["grad_norm_per_layer"],
        "layer_drop": drop, "layer_drop_shallow_mean": statistics.mean(drop[:half]),
        "layer_drop_deep_mean": statistics.mean(drop[half:]),
    }


def verdicts(arms: dict) -> dict:
    """The paper's three claims, Mix-LN against Pre-LN, decided by the numbers alone."""
    pre, mix = arms["Pre-LN"], arms["Mix-LN (alpha 0.25)"]

    def say(holds: bool, what: str) -> str:
        return ("reproduced: " if holds else "did not reproduce: ") + what

    return {
        "perplexity": say(mix["final_val_ppl"] <= pre["final_val_ppl"],
                          f"Mix-LN ppl {mix['final_val_ppl']:.2f} vs Pre-LN {pre['final_val_ppl']:.2f}"),
        "uniform_grad_norms": say(mix["grad_cv_training"] < pre["grad_cv_training"]
                                  and mix["grad_cv_analysis"] < pre["grad_cv_analysis"],
                                  f"grad-norm CV across layers, training {mix['grad_cv_training']:.3f} vs "
                                  f"{pre['grad_cv_training']:.3f}, analysis {mix['grad_cv_analysis']:.3f} vs "
                                  f"{pre['grad_cv_analysis']:.3f} (Mix-LN vs Pre-LN; lower is more uniform)"),
        "deep_layers_matter": say(mix["layer_drop_deep_mean"] > pre["layer_drop_deep_mean"],
                                  f"mean ppl increase when dropping one deep-half block, Mix-LN "
                                  f"{mix['layer_drop_deep_mean']:.3f} vs Pre-LN {pre['layer_drop_deep_mean']:.3f}"),
    }


def table(arms: dict) -> str:
    lines = ["| arm | final val ppl | grad-norm CV (training, last) | grad-norm CV (analysis) | "
             "layer drop, shallow half (mean) | layer drop, deep half (mean) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, m in arms.items():
        lines.append(f"| {name} | {m['final_val_ppl']:.2f} | {m['grad_cv_training']:.3f} | {m['grad_cv_analysis']:.3f} "
                     f"| {m['layer_drop_shallow_mean']:.3f} | {m['layer_drop_deep_mean']:.3f} |")
    return "\n".join(lines)


def tokens_for(source: Path, minutes: float) -> tuple[int, float]:
    """Tokens per arm that make three arms fit ``minutes``, from a 2-step Pre-LN trial's tokens/s."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(recipe_for(source, 0.25, 2 * STEP_TOKENS), Path(tmp) / "trial", arms=("preln",),
                        progress=False)["preln"]
    rate = summary["tokens_per_s"]
    # ~25% of each arm's time goes to evaluations, conversion and the analysis
    tokens = int(rate * minutes * 60 / 3 * 0.75) // STEP_TOKENS * STEP_TOKENS
    return max(tokens, 2 * STEP_TOKENS), rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=cache_dir() / "reproduce-scratch",
                        help="output folder (must not exist yet)")
    parser.add_argument("--tokens", type=int, default=None, help="training tokens per arm (default: fit --minutes)")
    parser.add_argument("--minutes", type=float, default=20.0, help="time for the three arms when --tokens is unset")
    args = parser.parse_args()

    started = time.time()
    source = build_source(cache_dir() / "scratch-source")
    trial_rate = None
    tokens = args.tokens
    if tokens is None:
        tokens, trial_rate = tokens_for(source, args.minutes)
        print(f"trial: {trial_rate:.0f} tokens/s -> {tokens:,} tokens per arm", flush=True)
    runs = {0.25: args.out / "alpha-0.25", 1.0: args.out / "alpha-1.0"}  # preln + mixln in one, post-LN alone
    train(recipe_for(source, 0.25, tokens), runs[0.25], arms=("preln", "mixln"))
    train(recipe_for(source, 1.0, tokens), runs[1.0], arms=("mixln",))

    arms = {}
    for name, (alpha, arm) in ARMS.items():
        arm_dir = runs[alpha] / arm
        analysis = analyze(arm_dir / "final", arm_dir / "analysis", max_tokens=2048)
        arms[name] = measure(arm_dir, analysis)
    result = {"source": str(source), "model": MODEL, "tokens_per_arm": tokens, "trial_tokens_per_s": trial_rate,
              "wall_time_s": time.time() - started, "arms": arms, "verdicts": verdicts(arms)}
    report = (f"{tokens:,} training tokens per arm ({tokens // STEP_TOKENS} steps of {GLOBAL_BATCH} x {SEQ_LEN}), "
              f"lr 1e-3, one seed; wall time {result['wall_time_s']:.0f} s\n\n{table(arms)}\n\n"
              + "\n".join(f"- {claim}: {verdict}" for claim, verdict in result["verdicts"].items()) + "\n")
    (args.out / "reproduction.json").write_text(json.dumps(result, indent=2))
    (args.out / "reproduction.md").write_text(report)
    print("\n" + report)


if __name__ == "__main__":
    main()
