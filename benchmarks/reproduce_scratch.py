"""Small-scale, like-for-like reproduction of the Mix-LN paper (arXiv 2412.13795) from scratch on CPU.

    python benchmarks/reproduce_scratch.py [--out DIR] [--tokens N | --minutes 60] [--hidden 128] [--text PATH]

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

import argparse
import hashlib
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mixln_convert.data import embedded_corpus, read_texts
from mixln_convert.fetch import cache_dir
from mixln_convert.workflows.train import train
from mixln_convert.options import STUDY_RECIPE as RECIPE
from mixln_convert.workflows.study import arms_for, study
from mixln_convert.training import load_recipe

VOCAB = 4096
SEQ_LEN, MICRO_BATCH, GLOBAL_BATCH = 128, 16, 16
STEP_TOKENS = SEQ_LEN * GLOBAL_BATCH


def corpus(text: str | None) -> tuple[list[str], list[str], str]:
    """(train documents, validation documents, a name for them): the embedded corpus's splits, or
    ``text``'s documents (a file, folder or glob) split by a seeded shuffle, 3% for validation."""
    if text is None:
        return embedded_corpus("train"), embedded_corpus("validation"), "embedded"
    documents = read_texts(text)
    if len(documents) < 2:
        raise SystemExit(f"--text {text}: one document cannot be split into training and validation text")
    random.Random(0).shuffle(documents)
    held_out = max(1, len(documents) * 3 // 100)
    digest = hashlib.sha256("\0".join(documents).encode()).hexdigest()[:12]
    return documents[held_out:], documents[:held_out], digest


def build_source(folder: Path, hidden: int, train_docs: list[str], validation_docs: list[str]) -> Path:
    """A byte-level BPE tokenizer trained on ``train_docs``, a random 12-layer LLaMA of width
    ``hidden`` and both splits as JSON lines (train.jsonl, validation.jsonl), in ``folder``."""
    if (folder / "config.json").is_file():
        return folder
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_docs, trainer)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 8 * 8,
                         num_hidden_layers=12, num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32,
                         max_position_embeddings=SEQ_LEN, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # complete or absent, never half-written
        LlamaForCausalLM(config).save_pretrained(tmp)
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                eos_token="</s>").save_pretrained(tmp)
        for name, documents in (("train", train_docs), ("validation", validation_docs)):
            with open(Path(tmp) / f"{name}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": d}) + "\n" for d in documents)
        Path(tmp).rename(folder)
    return folder


def overrides(tokens: int, source: Path) -> list[str]:
    """The CPU recipe as a from-scratch run on the source's two splits: the paper's small-model lr,
    5% warmup, ~10 evaluations."""
    steps = tokens // STEP_TOKENS
    return [f"data.train={source / 'train.jsonl'}", f"data.validation={source / 'validation.jsonl'}",
            f"seq_len={SEQ_LEN}", f"micro_batch_size={MICRO_BATCH}", f"global_batch_size={GLOBAL_BATCH}",
            f"max_tokens={tokens}", "optim.lr=1e-3", f"schedule.warmup_steps={max(1, steps // 20)}",
            "data.eval_tokens=16384", f"eval_interval={max(1, steps // 10)}",
            f"grad_norm_interval={max(1, steps // 10)}", f"checkpoint_interval={max(1, steps // 4)}",
            "keep_checkpoints=1", f"log_interval={max(1, steps // 50)}"]


def tokens_for(source: Path, minutes: float, runs: int) -> tuple[int, float]:
    """Tokens per run that make ``runs`` runs fit ``minutes``, from an 8-step Pre-LN trial's tokens/s
    (no evaluation, gradient norms or checkpoints in between: they are not training steps)."""
    with tempfile.TemporaryDirectory() as tmp:
        recipe = load_recipe(RECIPE, [*overrides(8 * STEP_TOKENS, source), f"source={source}", "conversion.strategy=scratch",
                                      "eval_interval=8", "grad_norm_interval=8", "checkpoint_interval=8",
                                      "data.eval_tokens=2048"])
        rate = train(recipe, Path(tmp) / "trial", arms=("preln",), progress=False)["preln"]["tokens_per_s"]
    # about a third of each run's time goes to evaluations, initialization and the analysis
    tokens = int(rate * minutes * 60 / runs * 0.65) // STEP_TOKENS * STEP_TOKENS
    return max(tokens, 2 * STEP_TOKENS), rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=cache_dir() / "reproduce-scratch",
                        help="output folder (must not exist yet, unless --resume)")
    parser.add_argument("--tokens", type=int, default=None, help="training tokens per run (default: fit --minutes)")
    parser.add_argument("--minutes", type=float, default=60.0, help="time for the whole study when --tokens is unset")
    parser.add_argument("--hidden", type=int, default=128, help="model width (a multiple of 32)")
    parser.add_argument("--text", default=None,
                        help="documents to train and validate on: a file, folder or glob (default: the embedded "
                             "corpus); 3%% of them, chosen by a seeded shuffle, are held out")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--post-ln", action="store_true", help="also train a Post-LN arm (alpha 1)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted study in --out")
    args = parser.parse_args()

    started = time.time()
    train_docs, validation_docs, name = corpus(args.text)
    source = build_source(cache_dir() / f"scratch-source-h{args.hidden}-{name}", args.hidden, train_docs,
                          validation_docs)
    tokens = args.tokens
    if tokens is None:
        runs = 2 * args.seeds * len(arms_for(0.25, args.post_ln))
        tokens, rate = tokens_for(source, args.minutes, runs)
        print(f"trial: {rate:.0f} tokens/s -> {tokens:,} tokens per run ({runs} runs)", flush=True)
    result = study(source, args.out, overrides=overrides(tokens, source), seeds=args.seeds, post_ln=args.post_ln,
                   resume=args.resume)
    print((args.out / "report" / "report.md").read_text())
    print(f"wall time, trial and set-up included: {(time.time() - started) / 60:.1f} min; study "
          f"{result['wall_time_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
