"""Healing: what a healed SmolLM2 is worth on text it never saw (perplexity packed and per document,
repetition of greedy continuations, the curve as healing goes on), heal variants side by side
(one GPU call), and what a heal costs (peak memory, a step against a training step).
"""

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import harness

LICENCES = [f"/usr/share/common-licenses/{n}" for n in ("GPL-3", "Apache-2.0")]  # text A by default


def held_out(packed: list[str], paragraphs: str, lines: str | None, count: int = 300) -> dict[str, list[str]]:
    """The held-out texts as documents: A (``packed`` files, each one document, in the order given),
    B (``count`` prose paragraphs of the files ``paragraphs`` matches) and C (a file of one document
    per line, when given)."""
    texts = {"A": [Path(f).read_text(encoding="utf-8") for f in packed], "B": harness.paragraphs(paragraphs, count)}
    if lines:
        texts["C"] = [line for line in Path(lines).read_text(encoding="utf-8").splitlines() if line.strip()]
    return texts


def score(ckpt, texts: dict, seq_len: int, eval_tokens: int, generate: bool) -> dict:
    """{text: {packed, per_document}} perplexities of ``ckpt`` on each of ``texts`` (name: JSON-lines
    file), and its greedy continuations when ``generate``."""
    from mixln_convert.evaluation.perplexity import score_checkpoint

    result = {}
    for i, (name, path) in enumerate(texts.items()):
        scored = score_checkpoint(ckpt, data=path, seq_len=seq_len, max_tokens=eval_tokens, per_document=True,
                                  generate=generate and i == 0, progress=False)
        result[name] = {"packed": scored.perplexity, "per_document": scored.per_document.token_perplexity,
                        "tokens": scored.tokens, "documents": scored.per_document.documents}
        if scored.generation:
            result["generation"] = scored.to_dict()["generation"]
    return result


def score_table(models: dict, texts) -> str:
    """Each model's perplexities (x the original's) and repeated 4-grams of its continuations."""
    original = models["original"]
    rep0 = original["generation"]["repeated_4gram_share"] if "generation" in original else None
    rows = []
    for name, m in models.items():
        cells = [f"{m[t][mode]:.3f} ({m[t][mode] / original[t][mode]:.3f}x)" for t in texts
                 for mode in ("packed", "per_document")]
        rep = m["generation"]["repeated_4gram_share"] if rep0 is not None else None
        rows.append([name, *cells, "—" if rep is None else f"{rep:.3f} ({rep / rep0 if rep0 else math.inf:.2f}x)"])
    header = [f"{t} {mode}" for t in texts for mode in ("packed", "per document")]
    return harness.table(["model", *header, "repeated 4-grams (x original)"], rows)


