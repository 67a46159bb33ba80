"""Is a healed SmolLM2 usable the way users score and read it? Held-out perplexity, packed and per
document, on texts the heal never saw, and how much greedy continuations repeat themselves,
for the original, the calibrated conversion and the healed model.

    python benchmarks/heal_quality.py [--packed FILE ...]
        --paragraphs '<python3.11-doc>/usr/share/doc/python3.11/html/_sources/**/*.txt'
        [--lines <gensim-4.4.0 wheel>/gensim/test/test_data/lee_background.cor]
        [--tokens 65536] [--lr 3e-5] [--heal-seq-len 256] [--heal-batch-size 4] [--loss kl] [--heal-data FILE ...] [--checkpoints 16384,32768] [--curve-on A|B|C]
        [--json OUT.json]

Text A (``--packed``, files; default Debian's GPL-3 and Apache-2.0 licence texts),
text B (``--paragraphs``: prose paragraphs of 400-1200 characters cut from reStructuredText
sources, 300 chosen by a seeded draw, each one document) and text C (``--lines``: a file of one
document per line, such as the Lee corpus of Australian news that gensim's wheel carries beside the
Wikipedia extract of the embedded corpus) are each scored in packed windows of
``--seq-len`` and document by document from the first token (lm-eval's loglikelihood_rolling).
Each text's documents are first checked against the embedded corpus: how many share a sentence of
SENTENCE_CHARS or more with it (held out: none). The heal (`mixln_convert.healing.heal`, its
defaults unless given) trains on the embedded corpus and evaluates on text A (or ``--curve-on``) at
each of ``--checkpoints``: the curve. Generation: greedy 64-token continuations of the 24 fixed
prompts of `mixln_convert.evaluation.generation`, their mean share of repeated 4-grams. Prints Markdown tables;
``--json`` keeps every figure and continuation.
"""

import argparse
import glob
import json
import random
import re
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from mixln_convert import convert
from mixln_convert.data import SPLITS, embedded_corpus
from mixln_convert.data.corpus import SHARES
from mixln_convert.evaluation.perplexity import score_checkpoint
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.healing import heal
from mixln_convert.options import HEAL_BATCH_SIZE, HEAL_LR, HEAL_SEQ_LEN

DIRECTIVE = re.compile(r"^\s|^\.\. |::\s*$|^[=\-~^*#]{3,}\s*$")
SENTENCE_CHARS = 60  # a shared sentence this long is shared text, not a common phrase


def paragraphs(pattern: str, count: int = 300) -> list[str]:
    """``count`` prose paragraphs (400-1200 characters, no indented, directive or heading lines)
    of the files matching ``pattern``, each joined into one line, drawn with seed 0 from those that
    share no sentence with the embedded corpus (the library reference repeats some docstrings)."""
    found = []
    for path in sorted(glob.glob(pattern, recursive=True)):
        for block in Path(path).read_text(encoding="utf-8", errors="replace").split("\n\n"):
            lines = block.strip("\n").splitlines()
            if lines and not any(DIRECTIVE.search(line) for line in lines):
                text = " ".join(line.strip() for line in lines)
                if 400 <= len(text) <= 1200 and not in_corpus(text):
                    found.append(text)
    if len(found) < count:
        raise SystemExit(f"--paragraphs {pattern}: {len(found)} paragraphs found, {count} needed")
    return random.Random(0).sample(found, count)


@lru_cache(maxsize=1)
def corpus_text() -> str:
    return " ".join(" ".join(doc.split()) for split in SPLITS for doc in embedded_corpus(split))


def in_corpus(document: str) -> bool:
    """Whether ``document`` shares a sentence of SENTENCE_CHARS or more (whitespace aside) with the
    embedded corpus, any split."""
    return any(len(s) >= SENTENCE_CHARS and s in corpus_text()
               for s in re.split(r"(?<=[.!?;:])\s+", " ".join(document.split())))


