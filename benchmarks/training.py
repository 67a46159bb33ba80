"""Training: a Mix-LN train step against LLaMA's, the memory estimate against a measured step, a
whole `train` run before and after a change, a checkpoint's checksums, and data at scale
(tokenizing gigabytes, each rank's memory in a 2-process run).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import harness


def step(argv):
    """Train-step time of Mix-LN against HF's LlamaForCausalLM on the same shapes (CPU).

    One train step is forward, backward and an AdamW update on random tokens. The two models are
    timed alternately, round after round, so that machine load falls on both alike; the ratio of the
    median step times is printed (``--json``: and kept, benchmarks/results/train_step.json). Mix-LN
    makes floor(alpha * L) blocks Post-LN: one RMSNorm more per such block, nothing else, so the
    ratio should be ~1 (the check is <= 1.05). The vocabulary is small (8192) so that the blocks,
    not the LM head, dominate the step.
    """
    p = harness.parser(step)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--alpha", type=float, default=0.25)
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds; each times --steps steps per model")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixln_convert.conversion.layout import post_ln_count
    from mixln_convert.model.configuration_mixln import MixLNConfig
    from mixln_convert.model.modeling_mixln import MixLNForCausalLM

    limit = 1.05
    shape = dict(vocab_size=8192, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                 num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                 num_key_value_heads=args.hidden // 64, max_position_embeddings=args.seq_len)
    n_post = post_ln_count(args.layers, args.alpha)
    torch.manual_seed(0)
    models = {"llama": LlamaForCausalLM(LlamaConfig(**shape)),
              "mixln": MixLNForCausalLM(MixLNConfig(**shape, post_ln_layers=n_post, alpha=args.alpha))}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    tokens = torch.randint(0, shape["vocab_size"], (args.batch, args.seq_len))

    def steps(name: str, count: int):
        def run():
            for _ in range(count):
                models[name](input_ids=tokens, labels=tokens).loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad()
        return run

    harness.alternate({name: steps(name, 1) for name in models}, 1)  # warm-up: allocator, AdamW state
    times = harness.alternate({name: steps(name, args.steps) for name in models}, args.rounds)
    median = {name: statistics.median(t) / args.steps for name, t in times.items()}
    ratio = median["mixln"] / median["llama"]
    print(f"{args.layers} layers, hidden {args.hidden}, batch {args.batch} x {args.seq_len} tokens, {n_post} Post-LN: "
          f"train step Mix-LN {median['mixln'] * 1e3:.0f} ms vs LLaMA {median['llama'] * 1e3:.0f} ms, "
          f"ratio {ratio:.3f} ({'ok' if ratio <= limit else 'ABOVE'} the {limit} limit)")
    harness.write_json(args.json, {
        "ratio": round(ratio, 4), "limit": limit, "median_step_s": {k: round(v, 4) for k, v in median.items()},
        "shape": {**shape, "post_ln_layers": n_post, "batch": args.batch, "seq_len": args.seq_len},
        "device": "cpu", "threads": torch.get_num_threads(), "rounds": args.rounds, "steps_per_round": args.steps,
        "torch": torch.__version__})


def memory(argv):
    """The memory estimate (`mixln-convert estimate`) against one training step measured on CPU.

    The estimate is mixln_convert/training/memory.py's; the step is a published shape's with random
    weights. For fp32 and for CPU bf16 autocast (the casts GPU autocast makes too), in a fresh process each:
    the bytes autograd saves in one forward with the loss (every distinct storage, parameters left
    out, summed with ``torch.autograd.graph.saved_tensors_hooks``) beside the estimator's count; and
    the peak RSS of the forward and backward of a second step above the resident weights and AdamW
    state (VmHWM reset through /proc/self/clear_refs), beside the estimator's activations (with
    autocast's weight copies); the gradients the backward writes come as the activations go, so they
    add little to that peak.
    """
    p = harness.parser(memory)
    p.add_argument("--shape", choices=harness.SHAPES, default="smollm2-135m")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    args = p.parse_args(argv)
    from transformers import LlamaConfig

    from mixln_convert.training.memory import activation_bytes, model_shapes, saved_bytes

    with tempfile.TemporaryDirectory() as folder:
        LlamaConfig(**harness.SHAPES[args.shape]).save_pretrained(folder)
        shapes = model_shapes(folder)
    tokens = args.batch_size * args.seq_len
    print(f"{args.shape}, {shapes.parameters:,} parameters, {args.batch_size} x {args.seq_len} tokens; MB = 10^6 bytes")
    for precision, compute in (("fp32", 4), ("bf16", 2)):
        out = harness.run(harness.call(memory_step, args.shape, args.batch_size, args.seq_len, compute == 2))[2]
        measured = json.loads(out.splitlines()[-1])
        copies = 2 * shapes.matmul_parameters if compute == 2 else 0  # autocast's bf16 weight copies
        estimated = saved_bytes(shapes, tokens, compute) + copies
        peak = activation_bytes(shapes, tokens, compute, False) + copies
        print(f"{precision}: saved for backward {measured['saved'] / 1e6:.1f} MB measured, {estimated / 1e6:.1f} MB "
              f"estimated ({measured['saved'] / estimated:.3f}x); peak RSS of forward and backward above weights and "
              f"AdamW state {measured['peak_above_resident'] / 1e6:.1f} MB, estimated activations "
              f"{peak / 1e6:.1f} MB ({measured['peak_above_resident'] / peak:.3f}x)")


def memory_step(shape: str, batch: int, seq_len: int, bf16: bool) -> None:
    """The memory case's child: prints {saved, peak_above_resident} of a step, as JSON."""
    import torch

    from mixln_convert.runtime import map_large_allocations

    def status(key: str) -> int:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    map_large_allocations()  # freed tensors leave the resident set, as in the CLI
    model = harness.random_model(shape).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))
    autocast = lambda: torch.autocast("cpu", torch.bfloat16, enabled=bf16)  # noqa: E731
    saved = {}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in params:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()  # the first step also creates AdamW's state
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss
    resident = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    with autocast():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    print(json.dumps({"saved": sum(saved.values()), "peak_above_resident": status("VmHWM") - resident}))