def quality(argv):
    """Is a healed SmolLM2 usable? Held-out perplexity (packed, per document) and repetition.

    Is it usable the way users score and read it: held-out perplexity, packed and per document, on
    texts the heal never saw, and how much greedy continuations repeat themselves, for the original,
    the calibrated conversion and the healed model.

    Text A (``--packed``, files; default Debian's GPL-3 and Apache-2.0 licence texts), text B
    (``--paragraphs``: prose paragraphs of 400-1200 characters cut from reStructuredText sources, 300
    chosen by a seeded draw, each one document) and text C (``--lines``: a file of one document per
    line, such as the Lee corpus of Australian news that gensim's wheel carries beside the Wikipedia
    extract of the embedded corpus) are each scored in packed windows of ``--seq-len`` and document
    by document from the first token (lm-eval's loglikelihood_rolling). Each text's documents are
    first checked against the embedded corpus: how many share a sentence of 60 or more characters
    with it (held out: none). The heal (`mixln_convert.healing.heal`, its defaults unless given)
    trains on the embedded corpus and evaluates on text A (or ``--curve-on``: another text, or the
    embedded validation split) at each of ``--checkpoints``: the curve. Generation: greedy 64-token
    continuations of the 24 fixed prompts of `mixln_convert.evaluation.generation`, their mean share
    of repeated 4-grams. Prints Markdown tables; ``--json`` keeps every figure and continuation.

    Measured with --paragraphs '<python3.11-doc>/usr/share/doc/python3.11/html/_sources/**/*.txt'
    --lines '<gensim-4.4.0 wheel>/gensim/test/test_data/lee_background.cor' (docs/measurements.md).
    """
    from mixln_convert.healing.options import HEAL_BATCH_SIZE, HEAL_LR
    from mixln_convert.options import SEQ_LEN

    p = harness.parser(quality)
    p.add_argument("--packed", nargs="+", default=LICENCES,
                   help="text A: files, each one document, scored packed and per document; the heal's curve")
    p.add_argument("--paragraphs", required=True, help="glob of .txt/.rst sources whose paragraphs are text B")
    p.add_argument("--paragraph-count", type=int, default=300, help="text B's paragraphs")
    p.add_argument("--lines", default=None, help="text C: a file of one document per line (default: none)")
    p.add_argument("--model", default=None, help="Pre-LN source (default: the SmolLM2 GGUF)")
    p.add_argument("--alpha", type=float, default=0.25)
    p.add_argument("--tokens", type=int, default=65_536, help="heal tokens (heal's default)")
    p.add_argument("--lr", type=float, default=HEAL_LR)
    p.add_argument("--heal-seq-len", type=int, default=SEQ_LEN, help="heal's training window length")
    p.add_argument("--heal-batch-size", type=int, default=HEAL_BATCH_SIZE, help="heal's windows per step")
    p.add_argument("--loss", default="kl")
    p.add_argument("--heal-data", nargs="+", default=None,
                   help="files the heal trains on, each one document (default: heal's, the embedded corpus)")
    p.add_argument("--checkpoints", default="16384,32768", help="heal token counts to evaluate the curve's text at")
    p.add_argument("--curve-on", choices=("A", "B", "C", "validation"), default="A",
                   help="the text heal evaluates (its curve); validation: the embedded validation split")
    p.add_argument("--seq-len", type=int, default=512, help="packed window length and per-document window")
    p.add_argument("--eval-tokens", type=int, default=16_384, help="tokens scored per text and mode")
    p.add_argument("--json", type=Path, default=None, help="write every figure and continuation here")
    args = p.parse_args(argv)
    from mixln_convert import convert
    from mixln_convert.data.corpus import SHARES
    from mixln_convert.healing import heal

    src = harness.source(args.model)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        documents = held_out(args.packed, args.paragraphs, args.lines, args.paragraph_count)
        if args.curve_on not in (*documents, "validation"):
            sys.exit(f"--curve-on {args.curve_on}: text {args.curve_on} not given")
        shared = {name: sum(map(harness.in_corpus, docs)) for name, docs in documents.items()}
        texts = {name: harness.write_jsonl(tmp / f"text-{name}.jsonl", docs) for name, docs in documents.items()}

        converted = convert(src, tmp / "converted", alpha=args.alpha, strategy="calibrated", progress=False)
        healed = tmp / "healed"
        heal_data = [Path(f).read_text(encoding="utf-8") for f in args.heal_data] if args.heal_data else None
        heal_result = heal(converted, src, healed, data=heal_data, tokens=args.tokens, lr=args.lr,
                           seq_len=args.heal_seq_len, batch_size=args.heal_batch_size, loss=args.loss,
                           eval_data=texts.get(args.curve_on), eval_tokens=args.eval_tokens,
                           eval_at=[int(t) for t in args.checkpoints.split(",") if t], progress=False)
        curve = [json.loads(line) for line in (healed / "heal_metrics.jsonl").read_text().splitlines()]
        models = {name: score(ckpt, texts, args.seq_len, args.eval_tokens, generate=True)
                  for name, ckpt in (("original", src), ("converted", converted), ("healed", healed))}

    mix = ", ".join(f"{name} {share:.0%}" for name, share in SHARES.items())
    text_c = f", C: {args.lines} ({len(documents['C'])} documents)" if args.lines else ""
    print(f"\n{Path(src).name}, alpha {args.alpha} calibrated, heal {args.loss} lr {args.lr} on "
          f"{', '.join(args.heal_data) if args.heal_data else f'the embedded corpus ({mix} of its characters)'}, "
          f"{heal_result.tokens:,} tokens in steps of {args.heal_batch_size} x {args.heal_seq_len} "
          f"({heal_result.seconds:.0f} s); A: {', '.join(args.packed)} ({len(documents['A'])} documents), "
          f"B: {len(documents['B'])} paragraphs of {args.paragraphs}{text_c}; {args.eval_tokens:,} tokens "
          f"per text and mode, windows of {args.seq_len}; total {time.time() - started:.0f} s")
    print("held out: " + ", ".join(f"{name} {shared[name]} of {len(documents[name])} documents" for name in texts)
          + f" share a sentence of {harness.SENTENCE_CHARS}+ characters with the embedded corpus\n")
    print(score_table(models, texts))
    teacher = heal_result.perplexity.teacher, heal_result.per_document_perplexity.teacher
    on = args.curve_on
    print(f"\nHeal curve on {on} (windows of heal's {args.heal_seq_len} tokens; mid-run points at a learning rate "
          "not yet annealed):\n")
    print(harness.table(["heal tokens", f"{on} packed (x original)", f"{on} per document (x original)"], [
        [f"{r['tokens']:,}", f"{r['val_ppl'] / teacher[0]:.3f}x", f"{r['val_doc_ppl'] / teacher[1]:.3f}x"]
        for r in curve if "val_ppl" in r]))
    print("\nFirst continuations (greedy, 64 tokens):\n")
    for i in range(3):
        print(f"- **{models['original']['generation']['continuations'][i]['prompt']}**")
        for name, m in models.items():
            print(f"  - {name}: {m['generation']['continuations'][i]['text']!r}")
    harness.write_json(args.json, {"args": vars(args), "heal": heal_result, "curve": curve, "models": models})


