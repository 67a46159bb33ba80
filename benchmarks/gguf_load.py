"""Opening a GGUF model: this package's reader (header parsed once, tensors dequantized one at a
time by gguf-py, config from transformers) against transformers' own GGUF loading
(``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)``), alternated in one process.

    PYTHONPATH=. python benchmarks/gguf_load.py [GGUF] [--rounds 3]

GGUF defaults to the embedded SmolLM2-135M-Instruct (Q4_1/Q8_0). Each round times, from nothing
cached, the whole path to a float32 model in memory, and checks that both models' tensors are
bitwise equal. Prints the per-round seconds, the medians and their ratio.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from mixln_convert.fetch import smollm2_gguf
from mixln_convert.io.gguf import GGUFCheckpoint


def ours(path: Path):
    checkpoint = GGUFCheckpoint(path)  # not open_checkpoint: its per-process cache would hide the header read
    return checkpoint.model(torch.float32), checkpoint


def transformers_own(path: Path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", nargs="?", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is below 1")
    path = args.gguf or smollm2_gguf()
    times = {"ours": [], "transformers": []}
    for round_ in range(args.rounds):
        started = time.perf_counter()
        model, checkpoint = ours(path)
        times["ours"].append(time.perf_counter() - started)
        started = time.perf_counter()
        reference = transformers_own(path)
        times["transformers"].append(time.perf_counter() - started)
        state, expected = model.state_dict(), reference.state_dict()
        equal = sorted(state) == sorted(expected) and all(torch.equal(state[n], expected[n]) for n in state)
        print(f"round {round_ + 1}: ours {times['ours'][-1]:.1f} s, transformers {times['transformers'][-1]:.1f} s, "
              f"tensors bitwise equal: {equal}")
        del model, reference, checkpoint
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{path.name} ({path.stat().st_size / 2**20:.0f} MiB), {args.rounds} round(s), medians:\n")
    print("| loading | seconds to a float32 model | x transformers |\n| --- | --- | --- |")
    for name, label in (("transformers", "transformers, `from_pretrained(gguf_file=...)`"),
                        ("ours", "`open_checkpoint(...).model()`")):
        print(f"| {label} | {medians[name]:.1f} | {medians[name] / medians['transformers']:.2f} |")


if __name__ == "__main__":
    main()
