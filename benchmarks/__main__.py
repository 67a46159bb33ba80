"""The benchmarks behind the figures in docs/, by suite (run from the repository's root):

    python -m benchmarks                        this list: the suites, their cases, how long each takes
    python -m benchmarks SUITE CASE --help      what a case measures, and its options
    python -m benchmarks SUITE CASE [options]   one case (docs/measurements.md gives the options of each figure)
    python -m benchmarks SUITE                  every case at its defaults, one after another, each in a
                                                process of its own (a case that needs an input is named, not run)
    python -m benchmarks SUITE --quick          every case at its smallest size: a smoke run, not a figure
    make bench-SUITE [ARGS=--quick]             the same

Times are for this project's 2-core CPU at each case's defaults.
"""

import importlib
import inspect
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("conversion", "heal", "training", "analysis", "studies", "maintenance")
GPU = """The GPU mission in one run, `bash benchmarks/gpu.sh [options]` (its header: how to call
it, what it records): pre-train a Pre-LN LLaMA from random weights, convert, heal, train both arms,
analyze and compare (~6.5 min on an H200); --throughput: the trainer at the 1B class (~3 min);
--real: SmolLM2-135M itself (benchmarks/gpu_real.py: two calls, ~9 min). `python -m benchmarks gpu
ARGS` runs gpu.sh with ARGS; --quick: its CPU rehearsal (--smoke, ~2 min)."""


def listing() -> str:
    lines = [inspect.getdoc(sys.modules[__name__])]
    for name in SUITES:
        suite = importlib.import_module(f"benchmarks.{name}")
        lines += ["", f"{name}:", textwrap.indent(inspect.getdoc(suite), "  ")]
        for case_name, case in suite.CASES.items():
            needs = f" (needs {case.needs})" if case.needs else ""
            lines.append(f"    {case_name:<13}{inspect.getdoc(case.run).splitlines()[0]} [{case.minutes}]{needs}")
    return "\n".join([*lines, "", "gpu:", textwrap.indent(GPU, "  ")])


def gpu(argv: list[str]) -> int:
    script = ["bash", str(ROOT / "benchmarks" / "gpu.sh")]
    if argv == ["--quick"]:
        tokenizer = ROOT / ".gpu" / "tokenizer"
        if not tokenizer.is_dir():  # the carried tokenizer, saved here from the cached GGUF
            subprocess.run([*script, "--save-tokenizer", str(tokenizer)], check=True)
        argv = ["--smoke"]
    return subprocess.run([*script, *argv]).returncode


def suite_run(name: str, cases: dict, quick: bool) -> int:
    """Every case of a suite, each in a fresh process (a crash costs that case only, and no case
    inherits another's caches or memory); the number of cases that failed."""
    failed = []
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        for case_name, case in cases.items():
            argv = case.quick if quick else None if case.needs else []
            if argv is None:
                print(f"== {name} {case_name}: not run, it needs {case.needs} (python -m benchmarks {name} {case_name} "
                      "--help)", flush=True)
                continue
            argv = [a.replace("{tmp}", tmp) for a in argv]  # a fresh folder where a case writes
            print(f"== python -m benchmarks {name} {case_name} {' '.join(argv)}", flush=True)
            if subprocess.run([sys.executable, "-m", "benchmarks", name, case_name, *argv], cwd=ROOT).returncode:
                failed.append(case_name)
    if failed:
        print(f"== {name}: failed: {', '.join(failed)}")
    return len(failed)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "gpu":
        return gpu(rest)
    if name not in SUITES:
        sys.exit(f"no suite {name!r}: one of {', '.join(SUITES)}, gpu (python -m benchmarks --help)")
    cases = importlib.import_module(f"benchmarks.{name}").CASES
    if rest in ([], ["--quick"]):
        return 1 if suite_run(name, cases, quick=bool(rest)) else 0
    if rest[0] not in cases:
        sys.exit(f"no case {rest[0]!r} in {name}: one of {', '.join(cases)} (python -m benchmarks --help)")
    cases[rest[0]].run(rest[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