GRID_TOKENS = 65_536
GRID_PART_BYTES = 56 * 2**20  # and the checkout (~5 MB) under the 64 MiB a device call carries
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


def grid(argv):
    """Heal variants side by side, in one GPU call.

    Each variant heals the same calibrated conversion of SmolLM2 on 65,536 tokens (the default
    budget) and is scored as the quality case scores (texts A, B, C packed and per document,
    repeated 4-grams of greedy continuations), with a second seed of the default to show the
    noise. Measured per variant (heal and scoring): ~45 min on this project's 2-core CPU, 83-92 s
    on an H200 (benchmarks/results/heal_grid_2026-12-04/).

        here:   python -m benchmarks heal grid prepare .gpu/heal --paragraphs '<python3.11-doc>/**/*.txt' \\
                    --lines <gensim wheel>/gensim/test/test_data/lee_background.cor
                (data/: the held-out texts and this machine's embedded corpus splits; part0/, part1/: the
                GGUF in two parts, since a device call carries at most 64 MiB, so part0 goes in a first
                call and the rest in a second while the machine stays warm; site/: gguf-py)
        there:  PYTHONPATH=.gpu/heal/site python -m benchmarks heal grid run .gpu/heal [--budget-s 400]

    The corpus is written here, not read there: its docstring third comes from the running Python's
    standard library, and the device's Python is another release. $OUT gets grid.json (rewritten after
    each variant, so a stopped call keeps what finished) and grid.md.
    """
    p = harness.parser(grid)
    p.add_argument("action", choices=("prepare", "run"))
    p.add_argument("folder", type=Path)
    p.add_argument("--packed", nargs="+", default=LICENCES)
    p.add_argument("--paragraphs", help="prepare: glob of .txt/.rst sources whose paragraphs are text B")
    p.add_argument("--paragraph-count", type=int, default=300, help="prepare: text B's paragraphs")
    p.add_argument("--lines", help="prepare: text C, a file of one document per line")
    p.add_argument("--model", default=None, help="prepare: the GGUF (default: SmolLM2's, fetched)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--eval-tokens", type=int, default=16_384)
    p.add_argument("--tokens", type=int, default=GRID_TOKENS, help="run: heal tokens of each variant")
    p.add_argument("--only", action="append", default=None, metavar="VARIANT", help="run: only these variants")
    p.add_argument("--no-generate", dest="generate", action="store_false", help="run: no greedy continuations")
    p.add_argument("--budget-s", type=float, default=None, help="run: start no variant that would end past this")
    args = p.parse_args(argv)
    if args.action == "prepare":
        if not (args.paragraphs and args.lines):
            p.error("prepare needs --paragraphs and --lines")
        grid_prepare(args.folder, args)
    else:
        out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="heal-grid-"))
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="heal-grid-work-") as work:  # ~1 GB: the models, a heal at a time
            grid_run(args.folder, Path(work), out, args)


