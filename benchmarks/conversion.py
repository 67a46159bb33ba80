"""Conversion and calibration: what a conversion costs (time and memory against `cp -r` and
transformers, a sweep's conversions against one) and what it does to the model before any
training (perplexity per strategy, where the calibrated conversion loses); and opening a GGUF.
"""

import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from . import harness
from .harness import CLI

GiB = 2**30


def speed(argv):
    """Conversion speed and memory against the disk (`cp -r`) and against transformers.

    Writes a synthetic LLaMA-shaped checkpoint with random bf16 weights (tensor by tensor, no
    model), then times, side by side and alternately, each in a subprocess of its own:

    - ``cp -r`` of the checkpoint folder (the disk's speed);
    - ``mixln-convert convert`` with ``move`` at alpha 0.25 and alpha 0 (pure streaming), and
      ``calibrated`` at alpha 0.25 with a tiny calibration budget (1024 tokens);
    - transformers: ``from_pretrained``, the same ``move`` conversion in memory, ``save_pretrained``.

    Peak RSS is the OS's figure for each subprocess (``wait4``), so this process itself imports no
    torch. "cold" runs first drop the source's pages from the page cache (``posix_fadvise``; the
    host of a VM may still cache them), "warm" ones first read the source once. Times are wall
    times of whole commands, Python start and imports included. Prints a Markdown table.
    """
    sizes = {"tiny": ("tiny", "1MB"), "1b": ("tinyllama-1.1b", "500MB"), "7b": ("llama2-7b", "2GB")}  # shape, shard
    methods = {  # name: (what the table calls it, command given SRC and DST)
        "startup": ("python + torch import alone (in every convert row)",
                    lambda src, dst: [sys.executable, "-c", "import mixln_convert.conversion.converter"]),
        "cp": ("cp -r", lambda src, dst: ["cp", "-r", src, dst]),
        "move": ("convert: move, alpha 0.25", lambda src, dst: [*CLI, "convert", src, dst, "--strategy", "move",
                                                                 "--alpha", "0.25"]),
        "alpha0": ("convert: alpha 0", lambda src, dst: [*CLI, "convert", src, dst, "--strategy", "move", "--alpha", "0"]),
        "calibrated": ("convert: calibrated, alpha 0.25, 1024 tokens",
                       lambda src, dst: [*CLI, "convert", src, dst, "--alpha", "0.25", "--calibration-tokens", "1024"]),
        "transformers": ("transformers: load, move in memory, save",
                         lambda src, dst: harness.call(transformers_conversion, src, dst)),
    }
    p = harness.parser(speed)
    p.add_argument("--size", choices=sizes, default="1b")
    p.add_argument("--work", default="/tmp/mixln-bench", help="folder for the checkpoint (kept) and the outputs")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cache", default="cold,warm", help="page-cache states to measure: cold, warm or both")
    p.add_argument("--methods", default=",".join(methods), help="comma-separated subset of " + ",".join(methods))
    args = p.parse_args(argv)

    src, dst = Path(args.work) / f"llama-{args.size}", Path(args.work) / "out"
    if not src.is_dir():
        print(f"writing a synthetic {args.size} checkpoint to {src} ...", file=sys.stderr)
        harness.run(harness.call(harness.synthetic_checkpoint, src, *sizes[args.size]))
    shards = [p.stat().st_size for p in src.glob("*.safetensors")]
    names, caches = args.methods.split(","), args.cache.split(",")
    runs = {(m, c): [] for m in names for c in caches}
    for repeat in range(args.repeats):
        for cache in caches:
            for method in names:  # alternate methods, so that the machine's noise spreads over all
                shutil.rmtree(dst, ignore_errors=True)
                os.sync()  # the previous run's writes are not this run's to pay for
                for file in src.iterdir():
                    if cache == "cold":
                        fd = os.open(file, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    else:
                        with open(file, "rb") as f:
                            while f.read(64 * 2**20):
                                pass
                runs[method, cache].append(harness.run(methods[method][1](str(src), str(dst)))[:2])
                print(f"{repeat} {cache} {method}: {runs[method, cache][-1][0]:.1f} s", file=sys.stderr)
    shutil.rmtree(dst, ignore_errors=True)

    def median_s(method, cache):
        return statistics.median(s for s, _ in runs[method, cache]) if (method, cache) in runs else None

    rows = []
    for (method, cache), measured in runs.items():
        seconds, peak = median_s(method, cache), max(r for _, r in measured)
        ratios = [f"{seconds / median_s(o, cache):.2f}" if median_s(o, cache) else "-" for o in ("cp", "transformers")]
        rows.append([methods[method][0], cache, f"{seconds:.1f} ({', '.join(f'{s:.1f}' for s, _ in measured)})",
                     *ratios, f"{peak / GiB:.2f}", f"{(peak - max(shards)) / GiB:+.2f}"])
    print(f"\nSynthetic LLaMA {args.size} ({sum(shards) / GiB:.2f} GiB bf16 in {len(shards)} shards, largest "
          f"{max(shards) / GiB:.2f} GiB), {os.cpu_count()} CPUs, {args.repeats} runs each, median\n")
    print(harness.table(["method", "page cache", "wall s (runs)", "x cp -r", "x transformers", "peak RSS GiB",
                         "RSS - largest shard GiB"], rows))


def transformers_conversion(src: str, dst: str) -> None:
    """What a user without a streaming converter does: the whole model in memory, twice over."""
    import torch
    from transformers import AutoModelForCausalLM

    from mixln_convert.architectures import architecture_for
    from mixln_convert.conversion.layout import post_ln_count
    from mixln_convert.conversion.plan import ConversionPlan
    from mixln_convert.io.checkpoint import StoredTensor
    from mixln_convert.model.configuration_mixln import MixLNConfig
    from mixln_convert.model.modeling_mixln import MixLNForCausalLM

    class InMemory:  # the plan's view of a source: names(), shape(name), get(name), stored(name)
        def __init__(self, state):
            self.state = state

        def names(self):
            return list(self.state)

        def shape(self, name):
            return tuple(self.state[name].shape)

        def get(self, name):
            return self.state[name]

        def stored(self, name):
            return StoredTensor(self.state[name])

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    config = model.config.to_dict()
    n_post = post_ln_count(config["num_hidden_layers"], 0.25)
    plan = ConversionPlan(architecture_for(config, src), config, n_post, "move", dtype=torch.bfloat16)
    tensors = plan.tensors(InMemory(model.state_dict()))
    state = {name: t.tensor if isinstance(t, StoredTensor) else t for name, t in tensors}
    del model
    with torch.device("meta"):
        mixln = MixLNForCausalLM(MixLNConfig.from_dict({**config, "post_ln_layers": n_post, "alpha": 0.25}))
    mixln.load_state_dict(state, strict=True, assign=True)
    largest_shard = max(p.stat().st_size for p in Path(src).glob("*.safetensors"))  # as the converter shards
    mixln.save_pretrained(dst, max_shard_size=largest_shard)


def sweep(argv):
    """Cost of a sweep's conversions against one conversion at its largest alpha.

    Side by side in one process on warm caches (the source opened, dequantized and tokenized once
    before either is timed):

    - single: ``convert(src, alpha=max)``, which calibrates the first floor(max * L) blocks and writes;
    - sweep: ``calibration_statistics`` once for that many blocks, then ``convert(..., statistics=...)``
      for every alpha with a Post-LN block (what ``mixln-convert sweep`` does before healing,
      training and analysis; alpha 0 is the original model, which the sweep measures as such).

    Each is timed ``--repeats`` times, alternating, the fastest counted; the ratio is the figure.
    """
    p = harness.parser(sweep)
    p.add_argument("--model", help="HF folder or .gguf (default: the SmolLM2-135M GGUF)")
    p.add_argument("--alphas", default="0,0.0625,0.125,0.25,0.5")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    from mixln_convert.conversion.converter import calibration_statistics, convert
    from mixln_convert.conversion.layout import post_ln_count
    from mixln_convert.conversion.options import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS
    from mixln_convert.io.loader import open_checkpoint

    src = harness.source(args.model)
    alphas = [float(a) for a in args.alphas.split(",")]  # convert refuses one outside [0, 1]
    checkpoint = open_checkpoint(src)
    num_layers = checkpoint.config["num_hidden_layers"]
    largest = max(post_ln_count(num_layers, a, None) for a in alphas)
    with tempfile.TemporaryDirectory(prefix="sweep-cost-") as work:
        work = Path(work)
        convert(src, work / "warm-up", alpha=max(alphas), progress=False)  # loads, dequantizes, tokenizes

        def single():
            convert(src, work / "single", alpha=max(alphas), force=True, progress=False)

        def swept():
            stats = calibration_statistics(checkpoint, checkpoint.arch, largest, None, CALIBRATION_TOKENS,
                                           CALIBRATION_SEQ_LEN, False)
            for i, alpha in enumerate(alphas):  # as the sweep: alpha 0 is the original, nothing to convert
                if post_ln_count(num_layers, alpha, None):
                    convert(src, work / f"alpha-{i}", alpha=alpha, statistics=stats, force=True, progress=False)

        fastest = {name: min(t) for name, t in harness.alternate({"single": single, "sweep": swept}, args.repeats).items()}
    print(f"{src}: {num_layers} layers; alphas {args.alphas} (largest: {largest} Post-LN blocks); "
          f"fastest of {args.repeats}")
    print(f"one conversion at the largest alpha: {fastest['single']:.1f} s")
    print(f"the sweep's {len(alphas)} conversions, one calibration: {fastest['sweep']:.1f} s")
    print(f"ratio: {fastest['sweep'] / fastest['single']:.2f}x")


def strategies(argv):
    """Perplexity of SmolLM2-135M-Instruct before and after each conversion strategy (no training).

    Evaluates the original GGUF and a conversion per strategy on the same held-out tokens (default:
    the embedded validation split, which never overlaps the calibration split) and prints a
    Markdown table with the ratio to the original, the figures quoted in the README.
    """
    p = harness.parser(strategies)
    p.add_argument("--alpha", type=float, default=0.25)
    p.add_argument("--data", default=None, help="held-out text (default: embedded validation split)")
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--strategies", default="calibrated,move,reinit-post,scratch")
    args = p.parse_args(argv)
    from mixln_convert import convert, evaluate_perplexity, load_model, load_tokenizer
    from mixln_convert.data import read_texts, token_windows

    gguf = harness.source(None)
    windows = token_windows(load_tokenizer(gguf), read_texts(args.data, split="validation"), args.seq_len,
                            args.windows * args.seq_len)
    rows = [("none (original Pre-LN)", evaluate_perplexity(load_model(gguf), windows).perplexity, 0.0)]
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies.split(","):
            seconds, out = harness.timed(lambda: convert(gguf, Path(tmp) / strategy, alpha=args.alpha, strategy=strategy))
            rows.append((strategy, evaluate_perplexity(load_model(out), windows).perplexity, seconds))
    base = rows[0][1]
    print(f"\nSmolLM2-135M-Instruct, alpha {args.alpha}, {windows.numel()} held-out tokens "
          f"({args.data or 'embedded validation split'})\n")
    print(harness.table(["conversion", "perplexity", "x original", "convert time (s)"],
                        [[name, f"{ppl:,.2f}", f"{ppl / base:.2f}x", f"{seconds:.0f}"] for name, ppl, seconds in rows]))


def gap(argv):
    """Where the calibrated conversion loses, per document: excess loss by position, and patches.

    What would the first Pre-LN block need from the Post-LN blocks to recover the loss? Converts the SmolLM2 GGUF (calibrated, defaults), then scores ``--documents`` of heal quality's
    text-B paragraphs one by one from their first token (up to 512 tokens each) with the original and
    the converted model. Table 1: mean next-token loss per position bucket and that bucket's share of
    the converted model's excess loss. Table 2: the converted model's per-document perplexity (over
    the original's) when the residual stream entering its first Pre-LN block is patched from the
    original's at the same point: a diagnosis, not a conversion.

    Measured with --paragraphs '<python3.11-doc>/usr/share/doc/python3.11/html/_sources/**/*.txt'.
    """
    p = harness.parser(gap)
    p.add_argument("--paragraphs", required=True, help="glob of .txt/.rst sources whose paragraphs are text B")
    p.add_argument("--paragraph-count", type=int, default=300, help="paragraphs drawn (the first --documents are scored)")
    p.add_argument("--alpha", type=float, default=0.25)
    p.add_argument("--documents", type=int, default=120)
    args = p.parse_args(argv)
    import json

    import torch
    import torch.nn.functional as F

    from mixln_convert import convert
    from mixln_convert.io.loader import open_checkpoint

    src = harness.source(None)
    original = open_checkpoint(src)
    tokenizer = original.tokenizer
    docs = [torch.tensor([tokenizer(d)["input_ids"][:512]])
            for d in harness.paragraphs(args.paragraphs, args.paragraph_count)[:args.documents]]
    with tempfile.TemporaryDirectory() as tmp:
        converted = convert(src, Path(tmp) / "converted", alpha=args.alpha, progress=False)
        student = open_checkpoint(converted).model()
    teacher = original.model()
    boundary = student.config.post_ln_layers

    def rescaled(x, norm_of):
        return x * norm_of.norm(dim=-1, keepdim=True) / x.norm(dim=-1, keepdim=True)

    patches = {  # name -> (converted stream, original stream) -> the stream the first Pre-LN block receives
        "none": lambda x, y: x,
        "position 0 from the original": lambda x, y: torch.cat([y[:, :1], x[:, 1:]], 1),
        "positions 0-3 from the original": lambda x, y: torch.cat([y[:, :4], x[:, 4:]], 1),
        "position 0: original's direction, converted norm":
            lambda x, y: torch.cat([rescaled(y[:, :1], x[:, :1]), x[:, 1:]], 1),
        "position 0: original's direction, 3x converted norm":
            lambda x, y: torch.cat([3 * rescaled(y[:, :1], x[:, :1]), x[:, 1:]], 1),
        "position 0: converted direction, original's norm":
            lambda x, y: torch.cat([rescaled(x[:, :1], y[:, :1]), x[:, 1:]], 1),
        "every position: converted direction, original's norm": lambda x, y: rescaled(x, y),
    }
    patch = {}

    def pre_hook(module, args_, kwargs):  # LlamaModel passes the stream positionally
        return (patches[patch["name"]](args_[0], patch["original"]), *args_[1:]), kwargs

    student.model.layers[boundary].register_forward_pre_hook(pre_hook, with_kwargs=True)

    teacher_nll, streams = [], []
    with torch.no_grad():
        for ids in docs:
            out = teacher(ids, output_hidden_states=True)
            teacher_nll.append(F.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none"))
            streams.append(out.hidden_states[boundary])
        results = {}
        for name in patches:
            patch["name"] = name
            nll = []
            for ids, stream in zip(docs, streams):
                patch["original"] = stream
                nll.append(F.cross_entropy(student(ids).logits[0, :-1], ids[0, 1:], reduction="none"))
            results[name] = nll

    def total(nll, lo=0, hi=None):
        return sum(n[lo:hi].sum().item() for n in nll)

    tokens, base = sum(len(n) for n in teacher_nll), total(teacher_nll)
    unpatched = results["none"]
    excess = total(unpatched) - base
    buckets = []
    for lo, hi in [(0, 1), (1, 2), (2, 4), (4, 16), (16, 64), (64, 512)]:
        t, s, count = total(teacher_nll, lo, hi), total(unpatched, lo, hi), sum(len(n[lo:hi]) for n in teacher_nll)
        buckets.append([f"{lo}-{hi - 1}", f"{count:,}", f"{t / count:.2f}", f"{s / count:.2f}", f"{(s - t) / excess:.2f}"])
    ratios = {name: math.exp((total(nll) - base) / tokens) for name, nll in results.items()}
    print(f"\nSmolLM2-135M-Instruct, alpha {args.alpha} ({boundary} Post-LN blocks), calibrated, no training; "
          f"{len(docs)} paragraphs of {args.paragraphs}, each scored from its first token ({tokens:,} predictions)\n")
    print(harness.table(["positions", "predictions", "original loss", "converted loss", "share of the excess"], buckets))
    print()
    print(harness.table([f"stream entering block {boundary} (the first Pre-LN one)", "per-document perplexity, x original"],
                        [[name, f"{ratio:.3f}x"] for name, ratio in ratios.items()]))
    print(json.dumps({"tokens": tokens, "patches": ratios}))


def gguf(argv):
    """Opening a GGUF model: this package's reader against transformers' own GGUF loading.

    This package's reader parses the header once, dequantizes tensors one at a time with gguf-py
    and reads the config with transformers; transformers' own path is
    ``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)``. Alternated in one process, each
    round times, from nothing cached, the whole path to a float32 model in memory, and checks that
    both models' tensors are bitwise equal. Prints the per-round seconds, the medians and their ratio.
    """
    p = harness.parser(gguf)
    p.add_argument("--model", help="the GGUF (default: the embedded SmolLM2-135M-Instruct, Q4_1/Q8_0)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: {args.rounds} is below 1")
    import torch
    from transformers import AutoModelForCausalLM

    from mixln_convert.io.gguf import GGUFCheckpoint

    path = Path(harness.source(args.model))
    times = {"ours": [], "transformers": []}
    for round_ in range(args.rounds):
        # not open_checkpoint: its per-process cache would hide the header read
        seconds, model = harness.timed(lambda: GGUFCheckpoint(path).model(torch.float32))
        times["ours"].append(seconds)
        seconds, reference = harness.timed(lambda: AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32).eval())
        times["transformers"].append(seconds)
        state, expected = model.state_dict(), reference.state_dict()
        equal = sorted(state) == sorted(expected) and all(torch.equal(state[n], expected[n]) for n in state)
        print(f"round {round_ + 1}: ours {times['ours'][-1]:.1f} s, transformers {times['transformers'][-1]:.1f} s, "
              f"tensors bitwise equal: {equal}")
        del model, reference, state, expected
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{path.name} ({path.stat().st_size / 2**20:.0f} MiB), {args.rounds} round(s), medians:\n")
    print(harness.table(["loading", "seconds to a float32 model", "x transformers"], [
        [label, f"{medians[name]:.1f}", f"{medians[name] / medians['transformers']:.2f}"]
        for name, label in (("transformers", "transformers, `from_pretrained(gguf_file=...)`"),
                            ("ours", "`open_checkpoint(...).model()`"))]))


CASES = {
    "speed": harness.Case(speed, "~10 min (--size 7b: ~1 h)", ["--size", "tiny", "--repeats", "1", "--cache", "warm"]),
    "sweep": harness.Case(sweep, "~10 min", ["--alphas", "0,0.25", "--repeats", "1"]),
    "strategies": harness.Case(strategies, "~5 min", ["--windows", "1", "--seq-len", "64", "--strategies", "move"]),
    "gap": harness.Case(gap, "~15 min", ["--paragraphs", "docs/*.md", "--paragraph-count", "20", "--documents", "2"],
                        needs="--paragraphs"),
    "gguf": harness.Case(gguf, "~3 min", ["--rounds", "1"]),
}
