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
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
SHAPES = {  # TinyLlama-1.1B and LLaMA-2-7B
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
}
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


def make_checkpoint(folder: Path, size: str) -> None:
    """A LLaMA checkpoint of random bf16 weights in safetensors shards, written tensor by tensor."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(REPO / "tests"))
    from tiny import tiny_tokenizer  # calibration needs a tokenizer; any will do for random weights

    from mixln_convert.io.writer import parse_size

    config = LlamaConfig(**SHAPES[size], max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, dtype="bfloat16")
    with torch.device("meta"):  # names and shapes only
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).state_dict().items()}
    shards, shard_bytes, limit = [[]], 0, parse_size(SHARD[size])
    for name, shape in shapes.items():
        if shards[-1] and shard_bytes + 2 * shape.numel() > limit:
            shards, shard_bytes = shards + [[]], 0
        shards[-1].append(name)
        shard_bytes += 2 * shape.numel()
    folder.mkdir(parents=True)
    weight_map = {}
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: random_weight(shapes[name]) for name in names}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": sum(2 * s.numel() for s in shapes.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)


def random_weight(shape):
    """bf16 weights of a LLaMA's scale: linears ~ N(0, 0.02), norm gains around 1."""
    import torch

    weight = 1 + 0.1 * torch.rand(shape) if len(shape) == 1 else 0.02 * torch.randn(shape)
    return weight.to(torch.bfloat16)


def transformers_conversion(src: str, dst: str) -> None:
    """What a user without a streaming converter does: the whole model in memory, twice over."""
    import torch
    from transformers import AutoModelForCausalLM

    from mixln_convert.architectures import architecture_for
    from mixln_convert.conversion.layout import post_ln_count
    from mixln_convert.conversion.plan import ConversionPlan
    from mixln_convert.model.configuration_mixln import MixLNConfig
    from mixln_convert.model.modeling_mixln import MixLNForCausalLM

    class InMemory:  # the plan's view of a source: names() and get(name)
        def __init__(self, state):
            self.state = state

        def names(self):
            return list(self.state)

        def get(self, name):
            return self.state[name]

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    config = model.config.to_dict()
    n_post = post_ln_count(config["num_hidden_layers"], 0.25)
    plan = ConversionPlan(architecture_for(config, src), config, n_post, "move", dtype=torch.bfloat16)
    state = dict(plan.tensors(InMemory(model.state_dict())))
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: progress bars would fill a pipe and block
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
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
        subprocess.run([sys.executable, str(SCRIPT), "_make", str(src), args.size], check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
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
    if sys.argv[1:2] == ["_make"]:
        make_checkpoint(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1:2] == ["_transformers"]:
        transformers_conversion(sys.argv[2], sys.argv[3])
    else:
        main()