def grid_prepare(folder: Path, args) -> None:
    import gguf as gguf_py

    from mixln_convert.data import embedded_corpus
    from mixln_convert.data.corpus import _shipped_english

    (folder / "data").mkdir(parents=True, exist_ok=True)
    documents = held_out(args.packed, args.paragraphs, args.lines, args.paragraph_count)
    shared = {name: sum(map(harness.in_corpus, docs)) for name, docs in documents.items()}
    train = embedded_corpus("train")
    english = {text for _, _, text in _shipped_english()}
    lists = {**{f"text-{n}": docs for n, docs in documents.items()}, "train": train,
             "english": [d for d in train if d in english], "calibration": embedded_corpus("calibration")}
    for name, docs in lists.items():
        harness.write_jsonl(folder / "data" / f"{name}.jsonl", docs)
    model = Path(harness.source(args.model))
    blob = model.read_bytes()
    for i in range(0, len(blob), GRID_PART_BYTES):
        part = folder / f"part{i // GRID_PART_BYTES}"
        part.mkdir(exist_ok=True)
        (part / "model.gguf.part").write_bytes(blob[i:i + GRID_PART_BYTES])
    shutil.copytree(Path(gguf_py.__file__).parent, folder / "site" / "gguf", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "data" / "manifest.json").write_text(json.dumps({
        "model": model.name, "texts": {"A": args.packed, "B": args.paragraphs, "C": args.lines},
        "documents": {n: len(d) for n, d in documents.items()}, "shared_with_corpus": shared,
        "sentence_chars": harness.SENTENCE_CHARS, "python": sys.version.split()[0]}, indent=1))
    print({n: len(d) for n, d in lists.items()}, "held out:", shared)


def grid_run(folder: Path, work: Path, out: Path, args) -> None:
    import torch

    from mixln_convert import convert
    from mixln_convert.healing import heal
    from mixln_convert.io.loader import open_checkpoint

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
        (out / "grid.md").write_text(
            f"Heal variants on {result['device']} (torch {result['torch']}), {result['tokens']:,} heal tokens each; "
            f"texts scored on {args.eval_tokens:,} tokens in windows of {args.seq_len}\n\n"
            + score_table(result["models"], texts) + "\n")
        print(f"{time.time() - started:6.0f} s  {name}", flush=True)

    tick = time.time()
    converted = convert(source, work / "converted", alpha=0.25, strategy="calibrated",
                        calibration_data=str(folder / "data" / "calibration.jsonl"), progress=False)
    for name, ckpt in (("original", source), ("converted", converted)):
        save(name, score(ckpt, texts, args.seq_len, args.eval_tokens, args.generate), time.time() - tick)
        tick = time.time()
    data = {name: [json.loads(line)["text"] for line in (folder / "data" / f"{name}.jsonl").read_text().splitlines()]
            for name in ("train", "english")}
    per_variant = 0.0
    for name, settings in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        if args.budget_s and time.time() - started + per_variant > args.budget_s:
            print(f"skipped {name}: {args.budget_s - (time.time() - started):.0f} s left", flush=True)
            continue
        tick = time.time()
        healed = work / f"healed-{len(result['models'])}"
        heal(converted, source, healed, tokens=args.tokens, perplexity=False, eval_data=str(texts["A"]),
             eval_tokens=4096, progress=False, **{**settings, "data": data[settings.get("data", "train")]})
        per_variant = max(per_variant, time.time() - tick)
        save(name, score(healed, texts, args.seq_len, args.eval_tokens, args.generate), time.time() - tick,
             settings={**settings, "data": settings.get("data", "train")})
        shutil.rmtree(healed)