def run(argv):
    """Wall time and peak RSS of a whole `train` run at REV (--before) and here, alternated.

    One whole run: convert, heal, both arms. REV is checked out into a temporary git worktree and run with it first on ``PYTHONPATH`` (its
    recipes are read from its own checkout: ``recipes/`` before they became package data); the
    other version is the installed package. Each run is a fresh process with its own output folder
    and token cache, so neither reuses the other's work; peak RSS is the OS's figure (``wait4``).
    """
    p = harness.parser(run)
    p.add_argument("--before", required=True, help="git revision of the 'before' version")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    sets = [f"--set={s}" for s in (args.sets or ["heal.tokens=4096"])]
    models = Path(os.environ.get("MIXLN_CONVERT_CACHE", Path.home() / ".cache" / "mixln-convert")) / "models"
    with tempfile.TemporaryDirectory() as work, harness.worktree(args.before, Path(work) / "before") as before:
        work = Path(work)
        versions = {f"before ({args.before})": ([*harness.CLI, "train", before / "recipes" / "smollm2-135m-cpu.yaml"],
                                                {"PYTHONPATH": str(before)}),
                    "after (installed)": ([*harness.CLI, "train", "smollm2-135m-cpu"], {})}
        runs = {name: [] for name in versions}
        for repeat in range(args.repeats):
            for name, (command, extra) in versions.items():
                side = name.split()[0]
                cache = work / f"cache-{repeat}-{side}"
                cache.mkdir()
                (cache / "models").symlink_to(models)  # the GGUF, not its derived caches
                env = {**os.environ, "MIXLN_CONVERT_CACHE": str(cache), **extra}
                runs[name].append(harness.run([*command, *sets, "--out", work / f"out-{repeat}-{side}"], env)[:2])
                print(f"{repeat} {name}: {runs[name][-1][0]:.1f} s, {runs[name][-1][1] / 2**30:.2f} GiB", file=sys.stderr)
    print(f"\n`train smollm2-135m-cpu {' '.join(sets)}` (convert, heal, both arms), {os.cpu_count()} CPUs, "
          f"{args.repeats} run(s) each, alternated\n")
    base = next(iter(runs.values()))
    base_s, base_r = statistics.median(s for s, _ in base), max(r for _, r in base)
    rows = []
    for name, measured in runs.items():
        seconds, peak = statistics.median(s for s, _ in measured), max(r for _, r in measured)
        rows.append([name, f"{seconds:.1f} ({', '.join(f'{s:.1f}' for s, _ in measured)})", f"{seconds / base_s:.2f}",
                     f"{peak / 2**30:.2f}", f"{peak / base_r:.2f}"])
    print(harness.table(["version", "wall s (runs)", "x before", "peak RSS GiB", "x before"], rows))


