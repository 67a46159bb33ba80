"""Every mixln-convert command README.md shows and --help's examples, run as written with tiny stand-ins for
the model and the text they name (issue 56): each works, or is refused with the message the docs give.

Not run, and why: ``make demo``/``make test`` and ``demo`` (the demo's own tests run its stages; on 2 cores
it takes minutes even on a tiny model), ``pip``, ``head`` and ``vllm`` (not this tool). A line under
``accelerate launch`` is a GPU run (llama-1b: a billion tokens): its recipe and --set items are resolved by
``estimate`` with the same arguments instead, which reads the same recipe and model config.
"""

import gzip
import json
import random
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tiny import make_tiny_llama

README = Path(__file__).parent.parent / "README.md"
SKIPPED = ("make", "pip", "head", "vllm", "python")


def readme_commands() -> list[str]:
    """The mixln-convert invocations of README.md's bash blocks, continuation lines joined, ``a && b`` split."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s", line)[0].strip()
            for part in line.split(" && "):
                if part and part.split()[0] not in SKIPPED:
                    commands.append(part.strip())
    return commands


def help_commands() -> list[str]:
    """The example commands of the top-level --help ("Typical session")."""
    from mixln_convert.cli import main

    text = main.help.split("Typical session:")[1].split("Hugging Face Hub names")[0]
    commands = []
    for line in text.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("mixln-convert "):
            line, _, also = line.partition("(and ")  # "analyze RUN/mixln/final --out A1 (and RUN/preln/final --out A2)"
            commands.append(line.strip())
            if also:
                commands.append(f"mixln-convert {line.split()[1]} {also.rstrip(')').strip()}")
    return commands


def stand_ins(root: Path) -> dict[str, str]:
    """Tiny stand-ins for what the commands name: a model, held-out text, C4-like .json.gz shards."""
    model = make_tiny_llama(root / "my-llama")
    rng = random.Random(0)
    words = "the of model layer norm residual stream token block attention gradient data step".split()
    documents = [" ".join(rng.choices(words, k=80)) + "." for _ in range(400)]
    (root / "held-out.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents[:40]))
    (root / "c4").mkdir()
    with gzip.open(root / "c4" / "c4-train.00000.json.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in documents)
    return {"MODEL": str(model), "CONV": "conv", "HEALED": "healed", "RUN": "run", "A1": "a1", "A2": "a2",
            "REPORT": "report"}


# Budgets cut to the tiny model's size, appended after the command's own options (the last one given wins):
# each command is still parsed and checked as written. As written, the commands took 10 minutes on 2 cores.
BUDGETS = {"sweep": ["--alphas", "0,0.25", "--heal-tokens", "1024", "--eval-tokens", "510"],
           "heal": ["--tokens", "1024", "--eval-tokens", "510"], "convert": ["--calibration-tokens", "1024"],
           "eval": ["--max-tokens", "510"], "analyze": ["--max-tokens", "510"],
           "train": ["--set", "max_tokens=2048", "--set", "heal.tokens=1024", "--set", "data.eval_tokens=512",
                     "--set", "eval_interval=1"]}


def run(command: str, names: dict) -> tuple[int, str]:
    from mixln_convert.cli import main

    args = [re.sub(r"[A-Z][A-Z0-9]+", lambda m: names.get(m.group(), m.group()), arg) for arg in shlex.split(command)][1:]
    if args[0] == "demo":
        return 0, "not run (see the module's docstring)"
    if args[0] == "eval" and "--tasks" in args:
        budget = ["--limit", "4"]
    elif args[0] == "convert" and "lns" in args:
        budget = []  # LNS is exact: nothing calibrated, and --calibration-tokens would be refused
    else:
        budget = BUDGETS.get(args[0], [])
    result = CliRunner().invoke(main, args + budget)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def accelerate_line(command: str) -> str:
    """``accelerate launch ... -m mixln_convert.cli train RECIPE ARGS``: ``mixln-convert estimate RECIPE`` and
    its --set items (--out is train's)."""
    args = shlex.split(command.split("-m mixln_convert.cli train", 1)[1])
    kept = [a for i, a in enumerate(args) if a != "--out" and (i == 0 or args[i - 1] != "--out")]
    return "mixln-convert estimate " + shlex.join(kept)


# Refusals the README documents, by command: (a part of the command, the message it is refused with)
REFUSED = {"--tasks mixln_langref_next,hellaswag": "hellaswag"}  # lm-eval's hellaswag: its dataset (offline here)


@pytest.mark.parametrize("source", ["readme", "help"])
def test_every_documented_command_runs_as_written(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    names = stand_ins(tmp_path)
    if source == "readme":
        commands = readme_commands()
    else:
        commands = help_commands()
    assert len(commands) >= 6, commands
    for command in commands:
        if command.startswith("accelerate "):
            command = accelerate_line(command)
        code, output = run(command, names)
        refusal = next((message for part, message in REFUSED.items() if part in command), None)
        if code and refusal and f"Error: Couldn't reach 'Rowan/{refusal}'" in output:
            continue
        assert code == 0, f"{command}: {output[-1500:]}"


# Scripts docs/measurements.md names as history: each mention gives the commit that held it and what replaced it.
REMOVED = {"benchmarks/calibration_dc_refit.py", "benchmarks/calibration_sink.py", "benchmarks/calibration_sink_gate.py",
           "benchmarks/calibration_weighted_norm.py", "benchmarks/heal_curve.py"}
PATH_NAMED = re.compile(r"(?<![\w./-])((?:benchmarks|scripts|tests|mixln_convert|docs|recipes)/[\w./{},*-]*[\w}*])")


def test_every_path_and_benchmark_the_docs_name_exists():
    """README.md, docs/ and the benchmarks' own text name files that exist (``a.{json,md}`` both) and benchmark
    cases ``python -m benchmarks SUITE CASE`` that exist; no session, issue or device-tool talk."""
    import glob
    import importlib

    root = README.parent
    files = [README, *sorted((root / "docs").glob("*.md")), *sorted((root / "benchmarks").glob("*.py"))]
    cases = {suite: set(importlib.import_module(f"benchmarks.{suite}").CASES) for suite in
             ("conversion", "heal", "training", "analysis", "studies", "maintenance")}
    for file in files:
        text = file.read_text()
        for named in PATH_NAMED.findall(text):
            base, _, alternatives = named.partition("{")
            for path in ([base + a for a in alternatives.rstrip("}").split(",")] if alternatives else [named]):
                if path not in REMOVED:
                    assert glob.glob(str(root / path)), (file.name, path)
        for suite, case in re.findall(r"python -m benchmarks ([a-z]+) ([a-z][\w-]*)", text):
            assert suite == "gpu" or case in cases.get(suite, ()), (file.name, suite, case)
        assert not re.search(r"\bsession 1?\d\b|\bthis session|\bissue \d|device tool|run\(command=", text,
                             re.I), file.name
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w.]+\.md)#([\w-]+)\)", text):
            linked = (root / target) if (root / target).is_file() else (root / "docs" / target)
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, (file.name, target, anchor)