def memory(argv):
    """Peak RSS of `heal` on a TinyLlama-1.1B-shaped model, its variants side by side.

    Builds a synthetic bf16 checkpoint of the shape (random weights), converts it with ``move`` at
    alpha 0.25 (TinyLlama: 5 of 22 blocks Post-LN), and heals it against it (default loss ``kl``, one
    step of ``--tokens`` tokens in windows of ``--seq-len``, the evaluations on ``--eval-tokens``) in
    a fresh process per run: REV from a temporary git worktree first on ``PYTHONPATH`` (with
    ``--before``: the float32 default and ``--activation-checkpointing``), then the installed package
    with the float32 default, with ``--activation-checkpointing`` and (unless ``--no-bf16``) with
    ``--dtype bf16``. Peak RSS is the OS's figure for the child (``wait4``'s ru_maxrss, its VmHWM),
    printed as a multiple of the model's float32 parameter bytes, beside each run's wall time.
    ``--repeat N`` runs the variants N times in turn (variant 1, 2, ..., then again), so that drift
    of the machine falls on all of them alike, and prints every run and the medians.
    """
    import contextlib

    p = harness.parser(memory)
    p.add_argument("--before", default=None, help="git revision of a 'before' version to run first")
    p.add_argument("--tokens", type=int, default=64, help="training tokens (one step)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--eval-tokens", type=int, default=64, help="held-out tokens")
    p.add_argument("--no-bf16", action="store_true", help="leave out the --dtype bf16 run (slow on CPUs)")
    p.add_argument("--shape", choices=harness.SHAPES, default="tinyllama-1.1b")
    p.add_argument("--no-checkpointing", action="store_true", help="leave out the --activation-checkpointing runs")
    p.add_argument("--repeat", type=int, default=1, help="rounds of all the variants, run in turn")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat: {args.repeat} is not a whole number of rounds >= 1")
    from mixln_convert import convert
    from mixln_convert.io.loader import open_checkpoint

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        harness.synthetic_checkpoint(work / "source", args.shape, "2GB")
        source = open_checkpoint(work / "source")
        fp32_bytes = 4 * sum(math.prod(source.shape(name)) for name in source.names())
        convert(work / "source", work / "converted", alpha=0.25, strategy="move", progress=False)
        heal = [*harness.CLI, "heal", work / "converted", "--teacher", work / "source", "--tokens", args.tokens,
                "--seq-len", args.seq_len, "--batch-size", args.batch_size, "--eval-tokens", args.eval_tokens]
        variants = {"fp32": []}  # name: extra arguments
        if not args.no_checkpointing:
            variants["fp32, --activation-checkpointing"] = ["--activation-checkpointing"]
        versions = {}  # name: (extra arguments, environment)
        if args.before:
            versions |= {f"before ({args.before}), {name}": (extra, {"PYTHONPATH": str(work / "before")})
                         for name, extra in variants.items()}
        versions |= {f"after (installed), {name}": (extra, {}) for name, extra in variants.items()}
        if not args.no_bf16:
            versions["after (installed), --dtype bf16"] = (["--dtype", "bf16"], {})
        runs = {name: [] for name in versions}
        with harness.worktree(args.before, work / "before") if args.before else contextlib.nullcontext():
            for round_ in range(args.repeat):
                for n, (name, (extra, env)) in enumerate(versions.items()):
                    env = {**os.environ, "MIXLN_CONVERT_CACHE": str(work / f"cache-{n}"), **env}
                    out = work / f"healed-{n}-{round_}"
                    runs[name].append(harness.run([*heal, *extra, "--out", out], env)[:2])
                    shutil.rmtree(out, ignore_errors=True)  # the next round writes its own
                    seconds, peak = runs[name][-1]
                    print(f"round {round_ + 1}, {name}: {seconds:.0f} s, {peak / 2**30:.2f} GiB", file=sys.stderr)
    steps = args.tokens // (args.batch_size * args.seq_len)
    print(f"\n`heal` of {args.shape}'s shape (move, alpha 0.25), {steps} step(s) of {args.batch_size} x {args.seq_len} "
          f"tokens, {args.eval_tokens} held-out tokens; float32 parameter bytes {fp32_bytes / 2**30:.2f} GiB; "
          f"{args.repeat} round(s), medians (every run's figure in brackets)\n")
    rows = []
    for name, measured in runs.items():
        seconds, peaks = [m[0] for m in measured], [m[1] for m in measured]
        every = f" ({', '.join(f'{p / 2**30:.2f}' for p in peaks)})" if len(peaks) > 1 else ""
        every_s = f" ({', '.join(f'{x:.0f}' for x in seconds)})" if len(seconds) > 1 else ""
        rows.append([name, f"{statistics.median(peaks) / 2**30:.2f}{every}",
                     f"{statistics.median(peaks) / fp32_bytes:.2f}", f"{statistics.median(seconds):.0f}{every_s}"])
    print(harness.table(["version", "peak RSS GiB", "x fp32 parameter bytes", "wall time s"], rows))


