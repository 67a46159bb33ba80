"""How fast the command line answers: wall time of `mixln-convert --help`, of a bad option and of a
missing path, against `python -c pass` and `python -c "import torch"`, fastest of N, side by side
in one run. The test suite asserts the property behind the first two: neither torch nor
transformers is imported before they answer. A path is checked by the API function, after torch
is imported.

    python benchmarks/startup.py [--repeats 5]
"""

import argparse
import subprocess
import sys
import tempfile
import time


def fastest(command: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True)
        best = min(best, time.perf_counter() - started)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "mixln_convert.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "mixln-convert --help": [*cli, "--help"],
            "mixln-convert convert --alpha 1.5 (refused)": [*cli, "convert", tmp, f"{tmp}/out", "--alpha", "1.5"],
            "mixln-convert eval no/such/folder (refused)": [*cli, "eval", f"{tmp}/no/such/folder"],
        }
        times = {name: fastest(command, args.repeats) for name, command in commands.items()}
    base = times["python -c 'import torch'"]
    print(f"| command | fastest of {args.repeats}, s | x python + import torch |\n| --- | --- | --- |")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.3f} | {seconds / base:.2f} |")


if __name__ == "__main__":
    main()