def checkpoint(argv):
    """What a training checkpoint's checksums cost: one file after another against several at once.

    Every file hashed one after another against `train`'s several at once
    (mixln_convert.training.trainer._sha256s), side by side in one run, on files written here
    (page-cached, so this measures the hashing, not the disk).
    """
    p = harness.parser(checkpoint)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--mib", type=int, default=256, help="size of each file")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from mixln_convert.data.shards import file_sha256
    from mixln_convert.training.trainer import _sha256s

    with tempfile.TemporaryDirectory() as tmp:
        files = {f"shard-{i}": Path(tmp) / f"shard-{i}" for i in range(args.files)}
        for path in files.values():
            path.write_bytes(os.urandom(args.mib << 20))
        expected = {name: file_sha256(path) for name, path in files.items()}  # warms the page cache

        def check(hashed):
            assert hashed == expected

        best = {label: min(t) for label, t in harness.alternate({
            "one after another": lambda: check({n: file_sha256(p) for n, p in files.items()}),
            "several at once": lambda: check(_sha256s(files))}, args.repeats).items()}
    total = args.files * args.mib / 1024
    print(f"{args.files} files of {args.mib} MiB ({total:.2f} GiB), {os.cpu_count()} cores, best of {args.repeats}:")
    for label, seconds in best.items():
        print(f"  {label}: {seconds:.2f} s ({total / seconds:.2f} GiB/s)")
    print(f"  several at once / one after another: {best['several at once'] / best['one after another']:.2f}x the time")


# A script that runs the CLI with argv and, at exit, writes its process's peak memory (VmHWM) to
# $PEAK_FILE.RANK; the guard keeps tokenize's spawned workers, which import it, from running it again.
PEAK = """
import atexit, os, sys
def peak():
    kib = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
    open(os.environ["PEAK_FILE"] + "." + os.environ.get("RANK", "0"), "w").write(str(kib * 1024))
if __name__ == "__main__":
    atexit.register(peak)
    from mixln_convert.cli import main
    sys.argv[0] = "mixln-convert"
    main()
"""
# The tokenizer's own batch encode of the corpus's first CHARS characters, in memory.
BASELINE = """
import json, sys, time
from pathlib import Path
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
texts, size = [], 0
for path in sorted(Path(sys.argv[2]).glob("*.jsonl")):
    for line in open(path):
        texts.append(json.loads(line)["text"])
        size += len(texts[-1])
        if size >= int(sys.argv[3]):
            break
    if size >= int(sys.argv[3]):
        break
rates = {}
for name, encode in (("transformers tokenizer(texts)", lambda b: tokenizer(b, add_special_tokens=False)),
                     ("tokenizers encode_batch_fast", lambda b: tokenizer.backend_tokenizer.encode_batch_fast(b, add_special_tokens=False))):
    start = time.perf_counter()
    for i in range(0, len(texts), 1024):
        encode(texts[i:i + 1024])
    rates[name] = size / (time.perf_counter() - start)
print(json.dumps({"chars": size, "rates": rates}))
"""