def step(argv):
    """Cost of a heal step (KL and residual loss) against a training step of the same model.

    Side by side in one run: a random model of a published shape is saved, converted with ``move`` at alpha 0.25, and, round
    after round (so that machine load falls on both alike):

    - heal: ``heal()`` itself for ``--steps`` + 1 steps on random tokens, with the ``kl`` loss and
      with ``residual``; a step's time is the difference of consecutive ``seconds`` in its
      heal_metrics.jsonl (the first step, which warms up, is left out; the evaluations fall outside
      these differences);
    - train: forward, backward and AdamW of the whole Pre-LN model, every parameter trainable, on
      windows of the same shape, ``--steps`` steps (one warm-up step in the first round).

    It also times, on the heal's own models (``load_pair``), the parts of a heal step: the teacher's
    forward without gradients, and the student's forward and backward with the teacher left out.
    Prints the medians and the ratios heal / train (KL: limit 1.1; residual: against k/L, which a
    step through the k blocks alone would cost); ``--json`` keeps them (benchmarks/results/heal_step.json).
    """
    p = harness.parser(step)
    p.add_argument("--shape", choices=harness.SHAPES, default="smollm2-135m")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per round and kind")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    from mixln_convert import convert
    from mixln_convert.healing.losses import distribution_kl
    from mixln_convert.io.loader import open_checkpoint
    from mixln_convert.surgery.shared_tail import load_pair

    limit = 1.1
    tokenizer = harness.docstring_tokenizer(min(1024, harness.SHAPES[args.shape]["vocab_size"]))
    stream = np.random.default_rng(0).integers(0, len(tokenizer), 1 << 16).astype(np.int64)
    batches = torch.from_numpy(stream[: args.steps * args.batch * args.seq_len].copy()).view(
        args.steps, args.batch, args.seq_len)

    def heal_steps(loss: str) -> list[float]:
        return heal_step_seconds(work, converted, stream, args.steps, args.batch, args.seq_len, loss=loss)

    def train_steps(steps) -> list[float]:
        return train_step_seconds(model, optimizer, steps)

    def parts(batch) -> dict:
        """Seconds of the teacher's forward, and of the student's forward + KL + backward (against fixed logits)."""
        with torch.no_grad():
            teacher_s, target = harness.timed(lambda: teacher(input_ids=batch).logits)
        student_s, _ = harness.timed(lambda: distribution_kl(student(input_ids=batch).logits, target).backward())
        student.zero_grad()
        return {"teacher_forward": teacher_s, "student_forward_backward": student_s}

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        harness.random_source(work / "source", args.shape, tokenizer)
        converted = convert(work / "source", work / "converted", alpha=0.25, strategy="move", progress=False)
        source = open_checkpoint(work / "source")
        model = source.model(dtype=torch.float32).requires_grad_(True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_steps(batches[:1])  # warm-up: allocator, AdamW state
        times = {"heal": [], "heal_residual": [], "train": [], "teacher_forward": [], "student_forward_backward": []}
        student_source = open_checkpoint(converted)
        k = student_source.config["post_ln_layers"]
        student, teacher, _ = load_pair(student_source, source, source.arch, k)
        for _ in range(args.rounds):
            times["heal"] += heal_steps("kl")
            times["heal_residual"] += heal_steps("residual")
            times["train"] += train_steps(batches)
            for name, seconds in parts(batches[0]).items():
                times[name].append(seconds)

    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["heal"] / median["train"]
    residual_ratio = median["heal_residual"] / median["train"]
    k_over_l = k / source.config["num_hidden_layers"]
    print(f"{args.shape}, {k} Post-LN blocks, batch {args.batch} x {args.seq_len}: KL heal step "
          f"{median['heal']:.2f} s vs train step {median['train']:.2f} s, ratio {ratio:.3f} "
          f"({'ok' if ratio <= limit else 'ABOVE'} the {limit} limit); residual heal step {median['heal_residual']:.2f} s, "
          f"ratio {residual_ratio:.3f} (k/L = {k_over_l:.3f}); parts of a KL heal step: teacher forward "
          f"{median['teacher_forward']:.2f} s, student forward + backward {median['student_forward_backward']:.2f} s")
    harness.write_json(args.json, {
        "ratio": round(ratio, 4), "limit": limit, "residual_ratio": round(residual_ratio, 4),
        "k_over_L": round(k_over_l, 4), "median_s": {k: round(v, 4) for k, v in median.items()},
        "shape": args.shape, "post_ln_layers": k, "batch": args.batch, "seq_len": args.seq_len, "device": "cpu",
        "threads": torch.get_num_threads(), "rounds": args.rounds, "steps_per_round": args.steps,
        "torch": torch.__version__})


def heal_step_seconds(work: Path, converted: Path, stream, steps: int, batch: int, seq_len: int,
                      **settings) -> list[float]:
    """Seconds of each of ``steps`` steps of ``heal()`` itself (``work / "source"`` the teacher), one step more
    run first to warm up: the differences of consecutive ``seconds`` in its heal_metrics.jsonl (the
    evaluations fall outside them)."""
    from mixln_convert.healing import heal

    out = work / f"healed-{time.monotonic_ns()}"
    heal(converted, work / "source", out, data=stream, tokens=(steps + 1) * batch * seq_len, seq_len=seq_len,
         batch_size=batch, eval_tokens=seq_len, perplexity=False, progress=False, **settings)
    seconds = [json.loads(line).get("seconds", 0.0) for line in (out / "heal_metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out)
    return [b - a for a, b in zip(seconds[1:], seconds[2:])]


def train_step_seconds(model, optimizer, batches, bf16: bool = False) -> list[float]:
    """Seconds of a training step (forward, backward, AdamW of every parameter) on each of ``batches``;
    ``bf16``: the forward under bf16 autocast over the float32 masters, as the trainer's bf16 precision runs it."""
    import torch

    def one(batch):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return [harness.timed(lambda: one(batch))[0] for batch in batches]


def speed(argv):
    """Heal and train tokens/s side by side, in fp32 and bf16.

    A random model of a published shape (default SmolLM2-135M's) is saved and converted with ``move``
    at alpha 0.25; then, round after round (so that machine load falls on all alike), at the heal's
    default window (``--batch`` x ``--seq-len``): ``heal()`` itself with the ``kl`` loss in ``--dtype
    fp32`` and ``bf16`` (``--steps`` steps each, timed as the ``step`` case times them), and a training
    step of the Pre-LN model (forward, backward and AdamW of every parameter) in fp32 and under bf16
    autocast over float32 masters (the trainer's ``precision: bf16``). Prints the medians as tokens/s,
    heal / train per dtype (FLOPs say ~0.75: a teacher forward, 2N a token, on a training step's 6N)
    and bf16 / fp32 per kind, under a header with the CPU, its bf16 instructions (lscpu) and the load
    average at the start and the end; ``--json`` keeps every step's time.
    """
    from mixln_convert.healing.options import HEAL_BATCH_SIZE
    from mixln_convert.options import SEQ_LEN

    p = harness.parser(speed)
    p.add_argument("--shape", choices=harness.SHAPES, default="smollm2-135m")
    p.add_argument("--batch", type=int, default=HEAL_BATCH_SIZE)
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="timed steps per round and kind")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    from mixln_convert import convert
    from mixln_convert.io.loader import open_checkpoint
    from mixln_convert.training.loop import adamw

    started = harness.machine()
    tokenizer = harness.docstring_tokenizer(min(1024, harness.SHAPES[args.shape]["vocab_size"]))
    stream = np.random.default_rng(0).integers(0, len(tokenizer), 1 << 16).astype(np.int64)
    batches = torch.from_numpy(stream[: args.steps * args.batch * args.seq_len].copy()).view(
        args.steps, args.batch, args.seq_len)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        harness.random_source(work / "source", args.shape, tokenizer)
        converted = convert(work / "source", work / "converted", alpha=0.25, strategy="move", progress=False)
        model = open_checkpoint(work / "source").model(dtype=torch.float32).requires_grad_(True)
        optimizer = adamw([{"params": list(model.parameters())}], betas=(0.9, 0.95))
        train_step_seconds(model, optimizer, batches[:1])  # warm-up: allocator, AdamW state
        kinds = {f"{kind} {dtype}": (kind, dtype) for kind in ("heal", "train") for dtype in ("fp32", "bf16")}
        times = {name: [] for name in kinds}
        for _ in range(args.rounds):
            for name, (kind, dtype) in kinds.items():
                times[name] += (heal_step_seconds(work, converted, stream, args.steps, args.batch, args.seq_len,
                                                  loss="kl", dtype=dtype) if kind == "heal" else
                                train_step_seconds(model, optimizer, batches, bf16=dtype == "bf16"))
    ended = harness.machine()
    rate = {name: args.batch * args.seq_len / statistics.median(t) for name, t in times.items()}
    print(f"\n{args.shape} (move, alpha 0.25), steps of {args.batch} x {args.seq_len} tokens, {args.rounds} rounds of "
          f"{args.steps} steps per kind, {torch.get_num_threads()} threads; {started['cpu']}; load average "
          f"{started['load']} at the start, {ended['load']} at the end\n")
    print(harness.table(["kind", "tokens/s (median)", "step s (each)", "x fp32"], [
        [name, f"{rate[name]:.1f}", ", ".join(f"{t:.1f}" for t in times[name]),
         f"{rate[name] / rate[name.replace('bf16', 'fp32')]:.2f}x"] for name in times]))
    print("\nheal / train tokens/s: " + ", ".join(f"{d} {rate[f'heal {d}'] / rate[f'train {d}']:.3f}"
                                                 for d in ("fp32", "bf16")) + " (FLOPs: ~0.75)")
    harness.write_json(args.json, {"args": vars(args), "start": started, "end": ended, "tokens_per_s": rate,
                                   "step_seconds": times, "threads": torch.get_num_threads(),
                                   "torch": torch.__version__})


CASES = {
    "quality": harness.Case(quality, "~30-60 min (heal ~15 min)", [
        "--paragraphs", "docs/*.md", "--paragraph-count", "20", "--tokens", "1024", "--checkpoints", "512",
        "--seq-len", "128", "--eval-tokens", "512"], needs="--paragraphs"),
    "grid": harness.Case(grid, "~45 min a variant, 9 variants (H200: ~90 s a variant)", None,
                         needs="prepare here, run on the GPU machine"),
    "memory": harness.Case(memory, "~15 min", ["--shape", "tiny", "--no-bf16"]),
    "step": harness.Case(step, "~5 min", ["--shape", "tiny", "--rounds", "1", "--seq-len", "64"]),
    "speed": harness.Case(speed, "~20 min", ["--shape", "tiny", "--rounds", "1", "--seq-len", "64", "--steps", "1"]),
}