def score(ckpt, texts: dict, args, generate: bool) -> dict:
    """{text: {packed, per_document}} perplexities of ``ckpt``, and its generation when asked."""
    result = {}
    for i, (name, path) in enumerate(texts.items()):
        scored = score_checkpoint(ckpt, data=path, seq_len=args.seq_len, max_tokens=args.eval_tokens,
                                  per_document=True, generate=generate and i == 0, progress=False)
        result[name] = {"packed": scored["perplexity"], "per_document": scored["per_document"]["token_perplexity"],
                        "tokens": scored["tokens"], "documents": scored["per_document"]["documents"]}
        if "generation" in scored:
            result["generation"] = scored["generation"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packed", nargs="+", default=[f"/usr/share/common-licenses/{n}" for n in ("GPL-3", "Apache-2.0")],
                        help="text A: files, each one document, scored packed and per document; the heal's curve")
    parser.add_argument("--paragraphs", required=True, help="glob of .txt/.rst sources whose paragraphs are text B")
    parser.add_argument("--lines", default=None, help="text C: a file of one document per line (default: none)")
    parser.add_argument("--model", default=None, help="Pre-LN source (default: the SmolLM2 GGUF)")
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--tokens", type=int, default=65_536, help="heal tokens (heal's default)")
    parser.add_argument("--lr", type=float, default=HEAL_LR)
    parser.add_argument("--heal-seq-len", type=int, default=HEAL_SEQ_LEN, help="heal's training window length")
    parser.add_argument("--heal-batch-size", type=int, default=HEAL_BATCH_SIZE, help="heal's windows per step")
    parser.add_argument("--loss", default="kl")
    parser.add_argument("--heal-data", nargs="+", default=None,
                        help="files the heal trains on, each one document (default: heal's, the embedded corpus)")
    parser.add_argument("--checkpoints", default="16384,32768", help="heal token counts to evaluate the curve's text at")
    parser.add_argument("--curve-on", choices=("A", "B", "C"), default="A", help="the text heal evaluates (its curve)")
    parser.add_argument("--seq-len", type=int, default=512, help="packed window length and per-document window")
    parser.add_argument("--eval-tokens", type=int, default=16_384, help="tokens scored per text and mode")
    parser.add_argument("--json", type=Path, default=None, help="write every figure and continuation here")
    args = parser.parse_args()

    source = args.model or smollm2_gguf()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        documents = {"A": [Path(f).read_text(encoding="utf-8") for f in args.packed],  # in the order given
                     "B": paragraphs(args.paragraphs)}
        if args.lines:
            documents["C"] = [line for line in Path(args.lines).read_text(encoding="utf-8").splitlines() if line.strip()]
        if args.curve_on not in documents:
            raise SystemExit(f"--curve-on {args.curve_on}: text {args.curve_on} not given")
        shared = {name: sum(map(in_corpus, docs)) for name, docs in documents.items()}
        texts = {}
        for name, docs in documents.items():  # each text as one file of documents
            texts[name] = tmp / f"text-{name}.jsonl"
            texts[name].write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))

        converted = convert(source, tmp / "converted", alpha=args.alpha, strategy="calibrated", progress=False)
        healed = tmp / "healed"
        heal_data = [Path(f).read_text(encoding="utf-8") for f in args.heal_data] if args.heal_data else None
        heal_result = heal(converted, source, healed, data=heal_data, tokens=args.tokens, lr=args.lr,
                           seq_len=args.heal_seq_len, batch_size=args.heal_batch_size, loss=args.loss,
                           eval_data=texts[args.curve_on], eval_tokens=args.eval_tokens,
                           eval_at=[int(t) for t in args.checkpoints.split(",") if t], progress=False)
        curve = [json.loads(line) for line in (healed / "heal_metrics.jsonl").read_text().splitlines()]
        models = {name: score(ckpt, texts, args, generate=True)
                  for name, ckpt in (("original", source), ("converted", converted), ("healed", healed))}

    original = models["original"]
    rep0 = original["generation"]["repeated_4gram_share"]
    mix = ", ".join(f"{name} {share:.0%}" for name, share in SHARES.items())
    text_c = f", C: {args.lines} ({len(documents['C'])} documents)" if args.lines else ""
    print(f"\n{Path(source).name}, alpha {args.alpha} calibrated, heal {args.loss} lr {args.lr} on "
          f"{', '.join(args.heal_data) if args.heal_data else f'the embedded corpus ({mix} of its characters)'}, "
          f"{heal_result['tokens']:,} tokens in steps of {args.heal_batch_size} x {args.heal_seq_len} ({heal_result['seconds']:.0f} s); A: {', '.join(args.packed)} "
          f"({len(documents['A'])} documents), B: 300 paragraphs of {args.paragraphs}"
          f"{text_c}; {args.eval_tokens:,} tokens "
          f"per text and mode, windows of {args.seq_len}; total {time.time() - started:.0f} s")
    print("held out: " + ", ".join(f"{name} {shared[name]} of {len(documents[name])} documents" for name in texts)
          + f" share a sentence of {SENTENCE_CHARS}+ characters with the embedded corpus\n")
    print(f"| model | {' | '.join(f'{t} packed | {t} per document' for t in texts)} | repeated 4-grams (x original) |")
    print("| --- " * (2 + 2 * len(texts)) + "|")
    for name, m in models.items():
        cells = [f"{m[t][mode]:.3f} ({m[t][mode] / original[t][mode]:.3f}x)" for t in texts
                 for mode in ("packed", "per_document")]
        rep = m["generation"]["repeated_4gram_share"]
        print(f"| {name} | {' | '.join(cells)} | {rep:.3f} ({rep / rep0 if rep0 else float('inf'):.2f}x) |")
    teacher = heal_result["perplexity"]["teacher"], heal_result["per_document_perplexity"]["teacher"]
    on = args.curve_on
    print(f"\nHeal curve on {on} (windows of heal's {args.heal_seq_len} tokens; mid-run points at a learning rate "
          "not yet annealed):\n")
    print(f"| heal tokens | {on} packed (x original) | {on} per document (x original) |")
    print("| --- | --- | --- |")
    for row in (r for r in curve if "val_ppl" in r):
        print(f"| {row['tokens']:,} | {row['val_ppl'] / teacher[0]:.3f}x | {row['val_doc_ppl'] / teacher[1]:.3f}x |")
    print("\nFirst continuations (greedy, 64 tokens):\n")
    for i in range(3):
        print(f"- **{original['generation']['continuations'][i]['prompt']}**")
        for name, m in models.items():
            print(f"  - {name}: {m['generation']['continuations'][i]['text']!r}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "heal": heal_result,
                                         "curve": curve, "models": models}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