def data(argv):
    """Data at scale: `tokenize` throughput and memory at two corpus sizes, and each rank's in training.

    Side by side in one run: `mixln-convert tokenize` throughput against the tokenizer's own batch
    encode with the same N, peak memory of tokenizing at two corpus sizes, and each rank's peak
    memory in a 2-process (gloo) training run on either tokenized folder.

        cd /tmp && apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb debdoc
        python -m benchmarks training data --docs /tmp/debdoc/usr/share/doc --work /tmp/data-scale

    The corpora repeat the documentation's text files (each copy of a document prefixed with its copy
    number, so no two documents are equal) into JSON-lines files of `--sizes` GB. The tokenizer is
    SmolLM2-135M's (from the cached GGUF), saved into a tiny random LLaMA that the training runs use.
    """
    p = harness.parser(data)
    p.add_argument("--docs", type=Path, required=True, help="folder of documentation (its *.txt files)")
    p.add_argument("--work", type=Path, required=True, help="folder for corpora and tokenized folders")
    p.add_argument("--sizes", type=float, nargs="+", default=[0.2, 2.0], help="corpus sizes, GB of text")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--baseline-chars", type=int, default=50 * 10**6, help="text the baseline encodes")
    p.add_argument("--train-only", action="store_true",
                   help="only the training runs, on the tokenized folders an earlier run left in --work")
    args = p.parse_args(argv)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    texts = [t for t in (p.read_text(encoding="utf-8", errors="replace")
                         for p in sorted(args.docs.rglob("*.txt")) if p.is_file()) if t.strip()]
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f}M characters in {args.docs}")
    model = work / "tiny-smollm2"
    if not (model / "config.json").is_file():  # a model for the training runs, not a good one
        from mixln_convert.io.loader import open_checkpoint

        tokenizer = open_checkpoint(harness.source(None)).tokenizer
        harness.random_source(model, "tiny", tokenizer, vocab_size=len(tokenizer), num_hidden_layers=4)
    peak_file, script = work / "peak", work / "run_cli.py"  # a file: torchrun starts one
    script.write_text(PEAK)
    cli = [sys.executable, script]
    for size in args.sizes:
        corpus = build_corpus(texts, int(size * 10**9), work / f"corpus-{size}GB")
        chars, tokens = text_chars(corpus), work / f"tokens-{size}GB"
        tokenize = [*cli, "tokenize", corpus, "--tokenizer", model, "--out", tokens, "--num-proc", args.num_proc]
        if not args.train_only:
            if size == args.sizes[0]:
                env = {**os.environ, "RAYON_NUM_THREADS": str(args.num_proc), "TOKENIZERS_PARALLELISM": "true"}
                out = harness.run([sys.executable, "-c", BASELINE, model, corpus, args.baseline_chars], env)[2]
                rates = json.loads(out.strip().splitlines()[-1])
                for name, rate in rates["rates"].items():
                    print(f"baseline, {name}, {args.num_proc} threads, {rates['chars'] / 1e6:.0f}M chars in memory: "
                          f"{rate / 1e6:.2f}M chars/s")
            seconds, memory = measured([*tokenize, "--force"], peak_file)
            manifest = json.loads((tokens / "mixln-tokens.json").read_text())
            print(f"tokenize {size} GB ({chars / 1e6:.0f}M chars, {manifest['splits']['train']['tokens'] / 1e6:.0f}M train "
                  f"tokens, {manifest['splits']['validation']['tokens'] / 1e6:.1f}M validation), --num-proc "
                  f"{args.num_proc}: {seconds:.0f} s, {chars / seconds / 1e6:.2f}M chars/s end to end; peak RSS main "
                  f"{memory['peaks']['0'] / 2**20:.0f} MiB, workers {memory['others_polled_max'] / 2**20:.0f} MiB (polled)")
            before = {p.name: p.stat().st_mtime_ns for p in tokens.iterdir()}
            rerun, _ = measured(tokenize, peak_file)
            same = before == {p.name: p.stat().st_mtime_ns for p in tokens.iterdir()}
            print(f"  rerun on the same inputs: {rerun:.1f} s, {'nothing written' if same else 'FILES CHANGED'}")
        sets = [f"source={model}", f"data.train={tokens}", "data.validation=null", "seq_len=64", "micro_batch_size=2",
                "global_batch_size=4", f"max_tokens={8 * 4 * 64}", "data.eval_tokens=1024", "precision=fp32",
                "schedule.warmup_steps=1", "eval_interval=8", "checkpoint_interval=8"]
        out = work / f"train-{size}GB"
        shutil.rmtree(out, ignore_errors=True)
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", free_port(),
                script, "train", "smollm2-135m-cpu", *(f"--set={s}" for s in sets), "--arm", "preln", "--out", out]
        seconds, memory = measured(argv, peak_file, {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})
        ranks = ", ".join(f"rank {r} {v / 2**20:.0f} MiB" for r, v in sorted(memory["peaks"].items()))
        print(f"  train on it, 2 processes (gloo), 8 steps of 4 x 64 tokens: {seconds:.0f} s; peak RSS {ranks}")


