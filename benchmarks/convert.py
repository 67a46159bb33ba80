"""Conversion speed and memory against the disk (``cp -r``) and against transformers.

    python benchmarks/convert.py [--size 1b|7b] [--work DIR] [--repeats 2] [--cache cold,warm]

Writes a synthetic LLaMA-shaped checkpoint with random bf16 weights (tensor by tensor, no
model), then times, side by side and alternately, each in a subprocess of its own:

- ``cp -r`` of the checkpoint folder (the disk's speed);
- ``mixln-convert convert`` with ``move`` at alpha 0.25 and alpha 0 (pure streaming), and
  ``calibrated`` at alpha 0.25 with a tiny calibration budget (1024 tokens);
- transformers: ``from_pretrained``, the same ``move`` conversion in memory, ``save_pretrained``.

Peak RSS is the OS's figure for each subprocess (``wait4``), so this script itself imports no
torch. "cold" runs first drop the source's pages from the page cache (``posix_fadvise``; the
host of a VM may still cache them), "warm" ones first read the source once. Times are wall
times of whole commands, Python start and imports included. Prints a Markdown table.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
SHAPES = {"1b": "tinyllama-1.1b", "7b": "llama2-7b"}  # --size -> a shape of benchmarks/shapes.py
SHARD = {"1b": "500MB", "7b": "2GB"}
CLI = [sys.executable, "-m", "mixln_convert.cli", "convert"]
METHODS = {  # name: (what the table calls it, command given SRC and DST)
    "startup": ("python + torch import alone (in every convert row)",
                lambda src, dst: [sys.executable, "-c", "import mixln_convert.conversion.converter"]),
    "cp": ("cp -r", lambda src, dst: ["cp", "-r", src, dst]),
    "move": ("convert: move, alpha 0.25", lambda src, dst: CLI + [src, dst, "--strategy", "move", "--alpha", "0.25"]),
    "alpha0": ("convert: alpha 0", lambda src, dst: CLI + [src, dst, "--strategy", "move", "--alpha", "0"]),
    "calibrated": ("convert: calibrated, alpha 0.25, 1024 tokens",
                   lambda src, dst: CLI + [src, dst, "--alpha", "0.25", "--calibration-tokens", "1024"]),
    "transformers": ("transformers: load, move in memory, save",
                     lambda src, dst: [sys.executable, str(SCRIPT), "_transformers", src, dst]),
}


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


def drop_from_page_cache(folder: Path) -> None:
    for file in folder.iterdir():
        fd = os.open(file, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_into_page_cache(folder: Path) -> None:
    for file in folder.iterdir():
        with open(file, "rb") as f:
            while f.read(64 * 2**20):
                pass


def measure(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of ``command``, run in a subprocess."""
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: progress bars would fill a pipe and block
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        if status != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(command)} failed:\n{log.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024  # Linux reports kilobytes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SHAPES, default="1b")
    parser.add_argument("--work", default="/tmp/mixln-bench", help="folder for the checkpoint and the outputs")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", default="cold,warm", help="page-cache states to measure: cold, warm or both")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    args = parser.parse_args()

    src, dst = Path(args.work) / f"llama-{args.size}", Path(args.work) / "out"
    if not src.is_dir():
        print(f"writing a synthetic {args.size} checkpoint to {src} ...", file=sys.stderr)
        subprocess.run([sys.executable, str(SCRIPT.parent / "shapes.py"), "checkpoint", str(src), SHAPES[args.size],
                        SHARD[args.size]], check=True)
    shards = [p.stat().st_size for p in src.glob("*.safetensors")]
    methods, caches = args.methods.split(","), args.cache.split(",")
    runs = {(m, c): [] for m in methods for c in caches}
    for repeat in range(args.repeats):
        for cache in caches:
            for method in methods:  # alternate methods, so that the machine's noise spreads over all
                shutil.rmtree(dst, ignore_errors=True)
                os.sync()  # the previous run's writes are not this run's to pay for
                if cache == "cold":
                    drop_from_page_cache(src)
                else:
                    read_into_page_cache(src)
                runs[method, cache].append(measure(METHODS[method][1](str(src), str(dst))))
                print(f"{repeat} {cache} {method}: {runs[method, cache][-1][0]:.1f} s", file=sys.stderr)
    shutil.rmtree(dst, ignore_errors=True)

    GiB = 2**30
    print(f"\nSynthetic LLaMA {args.size} ({sum(shards) / GiB:.2f} GiB bf16 in {len(shards)} shards, largest "
          f"{max(shards) / GiB:.2f} GiB), {os.cpu_count()} CPUs, {args.repeats} runs each, median\n")
    print("| method | page cache | wall s (runs) | x cp -r | x transformers | peak RSS GiB | RSS - largest shard GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (method, cache), measured in runs.items():
        seconds = statistics.median(s for s, _ in measured)
        peak = max(r for _, r in measured)

        def ratio(other):
            base = runs.get((other, cache))
            return f"{seconds / statistics.median(s for s, _ in base):.2f}" if base else "-"

        times = ", ".join(f"{s:.1f}" for s, _ in measured)
        print(f"| {METHODS[method][0]} | {cache} | {seconds:.1f} ({times}) | {ratio('cp')} | "
              f"{ratio('transformers')} | {peak / GiB:.2f} | {(peak - max(shards)) / GiB:+.2f} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["_transformers"]:
        transformers_conversion(sys.argv[2], sys.argv[3])
    else:
        main()
