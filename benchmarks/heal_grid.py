"""Heal variants side by side, in one GPU call: each variant heals the same calibrated conversion of
SmolLM2 on 65,536 tokens (the default budget) and is scored as benchmarks/heal_quality.py scores
(texts A, B, C packed and per document, repeated 4-grams of greedy continuations), with a second
seed of the default to show the noise. Measured per variant (heal and scoring): ~45 min on this
project's 2-core CPU, 83-92 s on an H200 (benchmarks/results/heal_grid_2026-12-04/).

    here:   python benchmarks/heal_grid.py prepare .gpu/heal --paragraphs '<python3.11-doc>/**/*.txt' \
                --lines <gensim wheel>/gensim/test/test_data/lee_background.cor
            (data/: the held-out texts and this machine's embedded corpus splits; part0/, part1/: the
            GGUF in two parts, since a device call carries at most 64 MiB, so part0 goes in a first
            call and the rest in a second while the machine stays warm; site/: gguf-py)
    there:  PYTHONPATH=.gpu/heal/site python benchmarks/heal_grid.py run .gpu/heal [--budget-s 400]

The corpus is written here, not read there: its docstring third comes from the running Python's
standard library, and the device's Python is another release. $OUT gets grid.json (rewritten after
each variant, so a stopped call keeps what finished) and grid.md.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from heal_quality import SENTENCE_CHARS, in_corpus, paragraphs, score

from mixln_convert import convert
from mixln_convert.data import embedded_corpus
from mixln_convert.data.corpus import _shipped_english
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.healing import heal
from mixln_convert.io.loader import open_checkpoint

PART_BYTES = 56 * 2**20  # and the checkout (~5 MB) under the 64 MiB a call carries
TOKENS = 65_536
# name -> heal() settings beside the defaults; "data" names a prepared document list
VARIANTS = {
    "default": {},
    "default seed 1": {"seed": 1},
    "lr 5e-5": {"lr": 5e-5},
    "general English only": {"data": "english"},
    "no gradient clipping": {"grad_clip": 0.0},
    "8 x 256 (32 steps), lr 5e-5": {"batch_size": 8, "lr": 5e-5},
    "2 x 512": {"batch_size": 2, "seq_len": 512},
    "warmup 30%": {"warmup_ratio": 0.3},
    "lr 2e-5": {"lr": 2e-5},
}


def prepare(folder: Path, args) -> None:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    documents = {"A": [Path(f).read_text(encoding="utf-8") for f in args.packed], "B": paragraphs(args.paragraphs),
                 "C": [line for line in Path(args.lines).read_text(encoding="utf-8").splitlines() if line.strip()]}
    shared = {name: sum(map(in_corpus, docs)) for name, docs in documents.items()}
    train = embedded_corpus("train")
    english = {text for _, _, text in _shipped_english()}
    lists = {**{f"text-{n}": docs for n, docs in documents.items()}, "train": train,
             "english": [d for d in train if d in english], "calibration": embedded_corpus("calibration")}
    for name, docs in lists.items():
        (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    gguf = Path(args.model or smollm2_gguf()).read_bytes()
    for i in range(0, len(gguf), PART_BYTES):
        part = folder / f"part{i // PART_BYTES}"
        part.mkdir(exist_ok=True)
        (part / "model.gguf.part").write_bytes(gguf[i:i + PART_BYTES])
    import gguf as gguf_py

    shutil.copytree(Path(gguf_py.__file__).parent, folder / "site" / "gguf", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "data" / "manifest.json").write_text(json.dumps({
        "model": Path(args.model or smollm2_gguf()).name,
        "texts": {"A": args.packed, "B": args.paragraphs, "C": args.lines},
        "documents": {n: len(d) for n, d in documents.items()}, "shared_with_corpus": shared,
        "sentence_chars": SENTENCE_CHARS, "python": sys.version.split()[0]}, indent=1))
    print({n: len(d) for n, d in lists.items()}, "held out:", shared)


def documents(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def run(folder: Path, args) -> None:
    import torch

    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="heal-grid-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="heal-grid-work-"))
    gguf = work / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(gguf, "wb") as f:
        for part in sorted(folder.glob("part*/model.gguf.part")):
            f.write(part.read_bytes())
    # dequantized once into a float32 folder (the same weights the GGUF loads as), so that no variant
    # dequantizes it again
    source = work / "original"
    opened = open_checkpoint(gguf)
    opened.model(dtype=torch.float32).save_pretrained(source)
    opened.tokenizer.save_pretrained(source)
    started = time.time()
    texts = {n: folder / "data" / f"text-{n}.jsonl" for n in "ABC"}
    result = {"manifest": json.loads((folder / "data" / "manifest.json").read_text()), "tokens": args.tokens,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "eval": {"seq_len": args.seq_len, "tokens": args.eval_tokens}, "models": {}}

    def save(name: str, scored: dict, seconds: float, **extra) -> None:
        result["models"][name] = {**scored, "seconds": round(seconds, 1), **extra}
        result["elapsed_s"] = round(time.time() - started, 1)
        (out / "grid.json").write_text(json.dumps(result, indent=1, default=str))
        (out / "grid.md").write_text(table(result))
        print(f"{time.time() - started:6.0f} s  {name}", flush=True)

    tick = time.time()
    converted = convert(source, work / "converted", alpha=0.25, strategy="calibrated",
                        calibration_data=str(folder / "data" / "calibration.jsonl"), progress=False)
    for name, ckpt in (("original", source), ("converted", converted)):
        save(name, score(ckpt, texts, args, generate=args.generate), time.time() - tick)
        tick = time.time()
    data = {name: documents(folder / "data" / f"{name}.jsonl") for name in ("train", "english")}
    per_variant = 0.0
    for name, settings in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        if args.budget_s and time.time() - started + per_variant > args.budget_s:
            print(f"skipped {name}: {args.budget_s - (time.time() - started):.0f} s left", flush=True)
            continue
        tick = time.time()
        settings = {**settings, "data": data[settings.get("data", "train")]}
        healed = work / f"healed-{len(result['models'])}"
        heal(converted, source, healed, tokens=args.tokens, perplexity=False, eval_data=str(texts["A"]),
             eval_tokens=4096, progress=False, **settings)
        per_variant = max(per_variant, time.time() - tick)
        save(name, score(healed, texts, args, generate=args.generate), time.time() - tick,
             settings={**{k: v for k, v in settings.items() if k != "data"},
                       "data": VARIANTS[name].get("data", "train")})
        shutil.rmtree(healed)


def table(result: dict) -> str:
    models = result["models"]
    original = models["original"]
    rep0 = original["generation"]["repeated_4gram_share"] if "generation" in original else None
    lines = [f"Heal variants on {result['device']} (torch {result['torch']}), {result['tokens']:,} heal tokens each; "
             f"texts scored on {result['eval']['tokens']:,} tokens in windows of {result['eval']['seq_len']}",
             "", "| model | " + " | ".join(f"{t} packed | {t} per document" for t in "ABC") + " | repeated 4-grams |",
             "| --- " * 8 + "|"]
    for name, m in models.items():
        cells = [f"{m[t][mode]:.3f} ({m[t][mode] / original[t][mode]:.3f}x)" for t in "ABC"
                 for mode in ("packed", "per_document")]
        rep = m["generation"]["repeated_4gram_share"] if rep0 is not None else None
        repeated = "—" if rep is None else f"{rep:.3f} ({rep / rep0 if rep0 else float('inf'):.2f}x)"
        lines.append(f"| {name} | {' | '.join(cells)} | {repeated} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("prepare", "run"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--packed", nargs="+",
                        default=[f"/usr/share/common-licenses/{n}" for n in ("GPL-3", "Apache-2.0")])
    parser.add_argument("--paragraphs", help="prepare: glob of .txt/.rst sources whose paragraphs are text B")
    parser.add_argument("--lines", help="prepare: text C, a file of one document per line")
    parser.add_argument("--model", default=None, help="prepare: the GGUF (default: SmolLM2's, fetched)")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-tokens", type=int, default=16_384)
    parser.add_argument("--tokens", type=int, default=TOKENS, help="run: heal tokens of each variant")
    parser.add_argument("--only", action="append", default=None, metavar="VARIANT", help="run: only these variants")
    parser.add_argument("--no-generate", dest="generate", action="store_false", help="run: no greedy continuations")
    parser.add_argument("--budget-s", type=float, default=None, help="run: start no variant that would end past this")
    args = parser.parse_args()
    if args.action == "prepare":
        if not (args.paragraphs and args.lines):
            parser.error("prepare needs --paragraphs and --lines")
        prepare(args.folder, args)
    else:
        run(args.folder, args)


if __name__ == "__main__":
    main()
