"""Maintenance: does a refactor change what the tool writes (every output file of a convert, heal
and train at two revisions, compared), and how fast the command line answers.
"""

import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import harness

# fields whose values are clocks or durations: they differ between any two runs
TIMED = ("seconds", "wall_time_s", "tokens_per_s")
WORDS = "the model reads a block of text and writes the next word with care over many steps".split()


def same_outputs(argv):
    """Does a refactor change what the tool writes? Every output file at two revisions, compared.

    Runs a conversion (calibrated, from a sharded source), a heal, a short three-arm train and two analyses on a
    tiny random LLaMA with this checkout and with a
    checkout of ``--base`` (a git worktree), each into the same absolute folder, and compares every
    file they wrote: tensors bitwise (dtype, shape, bytes), JSON and JSON lines field by field less the
    fields that hold times, YAML and text byte for byte.

    ``--ignore`` leaves out JSON fields, YAML keys and files of that name (a field removed on purpose,
    the model code saved beside a checkpoint); ``--head`` compares two revisions instead (``--base R
    --head R`` shows the run is deterministic). Also `python benchmarks/same_outputs.py --base REV`.

    Prints one line per differing file and exits 1 if any differs (or a file is only on one side).
    """
    p = harness.parser(same_outputs)
    p.add_argument("--base", required=True, help="git revision to compare this checkout with")
    p.add_argument("--head", help="git revision to compare with instead of this checkout")
    p.add_argument("--ignore", action="append", default=[], metavar="NAME",
                   help="a JSON field, YAML key or file name to leave out (repeatable)")
    p.add_argument("--keep", type=Path, help="keep both outputs under this folder")
    args = p.parse_args(argv)
    sys.path.insert(0, str(harness.ROOT / "tests"))
    from tiny import make_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="same-outputs-"))
    try:
        with contextlib.ExitStack() as trees:
            sides = {"base": trees.enter_context(harness.worktree(args.base, work / "base-tree")),
                     "head": trees.enter_context(harness.worktree(args.head, work / "head-tree")) if args.head
                     else harness.ROOT}
            source = make_tiny_llama(work / "source", max_shard_size="100KB")
            rng = random.Random(0)
            corpus = harness.write_jsonl(work / "corpus.jsonl", [" ".join(rng.choices(WORDS, k=rng.randint(30, 80)))
                                                                 for _ in range(300)])
            outputs = {}
            for side, tree in sides.items():
                run_pipeline(tree, source, corpus, work / "out")
                outputs[side] = (work / "out").rename(work / side)
        differences = compare(outputs["base"], outputs["head"], args.ignore)
        count = sum(1 for p in outputs["head"].rglob("*") if p.is_file())
        print("\n".join(differences) or f"{count} files, all the same at {args.base} and {args.head or 'this checkout'}"
              + (f" (left out: {', '.join(args.ignore)})" if args.ignore else ""))
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)  # the worktrees are gone by now
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if differences else 0)


