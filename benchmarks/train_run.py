"""Wall time and peak RSS of one whole `train` run (convert, heal, both arms) for two versions of
this code, side by side and alternated in one run:

    python benchmarks/train_run.py --before REV [--repeats 1] [--set heal.tokens=4096]

REV is checked out into a temporary git worktree and run with it first on ``PYTHONPATH`` (its
recipes are read from its own checkout: ``recipes/`` before they became package data); the
other version is the installed package. Each run is a fresh process with its own output folder
and token cache, so neither reuses the other's work; peak RSS is the OS's figure (``wait4``).
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # only to make the worktree of --before


@contextlib.contextmanager
def worktree(rev: str, folder: Path):
    """``rev`` checked out into ``folder`` (a detached git worktree of this checkout) while in use."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), rev], check=True,
                   capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], capture_output=True)


def measure(command: list[str], env: dict) -> tuple[float, int]:
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        if status != 0:
            log.seek(0)
            sys.exit(f"{' '.join(command)} failed:\n{log.read().decode()[-3000:]}")
    return seconds, usage.ru_maxrss * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision of the 'before' version")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    sets = [f"--set={s}" for s in (args.sets or ["heal.tokens=4096"])]
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        with worktree(args.before, work / "before"):
            versions = {
                f"before ({args.before})": ([sys.executable, "-m", "mixln_convert.cli", "train",
                                             str(work / "before" / "recipes" / "smollm2-135m-cpu.yaml")],
                                            {"PYTHONPATH": str(work / "before")}),
                "after (installed)": ([sys.executable, "-m", "mixln_convert.cli", "train", "smollm2-135m-cpu"], {}),
            }
            runs = {name: [] for name in versions}
            for repeat in range(args.repeats):
                for name, (command, extra) in versions.items():
                    out = work / f"out-{len(runs[name])}-{name.split()[0]}"
                    cache = work / f"cache-{repeat}-{name.split()[0]}"
                    (cache / "models").parent.mkdir(parents=True, exist_ok=True)
                    models = Path(os.environ.get("MIXLN_CONVERT_CACHE", Path.home() / ".cache" / "mixln-convert"))
                    (cache / "models").symlink_to(models / "models")  # the GGUF, not its derived caches
                    env = {**os.environ, "MIXLN_CONVERT_CACHE": str(cache), **extra}
                    runs[name].append(measure([*command, *sets, "--out", str(out)], env))
                    print(f"{repeat} {name}: {runs[name][-1][0]:.1f} s, {runs[name][-1][1] / 2**30:.2f} GiB",
                          file=sys.stderr)
    print(f"\n`train smollm2-135m-cpu {' '.join(sets)}` (convert, heal, both arms), {os.cpu_count()} CPUs, "
          f"{args.repeats} run(s) each, alternated\n")
    print("| version | wall s (runs) | x before | peak RSS GiB | x before |")
    print("| --- | --- | --- | --- | --- |")
    base = next(iter(runs.values()))
    for name, measured in runs.items():
        seconds, peak = statistics.median(s for s, _ in measured), max(r for _, r in measured)
        base_s, base_r = statistics.median(s for s, _ in base), max(r for _, r in base)
        print(f"| {name} | {seconds:.1f} ({', '.join(f'{s:.1f}' for s, _ in measured)}) | {seconds / base_s:.2f} | "
              f"{peak / 2**30:.2f} | {peak / base_r:.2f} |")


if __name__ == "__main__":
    main()