def build_corpus(texts: list[str], size: int, folder: Path) -> Path:
    """JSON-lines files of ~100 MB holding ``size`` bytes of text, the documents repeated."""
    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    written, copy, part = 0, 0, None
    while written < size:
        for text in texts:
            if part is None or part.tell() > 10**8:
                part = open(folder / f"part-{copy:05d}.jsonl", "w")
            line = json.dumps({"text": f"(copy {copy}) {text}"}) + "\n"
            part.write(line)
            written += len(line)
            if written >= size:
                break
        copy += 1
    part.close()
    (folder / "done").write_text("")
    return folder


def text_chars(corpus: Path) -> int:
    return sum(len(json.loads(line)["text"]) for path in sorted(corpus.glob("*.jsonl")) for line in open(path))


def measured(argv: list, peak_file: Path, env: dict | None = None) -> tuple[float, dict]:
    """Wall seconds of ``argv`` and the peak memory of each process it starts: VmHWM of the processes
    running PEAK (by rank), and the polled RSS of the others (tokenize's workers); harness.run's
    wait4 sees one process only."""
    import psutil

    with tempfile.TemporaryFile() as err:  # a file, not a pipe, which a long log would fill and block
        start = time.perf_counter()
        proc = psutil.Popen([str(a) for a in argv], env={**os.environ, **(env or {}), "PEAK_FILE": str(peak_file)},
                            stdout=subprocess.DEVNULL, stderr=err)
        polled = {}
        while proc.poll() is None:
            try:
                for child in proc.children(recursive=True):
                    polled[child.pid] = max(polled.get(child.pid, 0), child.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.2)
        seconds = time.perf_counter() - start
        if proc.returncode:
            err.seek(0)
            sys.exit(f"{' '.join(map(str, argv))} failed:\n{err.read().decode(errors='replace')[-3000:]}")
    files = list(peak_file.parent.glob(peak_file.name + ".*"))
    peaks = {p.name.rsplit(".", 1)[1]: int(p.read_text()) for p in files}
    for p in files:
        p.unlink()
    return seconds, {"peaks": peaks, "others_polled_max": max(polled.values(), default=0)}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = {
    "step": harness.Case(step, "~2 min", ["--layers", "2", "--hidden", "64", "--seq-len", "32", "--rounds", "1",
                                          "--steps", "1"]),
    "memory": harness.Case(memory, "~1 min", ["--shape", "tiny", "--seq-len", "32"]),
    "run": harness.Case(run, "~25 min", None, needs="--before REV"),
    "checkpoint": harness.Case(checkpoint, "~1 min", ["--files", "2", "--mib", "8", "--repeats", "1"]),
    "data": harness.Case(data, "~1 h", ["--docs", "/usr/share/doc", "--work", "{tmp}", "--sizes", "0.001",
                                                          "--baseline-chars", "100000"], needs="--docs, --work"),
}