def run_pipeline(tree: Path, source: Path, corpus: Path, out: Path) -> None:
    """convert -> heal -> train -> analyze with the code of ``tree``, into ``out`` (emptied first)."""
    for folder in (out, out.parent / "cache"):  # a token cache left by the other side would skip tokenizing
        shutil.rmtree(folder, ignore_errors=True)
    out.mkdir(parents=True)
    env = {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MIXLN_CONVERT_CACHE": str(out.parent / "cache"),
           "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cli = [sys.executable, str(tree / "mixln-convert.py")]
    steps = [
        ["convert", source, out / "converted", "--alpha", "0.25", "--calibration-data", corpus,
         "--calibration-tokens", "512"],
        ["heal", out / "converted", "--teacher", source, "--data", corpus, "--tokens", "1024", "--seq-len", "32",
         "--batch-size", "4", "--out", out / "healed"],
        ["train", "smollm2-135m-cpu", "--arm", "both", "--arm", "lns", "--out", out / "train",
         *(f"--set={setting}" for setting in (
             f"source={source}", f"data.train={corpus}", "data.validation=null", "seq_len=32", "micro_batch_size=2",
             "global_batch_size=4", "max_tokens=512", "data.eval_tokens=256", "precision=fp32",
             "schedule.warmup_steps=1", "eval_interval=2", "checkpoint_interval=2", "grad_norm_interval=2",
             # the lr pinned: an edit of the shipped recipe's is no change of the code
             "heal.tokens=512", "heal.seq_len=32", "heal.batch_size=4", "optim.lr=1e-4"))],
        # every measurement an analysis makes, of a trained arm (the layer sweep, a prune curve, continuations)
        # and of the source (perplexity only, per document)
        ["analyze", out / "train" / "mixln" / "final", "--out", out / "analysis-mixln", "--data", corpus,
         "--seq-len", "32", "--max-tokens", "256", "--prune-curve", "--generate"],
        ["analyze", source, "--out", out / "analysis-source", "--data", corpus, "--seq-len", "32",
         "--max-tokens", "256", "--no-layer-sweep", "--per-document"],
    ]
    for step in steps:
        done = subprocess.run([*cli, *map(str, step)], cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{tree}: `{step[0]}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def untimed(value, dropped):
    if isinstance(value, dict):
        return {k: untimed(v, dropped) for k, v in value.items() if k not in dropped}
    if isinstance(value, list):
        return [untimed(v, dropped) for v in value]
    return value


def same_file(a: Path, b: Path, dropped) -> bool:
    import torch
    import yaml
    from safetensors import safe_open

    if a.suffix == ".safetensors":
        with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
            if sorted(fa.keys()) != sorted(fb.keys()) or (untimed(fa.metadata() or {}, dropped)
                                                          != untimed(fb.metadata() or {}, dropped)):
                return False
            for name in fa.keys():
                ta, tb = fa.get_tensor(name), fb.get_tensor(name)
                if ta.dtype != tb.dtype or ta.shape != tb.shape or not torch.equal(ta.view(torch.uint8),
                                                                                   tb.view(torch.uint8)):
                    return False
        return True
    if a.suffix == ".json":
        return untimed(json.loads(a.read_text()), dropped) == untimed(json.loads(b.read_text()), dropped)
    if a.suffix == ".yaml":
        return untimed(yaml.safe_load(a.read_text()), dropped) == untimed(yaml.safe_load(b.read_text()), dropped)
    if a.suffix == ".jsonl":
        lines = [[untimed(json.loads(line), dropped) for line in p.read_text().splitlines() if line] for p in (a, b)]
        return lines[0] == lines[1]
    if a.suffix in (".pt", ".bin"):  # optimizer and RNG states: tensors inside pickles
        return same_state(*(torch.load(p, weights_only=False) for p in (a, b)))
    return a.read_bytes() == b.read_bytes()


def same_state(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same_state, a, b))
    return a == b


def tracker_log(path: Path) -> bool:
    """A TensorBoard tracker's file: named by the clock and the pid (events.out.tfevents.TIME.HOST.PID, and
    TIME/hparams.yml beside them), so no two runs share one; the metrics they hold are metrics.jsonl's."""
    return path.name.startswith("events.out.tfevents.") or path.name == "hparams.yml"


def compare(base: Path, head: Path, ignored=()) -> list[str]:
    """One line per file that differs between the ``base`` and ``head`` outputs, or is on one side only."""
    dropped = {*TIMED, *ignored}  # fields left out as the clocks are
    files = {p.relative_to(base) for p in base.rglob("*") if p.is_file() and not tracker_log(p)}
    files |= {p.relative_to(head) for p in head.rglob("*") if p.is_file() and not tracker_log(p)}
    differences = []
    for name in sorted(files):
        a, b = base / name, head / name
        if name.name in ignored or name.suffix == ".pyc":
            continue
        if not (a.is_file() and b.is_file()):
            differences.append(f"{name}: only in {'base' if a.is_file() else 'this checkout'}")
        elif not same_file(a, b, dropped):
            differences.append(f"{name}: differs")
    return differences


def package_size(argv):
    """How long the package is at two revisions, and where the lines are.

    Counts the lines of mixln_convert/*.py at ``--base`` and at ``--head`` (default: HEAD) and splits them into the
    declarations of dataclasses (their decorators, class lines, docstrings, fields and constants, not their methods:
    settings and records), module headers (docstring and imports before the first statement) and the rest (the
    code that does the work). Reads git objects only: nothing is run.
    """
    import ast

    p = harness.parser(package_size)
    p.add_argument("--base", required=True, help="git revision to compare with")
    p.add_argument("--head", default="HEAD", help="git revision to count (default: HEAD, as committed)")
    args = p.parse_args(argv)

    def git(*command) -> str:
        return subprocess.run(["git", *command], cwd=harness.ROOT, capture_output=True, text=True, check=True).stdout

    def counts(rev: str) -> dict[str, int]:
        found = dict.fromkeys(("modules", "lines", "dataclass declarations", "module headers"), 0)
        for name in (f for f in git("ls-tree", "-r", "--name-only", rev, "mixln_convert").split() if f.endswith(".py")):
            text = git("show", f"{rev}:{name}")
            tree = ast.parse(text)
            found["modules"] += 1
            found["lines"] += len(text.splitlines())
            header = (n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))
                      and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)))
            found["module headers"] += next((n.lineno for n in header), len(text.splitlines()) + 1) - 1
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                    declared = [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
                    found["dataclass declarations"] += (node.body[0].lineno - start
                                                        + sum(s.end_lineno - s.lineno + 1 for s in declared))
        found["the rest"] = found["lines"] - found["dataclass declarations"] - found["module headers"]
        return found

    base, head = counts(args.base), counts(args.head)
    rows = [[name, f"{base[name]:,}", f"{head[name]:,}", f"{head[name] - base[name]:+,}"] for name in base]
    print(harness.table(["mixln_convert/", args.base, args.head, "change"], rows))


def startup(argv):
    """How fast the command line answers (--help, refusals) against `python` and `import torch`.

    Wall time of `mixln-convert --help`, of a bad option and of a missing path, against `python -c
    pass` and `python -c "import torch"`, fastest of N, side by side in one run. The test suite asserts the property behind the first two: neither torch nor
    transformers is imported before they answer. A path is checked by the API function, after torch
    is imported.
    """
    p = harness.parser(startup)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "mixln-convert --help": [*harness.CLI, "--help"],
            "mixln-convert convert --alpha 1.5 (refused)": [*harness.CLI, "convert", tmp, f"{tmp}/out", "--alpha", "1.5"],
            "mixln-convert eval no/such/folder (refused)": [*harness.CLI, "eval", f"{tmp}/no/such/folder"],
        }
        times = harness.alternate({name: lambda c=command: harness.run(c, check=False) for name, command in
                                   commands.items()}, args.repeats)
    base = min(times["python -c 'import torch'"])
    print(harness.table(["command", f"fastest of {args.repeats}, s", "x python + import torch"],
                        [[name, f"{min(t):.3f}", f"{min(t) / base:.2f}"] for name, t in times.items()]))


CASES = {
    "same-outputs": harness.Case(same_outputs, "~5 min", None, needs="--base REV"),
    "package-size": harness.Case(package_size, "~10 s", None, needs="--base REV"),
    "startup": harness.Case(startup, "~1 min", ["--repeats", "1"]),
}
