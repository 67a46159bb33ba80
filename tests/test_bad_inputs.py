"""Bad inputs across every command: each row is a command line and a fragment of the expected
message. Every row must end with a non-zero exit, one "Error:" line, no traceback, no output
folder, and every input file byte for byte as it was (sha256 over the whole inputs tree)."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hub_cache import offline_hub, place_dataset, place_model
from tiny import TINY_CONFIG

L = TINY_CONFIG["num_hidden_layers"]


def digests(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root`` (links listed, not followed)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = "link -> " + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


class Inputs:
    """The inputs of one row, all under ``root``: good ones copied from the session fixtures, bad
    ones made by the row."""

    def __init__(self, root: Path, fixtures):
        self.root = root
        self.fixtures = fixtures
        root.mkdir()
        self.text = root / "text.txt"
        self.text.write_text(" ".join(f"A short sentence about item number {i}." for i in range(400)))

    @property
    def src(self) -> Path:
        return self._copy("tiny_llama", "src")

    @property
    def sharded(self) -> Path:
        return self._copy("tiny_llama_sharded", "sharded")

    @property
    def converted(self) -> Path:
        return self._copy("converted", "converted")

    def _copy(self, fixture: str, name: str) -> Path:
        target = self.root / name
        if not target.exists():
            shutil.copytree(self.fixtures(fixture), target)
        return target

    def variant(self, name: str, config=None, tensors=None, base: str = "src") -> Path:
        """A copy of ``base`` whose config.json is ``config(config)`` and whose single shard holds
        ``tensors(state)``."""
        folder = self.root / name
        shutil.copytree(getattr(self, base), folder)
        if config is not None:
            original = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps(config(original)))
        if tensors is not None:
            state = load_file(folder / "model.safetensors")
            save_file(tensors(state), folder / "model.safetensors")
        return folder

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def analysis(self, name: str, **changes) -> Path:
        folder = self.root / name
        folder.mkdir()
        analysis = {"checkpoint": "ckpt", "num_layers": 2, "post_ln_layers": 0, "perplexity": 10.0,
                    "layer_drop": [1.0, 2.0], "angular_distance_matrix": [[0.1, 0.2], [0.1]],
                    "grad_norm_per_layer": [1.0, 1.0], "tokenizer_vocab_size": 320, **changes}
        (folder / "analysis.json").write_text(json.dumps(analysis))
        return folder

    def run(self, name: str, metrics: str, summary=None) -> Path:
        """A train output folder of one arm (mixln) with ``metrics``; with ``summary``, a finished arm's
        summary.json changed by it."""
        folder = self.root / name
        (folder / "mixln").mkdir(parents=True)
        (folder / "recipe.yaml").write_text("source: x\n")
        (folder / "mixln" / "metrics.jsonl").write_bytes(metrics if isinstance(metrics, bytes) else metrics.encode())
        if summary is not None:
            finished = {"arm": "mixln", "steps": 1, "tokens": 8, "wall_time_s": 1.0, "initial_val_ppl": 9.0,
                        "final_val_ppl": 8.0}
            (folder / "mixln" / "summary.json").write_text(json.dumps({**finished, **summary}))
        return folder


def _tensor(key, make):
    """A change of a config or state dict: ``key`` becomes ``make(its old value)``."""
    return lambda mapping: {**mapping, key: make(mapping.get(key))}


def _set(key, value):
    return _tensor(key, lambda _: value)


def _without(key):
    return lambda mapping: {k: v for k, v in mapping.items() if k != key}


def _poison(name, value):
    def make(t):
        t = t.clone()
        t.view(-1)[3] = value
        return t
    return _tensor(name, make)


def layer(i, suffix):
    return f"model.layers.{i}.{suffix}"


def index_without(inputs, tensor):
    folder = inputs.root / "sharded-bad"
    shutil.copytree(inputs.sharded, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"][tensor]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def index_edit(inputs, edit):
    folder = inputs.root / "sharded-bad"
    shutil.copytree(inputs.sharded, folder)
    path = folder / "model.safetensors.index.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return folder


def truncated(inputs):
    folder = inputs.variant("truncated")
    shard = folder / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    return folder


def llama_gguf(inputs, blocks: int, tensors_for: int, nan_in: str | None = None):
    """A LLaMA GGUF whose metadata says ``blocks`` layers but holds tensors for ``tensors_for``;
    one NaN in each ``nan_in`` tensor (e.g. "ffn_up") when given."""
    from gguf import GGUFWriter

    path = inputs.root / "partial.gguf"
    writer = GGUFWriter(path, "llama")
    h, inter, vocab = 8, 16, 32
    writer.add_block_count(blocks)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_context_length(64)
    writer.add_vocab_size(vocab)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, h), np.float32))
    writer.add_tensor("output_norm.weight", np.ones(h, np.float32))
    for i in range(tensors_for):
        for name, shape in (("attn_norm", (h,)), ("ffn_norm", (h,)), ("attn_q", (h, h)), ("attn_k", (h, h)),
                            ("attn_v", (h, h)), ("attn_output", (h, h)), ("ffn_gate", (inter, h)),
                            ("ffn_up", (inter, h)), ("ffn_down", (h, inter))):
            values = np.zeros(shape, np.float32)
            if name == nan_in:
                values.flat[values.size // 2] = np.nan
            writer.add_tensor(f"blk.{i}.{name}.weight", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def biased(inputs):
    """A tiny LLaMA with attention biases, a valid checkpoint that the conversion does not handle."""
    from tiny import make_tiny_llama

    return make_tiny_llama(inputs.root / "biased", attention_bias=True)


def qwen(inputs, family: str = "qwen2", without: str | None = None, **config):
    """A tiny Qwen checkpoint of ``family`` (its q/k/v biases or per-head q/k norms random), lacking
    tensor ``without`` if given."""
    from tiny import make_tiny_llama

    folder = make_tiny_llama(inputs.root / family, family=family, **config)
    if without is not None:
        state = load_file(folder / "model.safetensors")
        del state[without]
        save_file(state, folder / "model.safetensors")
    return folder


def qwen3_gguf(inputs, head_dim: int):
    """A Qwen3 GGUF whose heads are ``head_dim`` wide (transformers reads none from the file: 128)."""
    from tiny import write_tiny_gguf

    from mixln_convert.io.loader import open_checkpoint

    folder = qwen(inputs, "qwen3", head_dim=head_dim)
    return write_tiny_gguf(folder, open_checkpoint(folder).arch, inputs.root / "qwen3.gguf")


def qwen2_gguf_with(inputs, key: str, value) -> Path:
    """A Qwen2 GGUF whose metadata says ``value`` for the config's ``key`` (written from a folder the
    loader never reads: it would refuse the value there)."""
    from tiny import write_tiny_gguf

    from mixln_convert.io.loader import open_checkpoint

    folder = qwen(inputs, "qwen2")
    arch = open_checkpoint(folder).arch
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **({"rope_theta": value} if key == "rope_theta" else {})}
    (folder / "config.json").write_text(json.dumps({**config, **({key: value} if key != "rope_theta" else {})}))
    return write_tiny_gguf(folder, arch, inputs.root / f"{key}.gguf")


def edited(inputs, name: str, file: str, edit) -> Path:
    """A copy of the source checkpoint whose ``file`` (JSON) is ``edit(its content)``."""
    folder = inputs.variant(name)
    (folder / file).write_text(json.dumps(edit(json.loads((folder / file).read_text()))))
    return folder


def unlinked(folder: Path, file: str) -> Path:
    (folder / file).unlink()
    return folder


def broken_config(inputs):
    folder = inputs.variant("v")
    (folder / "config.json").write_text("{not json")
    return folder


def symlink(inputs, target: Path, name: str = "link") -> Path:
    link = inputs.root / name
    link.symlink_to(target, target_is_directory=True)
    return link


def fifo(inputs) -> Path:
    """A named pipe with no writer: opening it to read would block for ever."""
    path = inputs.root / "pipe.txt"
    os.mkfifo(path)
    return path


def linked_weights(inputs) -> tuple[Path, Path]:
    """(a checkpoint folder whose weights file is a symlink, as in a Hugging Face cache snapshot;
    the folder that holds the real file, a full copy of the source)."""
    real = inputs.variant("real")
    linked = inputs.root / "linked"
    linked.mkdir()
    for file in real.iterdir():
        if file.name == "model.safetensors":
            (linked / file.name).symlink_to(Path("..") / "real" / file.name)
        else:
            shutil.copy(file, linked / file.name)
    return linked, real


def shallower(inputs, drop: int = 2) -> Path:
    """The source with its last ``drop`` layers removed, config and weights agreeing."""
    return inputs.variant("shallow", config=_set("num_hidden_layers", L - drop), tensors=lambda state: {
        k: v for k, v in state.items() if not any(k.startswith(f"model.layers.{i}.") for i in range(L - drop, L))})


def alias_bomb(inputs, depth: int = 30) -> Path:
    """A recipe whose aliases of mappings expand to 2**depth leaves."""
    lines = ["x0: &x0 {a: 1, b: 2}"] + [f"x{n}: &x{n} {{a: *x{n - 1}, b: *x{n - 1}}}" for n in range(1, depth)]
    return inputs.file("bomb.yaml", "\n".join(lines) + "\n")


def validation(inputs) -> str:
    """A --set of validation text other than the training text (the same text leaves no training tokens)."""
    return f"data.validation={inputs.file('validation.txt', ' '.join(f'Another line, number {i}.' for i in range(200)))}"


def interrupted(out: Path, settings='{"lr": 1.0}') -> Path:
    """The work folder a killed heal into ``out`` leaves beside it: its record (``settings`` as written) and a
    checkpoint."""
    work = out.with_name(f".{out.name}.heal")
    work.mkdir()
    (work / "run.json").write_text(f'{{"kind": "mixln-convert heal", "settings": {settings}}}')
    (work / "step-3.pt").write_bytes(b"checkpoint")
    return out


def users_folder(out: Path) -> Path:
    """A folder of the user's named as ``out``'s heal work folder would be."""
    work = out.with_name(f".{out.name}.heal")
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    return out


def tokens_folder(inputs, manifest=None) -> Path:
    """A `tokenize` folder of the row's text (its manifest edited by ``manifest``)."""
    from mixln_convert.data import tokenize

    folder = inputs.root / "tokens"
    documents = inputs.file("documents.jsonl", "".join(json.dumps({"text": f"Document {i}: a short sentence about "
                                                                          f"item number {i}."}) + "\n" for i in range(200)))
    tokenize(documents, inputs.src, folder, validation_fraction=0.5, progress=False)
    if manifest is not None:
        path = folder / "mixln-tokens.json"
        path.write_text(json.dumps(manifest(json.loads(path.read_text()))))
    return folder


def recipe(inputs, *sets):
    """`train` with a tiny recipe on the row's source and text; ``sets`` replace its items of the same key
    (a key given twice is refused)."""
    base = [f"source={inputs.src}", f"data.train={inputs.text}", f"data.validation={inputs.text}",
            "seq_len=32", "micro_batch_size=2", "global_batch_size=2", "max_tokens=128", "data.eval_tokens=64",
            "heal.seq_len=32", "heal.batch_size=2", "heal.tokens=0"]
    items = dict(item.split("=", 1) for item in base + list(sets))
    return ["train", "smollm2-135m-cpu", *(f"--set={key}={value}" for key, value in items.items())]


def corpus(inputs) -> Path:
    """A JSON-lines file of 60 documents (written once per row: its date is part of a tokenization's settings)."""
    if (inputs.root / "corpus.jsonl").is_file():
        return inputs.root / "corpus.jsonl"
    return inputs.file("corpus.jsonl", "".join(json.dumps({"text": f"Document {i}: " + "words about item %d. " % i * 20})
                                               + "\n" for i in range(60)))


def tokens(inputs, tamper=None, tokenizer=None) -> Path:
    """A tokenized folder of ``corpus(inputs)`` with the source's tokenizer (or ``tokenizer``),
    then ``tamper(folder)``."""
    from transformers import AutoTokenizer

    from mixln_convert.data import tokenize

    folder = inputs.root / "tokens"
    tokenize(corpus(inputs), tokenizer or AutoTokenizer.from_pretrained(inputs.src), folder, validation_fraction=0.2,
             shard_tokens=2048, progress=False)
    if tamper:
        tamper(folder)
    return folder


def _edit_manifest(edit):
    def tamper(folder):
        path = folder / "mixln-tokens.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return tamper


def _cut_shard(folder):
    shard = folder / "train-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-10])


def _flip_shard(folder):
    shard = folder / "train-00000.bin"
    shard.write_bytes(b"\1\0" + shard.read_bytes()[2:])


def _garble_shards(folder):
    """Every train shard overwritten with ids no tokenizer of the tiny model has, sizes kept."""
    for shard in folder.glob("train-*.bin"):
        shard.write_bytes(b"\xff" * shard.stat().st_size)


def other_tokenizer(inputs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(inputs.src)
    tokenizer.add_tokens(["<extra>"])
    return tokenizer


def on_tokens(inputs, folder, *sets):
    return [*recipe(inputs, f"data.train={folder}", "data.validation=null", *sets)]


def tokenize_row(inputs, out, *extra):
    return ["tokenize", corpus(inputs), "--tokenizer", inputs.src, "--out", out, *extra]


def binary(inputs) -> Path:
    """A file named .txt that is not UTF-8 text."""
    return inputs.file("bin.txt", b"\xff\xfe\x00\x01")


def mine(inputs) -> Path:
    """A folder of the user's own that holds no run: only their notes."""
    folder = inputs.root / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    return folder


def finished_sweep(inputs) -> Path:
    """A finished one-alpha sweep of the source, in the inputs (a row must leave it as it is)."""
    from mixln_convert.workflows.sweep import sweep

    folder = inputs.root / "sweep"
    sweep(inputs.src, folder, alphas=[0.0], eval_tokens=256, progress=False)
    return folder


def resumed_over_changed_data(inputs) -> list:
    """A finished Pre-LN `train` run, then its data.train edited in place to text of the same size."""
    from click.testing import CliRunner

    from mixln_convert.cli import main

    argv = [*recipe(inputs, validation(inputs)), "--arm", "preln", "--out", inputs.root / "run"]
    done = CliRunner().invoke(main, [str(a) for a in argv])
    assert done.exit_code == 0, done.output
    inputs.text.write_text(inputs.text.read_text().replace("short", "sharp"))
    return [*argv, "--resume"]


def malformed_task(inputs) -> Path:
    folder = inputs.root / "tasks"
    folder.mkdir()
    (folder / "mine.yaml").write_text("task: mine\ndataset_path: [json\n")
    return folder


def hub_caches(inputs) -> tuple[Path, Path]:
    """A row's offline Hugging Face caches: models among the inputs (resolving a name writes
    nothing), datasets beside them (datasets leaves lock files where it reads)."""
    return inputs.root / "hf-hub", inputs.root.parent / "hf-datasets"


def hub_model(inputs, fixture: str = "tiny_llama", skip=()) -> tuple[str, Path]:
    """A session fixture (but the files ``skip``) as a Hub model in the row's cache: (its name, its snapshot)."""
    name = f"org/{fixture.replace('_', '-')}"
    return name, place_model(inputs.fixtures(fixture), hub_caches(inputs)[0], name, skip=skip)


def into_snapshot(inputs) -> list:
    """`convert` of a cached Hub model into its own snapshot folder."""
    name, snapshot = hub_model(inputs)
    return ["convert", name, snapshot / "out", "--force"]


def partial_snapshot(inputs) -> str:
    """A sharded model cached without the last shard its index names."""
    index = inputs.fixtures("tiny_llama_sharded") / "model.safetensors.index.json"
    return hub_model(inputs, "tiny_llama_sharded", skip=(max(json.loads(index.read_text())["weight_map"].values()),))[0]


def hub_repo(inputs, files: dict) -> str:
    """A Hub model repo in the row's cache holding ``files`` ({name: content}) and no config.json: its name."""
    folder = inputs.root / "repo-files"
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return place_model(folder, hub_caches(inputs)[0], "org/repo") and "org/repo"


def hub_dataset(inputs) -> str:
    """The row's text, a sentence a row, as the train split of a Hub dataset in the row's cache."""
    place_dataset(inputs.text.read_text().split(". "), hub_caches(inputs)[1], "org/text")
    return "org/text"


def lock_link(inputs, name: str, target: Path) -> Path:
    """``inputs.root / name``, an output whose lock file (``.NAME.lock`` beside it) is a symlink to ``target``."""
    (inputs.root / f".{name}.lock").symlink_to(target)
    return inputs.root / name


def users_lock(inputs, name: str) -> Path:
    """``inputs.root / name``, an output beside which the user keeps a file of notes named as its lock file."""
    inputs.file(f".{name}.lock", "my notes\n")
    return inputs.root / name


def nan_model(inputs) -> Path:
    return inputs.variant("nan", tensors=_poison(layer(7, "mlp.down_proj.weight"), float("nan")))


def rope(**parameters):
    return _set("rope_parameters", {"rope_theta": 10000.0, **parameters})


# study rows: a budget of a few steps, so that a row the old code accepted ends quickly
STUDY = ["--seeds", "1", "--no-post-ln", "--eval-tokens", "64",
         *(f"--set={s}" for s in ("seq_len=32", "micro_batch_size=2", "global_batch_size=2", "max_tokens=128",
                                  "data.eval_tokens=64"))]


# Each row: (id, builder(inputs, out) -> argv, fragment of the one error line). ``out`` is the
# output path the row's command is given; it must not exist afterwards.
ROWS = [
    # ---- paths: an input is never written, whatever the spelling ----
    ("convert-dst-dotdot-src", lambda i, o: ["convert", i.src, i.root / "x" / ".." / "src", "--force"], "is the input SRC"),
    ("convert-dst-symlink-to-src", lambda i, o: ["convert", symlink(i, i.src), i.src, "--force"], "is the input SRC"),
    ("convert-dst-inside-src-via-link", lambda i, o: ["convert", symlink(i, i.src), i.src / "out"], "lies inside the input SRC"),
    ("convert-dst-inside-src", lambda i, o: ["convert", i.src, i.src / "sub", "--force"], "lies inside the input SRC"),
    ("convert-dst-contains-src", lambda i, o: ["convert", i.src, i.root, "--force"], "contains the input SRC"),
    ("convert-dst-is-calibration-data", lambda i, o: ["convert", i.src, i.root / "data", "--force",
                                                      "--calibration-data", i.file("data", "x" * 10)], "is the input --calibration-data"),
    ("heal-out-is-teacher", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", i.src, "--force"], "is the input --teacher"),
    ("heal-out-is-converted", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", i.converted, "--force"], "is the input CONVERTED"),
    ("heal-out-contains-data", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--data", i.text, "--out", i.root, "--force"], "contains the input"),
    ("prune-out-contains-ckpt", lambda i, o: ["prune", i.src, i.root, "--layers", "1", "--force"], "contains the input CKPT"),
    ("prune-out-is-ckpt-via-link", lambda i, o: ["prune", i.src, symlink(i, i.src), "--layers", "1", "--force"], "is the input CKPT"),
    ("analyze-out-is-ckpt", lambda i, o: ["analyze", i.src, "--out", i.src, "--force"], "is the input CKPT"),
    ("analyze-out-is-data", lambda i, o: ["analyze", i.src, "--out", i.text, "--data", i.text, "--force"], "is the input --data"),
    ("compare-out-is-input", lambda i, o: ["compare", i.analysis("a"), "--out", i.root / "a", "--force"], "is the input #1"),
    ("compare-too-many-inputs", lambda i, o: ["compare", *[i.analysis("a")] * 101, "--out", o], "INPUTS: 101 inputs, more than 100 (one report's tables and plots hold no more)"),
    ("compare-out-dotdot-input", lambda i, o: ["compare", i.analysis("a"), "--out", i.root / "a" / "..", "--force"], "contains the input #1"),
    ("train-out-is-source", lambda i, o: [*recipe(i), "--out", i.src], "is the input source"),
    ("train-out-contains-data", lambda i, o: [*recipe(i), "--out", i.root], "contains the input"),
    ("convert-force-dst-holds-linked-weights", lambda i, o: ["convert", *linked_weights(i), "--force"], "contains the input SRC"),
    ("prune-force-out-holds-linked-weights", lambda i, o: ["prune", *linked_weights(i), "--layers", "1", "--force"], "contains the input CKPT"),
    ("convert-dst-nonempty", lambda i, o: ["convert", i.src, i.variant("full")], "exists and is not empty"),
    ("convert-dst-is-file", lambda i, o: ["convert", i.src, i.text], "exists and is not a folder"),
    # ---- the checkpoint against its config ----
    ("config-is-a-list", lambda i, o: ["convert", i.variant("v", config=lambda c: [c]), o], "a config must be a JSON object"),
    ("config-not-json", lambda i, o: ["convert", broken_config(i), o], "unreadable JSON"),
    ("config-architectures-a-string", lambda i, o: ["convert", i.variant("v", config=_set("architectures", "LlamaForCausalLM")), o], "architectures must be a list"),
    ("config-model-type-a-number", lambda i, o: ["convert", i.variant("v", config=_set("model_type", 7)), o], "model_type must be a string"),
    ("config-model-type-other", lambda i, o: ["convert", i.variant("v", config=_set("model_type", "bert")), o], "unsupported architecture: model_type 'bert' with architectures LlamaForCausalLM"),
    ("config-no-num-layers", lambda i, o: ["convert", i.variant("v", config=_without("num_hidden_layers")), o], "num_hidden_layers is missing"),
    ("config-layers-a-string", lambda i, o: ["convert", i.variant("v", config=_set("num_hidden_layers", "8")), o], "num_hidden_layers must be a positive integer"),
    ("config-hidden-not-divisible", lambda i, o: ["convert", i.variant("v", config=lambda c: {**_without("head_dim")(c), "num_attention_heads": 6}), o], "not divisible by num_attention_heads"),
    ("config-kv-heads-not-dividing", lambda i, o: ["convert", i.variant("v", config=_set("num_key_value_heads", 3)), o], "not a multiple of num_key_value_heads"),
    ("config-rope-theta-negative", lambda i, o: ["convert", i.variant("v", config=_set("rope_parameters", {"rope_theta": -1.0, "rope_type": "default"})), o], "rope_parameters.rope_theta must be a positive number, got -1.0"),
    ("config-dtype-unknown", lambda i, o: ["convert", i.variant("v", config=_set("dtype", "float99")), o], "dtype must be one of float32"),
    ("config-initializer-range-negative", lambda i, o: ["convert", i.variant("v", config=_set("initializer_range", -1.0)), o], "config.json: transformers refuses this config: Validation error for field 'initializer_range'"),
    ("config-layers-absurd", lambda i, o: ["convert", i.variant("v", config=_set("num_hidden_layers", 10**9)), o], "the config asks for 1000000000 layers"),
    ("eval-weights-overflow", lambda i, o: ["eval", i.variant("v", tensors=_poison(layer(7, "self_attn.q_proj.weight"), 3e38))], "its perplexity is nan"),
    ("config-eps-negative", lambda i, o: ["convert", i.variant("v", config=_set("rms_norm_eps", -1)), o], "rms_norm_eps"),
    ("config-more-layers-than-weights", lambda i, o: ["convert", i.variant("v", config=_set("num_hidden_layers", L + 2)), o], f"tensor {layer(L, 'input_layernorm.weight')} is missing"),
    ("config-fewer-layers-than-weights", lambda i, o: ["convert", i.variant("v", config=_set("num_hidden_layers", L - 2)), o], "lies beyond the config's num_hidden_layers"),
    ("untied-without-lm-head", lambda i, o: ["convert", i.variant("v", tensors=_without("lm_head.weight")), o], "tensor lm_head.weight is missing"),
    ("without-final-norm", lambda i, o: ["convert", i.variant("v", tensors=_without("model.norm.weight")), o], "tensor model.norm.weight is missing"),
    ("attention-bias-without-biases", lambda i, o: ["eval", i.variant("v", config=_set("attention_bias", True), base="converted")], "q_proj.bias is missing"),
    ("convert-attention-bias", lambda i, o: ["convert", biased(i), o], "attention_bias true: projections with biases are not supported"),
    ("convert-qwen-sliding-window", lambda i, o: ["convert", qwen(i, use_sliding_window=True, sliding_window=16, max_window_layers=4), o], "use_sliding_window True: the Mix-LN model has no sliding-window attention"),
    ("convert-qwen2-without-a-bias", lambda i, o: ["convert", qwen(i, without=layer(3, "self_attn.k_proj.bias")), o], "tensor model.layers.3.self_attn.k_proj.bias is missing"),
    ("convert-qwen3-without-a-head-norm", lambda i, o: ["convert", qwen(i, "qwen3", without=layer(0, "self_attn.q_norm.weight")), o], "tensor model.layers.0.self_attn.q_norm.weight is missing"),
    ("convert-qwen3-gguf-head-dim-misread", lambda i, o: ["convert", qwen3_gguf(i, head_dim=32), o], "reads head_dim 128 from this GGUF, whose metadata and tensors say 32"),
    ("heal-teacher-other-family", lambda i, o: ["heal", i.converted, "--teacher", qwen(i), "--out", o], "a Qwen2ForCausalLM checkpoint, but"),
    ("unexpected-tensor", lambda i, o: ["convert", i.variant("v", tensors=lambda s: {**s, "model.extra.weight": torch.ones(2)}), o], "unexpected tensor model.extra.weight"),
    ("wrong-shape-pre-ln", lambda i, o: ["convert", i.variant("v", tensors=_tensor(layer(6, "mlp.down_proj.weight"), lambda t: t[:, :-1].contiguous())), o], "has shape [64, 127]"),
    ("wrong-shape-post-ln", lambda i, o: ["convert", i.variant("v", tensors=_tensor(layer(0, "self_attn.q_proj.weight"), lambda t: t[:-1].contiguous())), o], "self_attn.q_proj.weight has shape"),
    ("wrong-shape-norm", lambda i, o: ["convert", i.variant("v", tensors=_tensor(layer(0, "input_layernorm.weight"), lambda t: t[:-1].contiguous())), o], "input_layernorm.weight has shape"),
    ("integer-tensor", lambda i, o: ["convert", i.variant("v", tensors=_tensor("model.norm.weight", lambda t: t.to(torch.int32))), o], "has dtype I32"),
    ("nan-in-pre-ln-tensor", lambda i, o: ["convert", i.variant("v", tensors=_poison(layer(7, "mlp.down_proj.weight"), float("nan"))), o], "mlp.down_proj.weight holds NaN or inf"),
    ("inf-in-post-ln-norm", lambda i, o: ["convert", i.variant("v", tensors=_poison(layer(0, "input_layernorm.weight"), float("inf"))), o], "input_layernorm.weight holds NaN or inf"),
    ("nan-moved-unchanged", lambda i, o: ["convert", i.variant("v", tensors=_poison("model.embed_tokens.weight", float("nan"))), o, "--strategy", "move"], "embed_tokens.weight holds NaN or inf"),
    ("index-lacks-final-norm", lambda i, o: ["convert", index_without(i, "model.norm.weight"), o], "tensor model.norm.weight is missing"),
    ("index-names-tensor-shard-lacks", lambda i, o: ["convert", index_edit(i, lambda x: {**x, "weight_map": {
        **x["weight_map"], "model.ghost.weight": sorted(set(x["weight_map"].values()))[0]}}), o], "lacks tensor model.ghost.weight"),
    ("index-weight-map-not-a-mapping", lambda i, o: ["convert", index_edit(i, lambda x: {**x, "weight_map": list(x["weight_map"])}), o], "weight_map must be a non-empty mapping"),
    ("index-shard-outside-folder", lambda i, o: ["convert", index_edit(i, lambda x: {**x, "weight_map": {k: "../" + v for k, v in x["weight_map"].items()}}), o], "not a shard file name in this folder"),
    ("truncated-shard-convert", lambda i, o: ["convert", truncated(i), o], "truncated"),
    ("truncated-shard-eval", lambda i, o: ["eval", truncated(i)], "truncated"),
    ("truncated-shard-analyze", lambda i, o: ["analyze", truncated(i), "--out", o], "truncated"),
    ("truncated-shard-inspect", lambda i, o: ["inspect", truncated(i)], "truncated"),
    ("gguf-missing-tensors", lambda i, o: ["convert", llama_gguf(i, blocks=2, tensors_for=1), o], "model.layers.1.input_layernorm.weight is missing"),
    ("gguf-block-count-absurd", lambda i, o: ["convert", llama_gguf(i, blocks=10**9, tensors_for=2), o], "the config asks for 1000000000 layers"),
    ("gguf-nan", lambda i, o: ["convert", llama_gguf(i, blocks=1, tensors_for=1, nan_in="ffn_up"), o, "--strategy", "move"], "tensor model.layers.0.mlp.up_proj.weight holds NaN or inf values"),
    ("gguf-missing-tensors-eval", lambda i, o: ["eval", llama_gguf(i, blocks=3, tensors_for=2)], "model.layers.2.input_layernorm.weight is missing"),
    ("gguf-garbage", lambda i, o: ["convert", i.file("model.gguf", b"GGUF\x03\x00\x00\x00garbage"), o], "not a readable GGUF file"),
    ("mixln-post-ln-above-layers", lambda i, o: ["eval", i.variant("v", config=_set("post_ln_layers", L + 1), base="converted")], "post_ln_layers must be an integer"),
    ("heal-converted-is-pre-ln", lambda i, o: ["heal", i.src, "--teacher", i.src, "--out", o], "not a Mix-LN checkpoint"),
    ("heal-teacher-is-mixln", lambda i, o: ["heal", i.converted, "--teacher", i.converted, "--out", o], "a Mix-LN checkpoint; the teacher"),
    ("eval-no-such-folder", lambda i, o: ["eval", i.root / "no" / "such"], "no such file or folder"),
    ("inspect-no-config", lambda i, o: ["inspect", i.root], "no config.json"),
    # ---- numbers, where they enter ----
    ("eval-batch-size-0", lambda i, o: ["eval", i.src, "--batch-size", "0"], "'--batch-size': 0 is not in the range"),
    ("eval-seq-len-0", lambda i, o: ["eval", i.src, "--seq-len", "0"], "'--seq-len'"),
    ("eval-max-tokens-negative", lambda i, o: ["eval", i.src, "--max-tokens", "-1"], "'--max-tokens'"),
    ("eval-seq-len-beyond-positions", lambda i, o: ["eval", i.src, "--seq-len", "300"], "--seq-len: 300 exceeds the model's max_position_embeddings 256"),
    ("analyze-batch-size-0", lambda i, o: ["analyze", i.src, "--out", o, "--batch-size", "0"], "'--batch-size'"),
    ("analyze-seq-len-beyond-positions", lambda i, o: ["analyze", i.src, "--out", o, "--seq-len", "999"], "exceeds the model's max_position_embeddings"),
    ("analyze-span-beyond-layers", lambda i, o: ["analyze", i.src, "--out", o, "--span", str(L + 1)], "exceeds the 8 layers"),
    ("prune-batch-size-0", lambda i, o: ["prune", i.src, o, "--remove", "1", "--batch-size", "0"], "'--batch-size'"),
    ("prune-layers-open-range", lambda i, o: ["prune", i.src, o, "--layers", "1-"], "--layers: '1-' is not a layer index"),
    ("prune-layers-superscript", lambda i, o: ["prune", i.src, o, "--layers", "²"], "--layers: '²' is not a layer index"),
    ("prune-layers-outside", lambda i, o: ["prune", i.src, o, "--layers", str(L)], "outside [0, 7]"),
    ("prune-layers-all", lambda i, o: ["prune", i.src, o, "--layers", f"0-{L - 1}"], "removes all 8 layers"),
    ("prune-remove-all", lambda i, o: ["prune", i.src, o, "--remove", str(L), "--method", "last"], "--remove: 8 layers is outside"),
    ("prune-shard-size-garbage", lambda i, o: ["prune", i.src, o, "--layers", "1", "--max-shard-size", "lots"], "--max-shard-size"),
    ("heal-eval-data-missing", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--eval-data", i.root / "gone.txt"], "--eval-data"),
    ("heal-batch-size-0", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--batch-size", "0"], "'--batch-size'"),
    ("heal-seq-len-0", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--seq-len", "0"], "'--seq-len'"),
    ("heal-lr-negative", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--lr", "-1"], "'--lr'"),
    ("heal-lr-nan", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--lr", "nan"], "--lr: must be"),
    ("heal-lr-inf", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--lr", "inf"], "--lr: must be"),
    ("heal-lr-diverges", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--data", i.text, "--eval-data", i.text,
                                      "--tokens", "64", "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "32",
                                      "--loss", "residual", "--no-perplexity", "--lr", "1e30"], "the heal diverged at lr 1e+30"),
    ("heal-teacher-other-depth", lambda i, o: ["heal", i.converted, "--teacher", shallower(i), "--out", o], f"num_hidden_layers {L - 2} differs"),
    ("heal-tokens-below-a-step", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--tokens", "10"], "less than one heal step"),
    ("heal-seq-len-beyond-positions", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--seq-len", "512", "--tokens", "4096"], "exceeds the model's max_position_embeddings"),
    # token counts: each has an upper bound (10^13), where a count past it once overflowed a heal's plan
    ("convert-heal-tokens-huge", lambda i, o: ["convert", i.src, o, "--heal-tokens", "100000000000000000000000"], "'--heal-tokens': 100000000000000000000000 is not in the range 0<=x<=10000000000000"),
    ("convert-calibration-tokens-huge", lambda i, o: ["convert", i.src, o, "--calibration-tokens", "100000000000000000000000"], "'--calibration-tokens'"),
    ("heal-tokens-huge", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--tokens", "100000000000000000000000"], "'--tokens'"),
    ("eval-max-tokens-huge", lambda i, o: ["eval", i.src, "--max-tokens", "100000000000000000000000"], "'--max-tokens'"),
    ("analyze-max-tokens-huge", lambda i, o: ["analyze", i.src, "--out", o, "--max-tokens", "100000000000000000000000"], "'--max-tokens'"),
    ("sweep-train-tokens-huge", lambda i, o: ["sweep", i.src, "--out", o, "--train-tokens", "100000000000000000000000"], "'--train-tokens'"),
    ("demo-heal-tokens-huge", lambda i, o: ["demo", "--source", i.src, "--out", o, "--heal-tokens", "100000000000000000000000"], "'--heal-tokens'"),
    ("train-set-max-tokens-huge", lambda i, o: [*recipe(i, "max_tokens=100000000000000000000000"), "--out", o], "max_tokens: must be an integer in [1, 10^13]"),
    ("train-set-max-tokens-past-float", lambda i, o: [*recipe(i, f"max_tokens={10**400}"), "--out", o], "max_tokens: must be an integer in [1, 10^13]"),
    ("train-eval-interval-huge", lambda i, o: [*recipe(i, "eval_interval=1e30"), "--out", o], "eval_interval: must be an integer in [1, 10^13]"),
    ("train-keep-checkpoints-huge", lambda i, o: [*recipe(i, "keep_checkpoints=1e14"), "--out", o], "keep_checkpoints: must be an integer in [0, 10^13]"),
    ("train-warmup-steps-huge", lambda i, o: [*recipe(i, "schedule.warmup_steps=1e23"), "--out", o], "schedule.warmup_steps: must be an integer in [0, 10^13]"),
    ("train-set-heal-tokens-huge", lambda i, o: [*recipe(i, "heal.tokens=1e20"), "--out", o], "heal.tokens: must be an integer in [0, 10^13]"),
    ("convert-alpha-nan", lambda i, o: ["convert", i.src, o, "--alpha", "nan"], "--alpha: must be in [0, 1], got nan"),
    ("demo-alpha-nan", lambda i, o: ["demo", "--source", i.src, "--out", o, "--alpha", "nan"], "--alpha: must be"),
    ("heal-spike-factor-nan", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--spike-factor", "nan"], "--spike-factor:"),
    ("convert-alpha-above-one", lambda i, o: ["convert", i.src, o, "--alpha", "1.5"], "'--alpha'"),
    ("convert-alpha-and-count", lambda i, o: ["convert", i.src, o, "--alpha", "0.5", "--post-ln-layers", "2"], "exclusive"),
    ("convert-seed-negative", lambda i, o: ["convert", i.src, o, "--seed", "-1"], "'--seed'"),
    ("convert-seed-too-large", lambda i, o: ["convert", i.src, o, "--seed", str(2**32)], "'--seed'"),
    ("convert-calibration-seq-len-beyond", lambda i, o: ["convert", i.src, o, "--calibration-seq-len", "999"], "--calibration-seq-len: 999 exceeds"),
    ("convert-shard-size-garbage", lambda i, o: ["convert", i.src, o, "--max-shard-size", "banana"], "--max-shard-size"),
    ("convert-shard-size-zero", lambda i, o: ["convert", i.src, o, "--max-shard-size", "0"], "a positive size"),
    ("convert-shard-size-past-a-pebibyte", lambda i, o: ["convert", i.src, o, "--max-shard-size", "2000TB"], "--max-shard-size: 2000TB is more than 1 PiB"),
    ("heal-shard-size-past-a-pebibyte", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--max-shard-size", "5000TiB"], "--max-shard-size: 5000TiB is more than 1 PiB"),
    ("tokenizer-config-a-list", lambda i, o: ["eval", edited(i, "v", "tokenizer_config.json", lambda c: [])], "cannot load its tokenizer"),
    ("tokenizer-model-unknown", lambda i, o: ["eval", edited(i, "v", "tokenizer.json", lambda c: {**c, "model": {**c["model"], "type": "Nope"}})], "cannot load its tokenizer"),
    ("tokenizer-without-eos", lambda i, o: ["eval", edited(i, "v", "tokenizer_config.json", lambda c: {**c, "eos_token": None})], "/v: its tokenizer has no eos_token_id"),
    ("tokenizer-id-past-vocab", lambda i, o: ["eval", edited(i, "v", "tokenizer.json", lambda c: {**c, "model": {**c["model"], "vocab": {**c["model"]["vocab"], "e": 5000}}})], "its tokenizer has 5001 tokens, more than the model's vocab_size"),
    # Qwen2's tokenizer class loads without tokenizer.json, with no vocabulary: it once scored EOS tokens only, exit 0
    ("tokenizer-json-missing", lambda i, o: ["eval", unlinked(qwen(i), "tokenizer.json")], "its tokenizer turns text into no tokens"),
    ("gguf-rms-eps-negative", lambda i, o: ["convert", qwen2_gguf_with(i, "rms_norm_eps", -1.0), o, "--strategy", "move"], "rms_norm_eps must be a number in (0, 1), got -1.0"),
    ("gguf-rope-theta-nan", lambda i, o: ["convert", qwen2_gguf_with(i, "rope_theta", float("nan")), o, "--strategy", "move"], "rope_theta must be a positive number, got nan"),
    ("compare-matrix-empty-rows", lambda i, o: ["compare", i.analysis("a", angular_distance_matrix=[[], []]), "--out", o], "a list of non-empty lists of numbers"),
    ("compare-summary-layers-fraction", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": 2.0}\n', {"num_layers": 2.5}), "--out", o], "num_layers: must be an integer in [1, 10^6], got 2.5"),
    ("compare-summary-post-ln-beyond-layers", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": 2.0}\n', {"num_layers": 2, "post_ln_layers": 7}), "--out", o], "post_ln_layers 7 exceeds num_layers 2"),
    ("tokenizer-beyond-vocab", lambda i, o: ["eval", "--seq-len", "32", i.variant("v", config=_set("vocab_size", 300),
                                                             tensors=lambda s: {k: v[:300] if v.shape[0] == 320 else v for k, v in s.items()})],
     "its tokenizer has 320 tokens, more than the model's vocab_size 300"),
    ("convert-heal-tokens-negative", lambda i, o: ["convert", i.src, o, "--heal-tokens", "-1"], "'--heal-tokens'"),
    ("convert-heal-tokens-below-a-step", lambda i, o: ["convert", i.src, o, "--heal-tokens", "10"], "--heal-tokens: 10 is less than one heal step (4 x 256 = 1024 tokens)"),
    ("convert-heal-data-shorter-than-a-step", lambda i, o: ["convert", i.src, o, "--heal-tokens", "1024", "--heal-data", i.file("short.txt", "Hi.")], "less than one window of 256 tokens: give more text"),
    ("convert-calibration-seq-len-beyond-positions", lambda i, o: ["convert", i.src, o, "--calibration-seq-len", "100000"], "--calibration-seq-len: 100000 exceeds the model's max_position_embeddings 256"),
    ("convert-calibration-data-without-calibration", lambda i, o: ["convert", i.src, o, "--strategy", "move", "--calibration-data", i.text], "--calibration-data: only --strategy calibrated reads it, not move"),
    ("convert-calibration-tokens-without-calibration", lambda i, o: ["convert", i.src, o, "--strategy", "scratch", "--calibration-tokens", "512"], "--calibration-tokens: only --strategy calibrated"),
    ("convert-heal-data-without-heal", lambda i, o: ["convert", i.src, o, "--heal-data", i.text], "--heal-data: only a heal in the same run reads it"),
    ("eval-data-a-fifo", lambda i, o: ["eval", i.src, "--data", fifo(i)], "not a regular file or folder"),
    ("heal-data-a-fifo", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--data", fifo(i)], "not a regular file or folder"),
    ("convert-calibration-data-a-fifo", lambda i, o: ["convert", i.src, o, "--calibration-data", fifo(i)], "not a regular file or folder"),
    ("convert-heal-data-missing", lambda i, o: ["convert", i.src, o, "--heal-tokens", "4096", "--heal-data", i.root / "gone.txt"], "--heal-data"),
    ("demo-force-and-resume", lambda i, o: ["demo", "--source", i.src, "--out", o, "--force", "--resume"], "give one"),
    ("sweep-alpha-above-one", lambda i, o: ["sweep", i.src, "--out", o, "--alphas", "0,1.5"], "--alphas: 1.5 is not in [0, 1]"),
    ("sweep-alpha-nan", lambda i, o: ["sweep", i.src, "--out", o, "--alphas", "nan"], "--alphas: nan is not in [0, 1]"),
    ("sweep-alpha-empty-item", lambda i, o: ["sweep", i.src, "--out", o, "--alphas", "0.25,,0.5"], "'0.25,,0.5' is not a comma-separated list of numbers"),
    ("sweep-heal-tokens-below-a-step", lambda i, o: ["sweep", i.src, "--out", o, "--heal-tokens", "10"], "--heal-tokens: 10 is less than one heal step"),
    ("sweep-train-tokens-below-a-step", lambda i, o: ["sweep", i.src, "--out", o, "--train-tokens", "10"], "--train-tokens: 10 is less than one training step (1024 tokens)"),
    ("sweep-seeds-0", lambda i, o: ["sweep", i.src, "--out", o, "--seeds", "0"], "'--seeds'"),
    ("sweep-grad-ratio-below-one", lambda i, o: ["sweep", i.src, "--out", o, "--max-grad-ratio", "0.5"], "'--max-grad-ratio'"),
    ("sweep-ppl-increase-inf", lambda i, o: ["sweep", i.src, "--out", o, "--max-ppl-increase", "inf"], "--max-ppl-increase: must be"),
    ("sweep-force-and-resume", lambda i, o: ["sweep", i.src, "--out", o, "--force", "--resume"], "give one"),
    ("sweep-data-missing", lambda i, o: ["sweep", i.src, "--out", o, "--data", i.root / "gone.txt"], "--data"),
    ("sweep-out-inside-src", lambda i, o: ["sweep", i.src, "--out", i.src / "sweep"], "lies inside the input SRC"),
    ("recipes-path-unknown", lambda i, o: ["recipes", "--path", "no-such-config"], "no-such-config: not a shipped recipe or config"),
    ("convert-unknown-dtype", lambda i, o: ["convert", i.src, o, "--dtype", "int8"], "'--dtype'"),
    ("train-heal-seq-len-0", lambda i, o: [*recipe(i, "heal.seq_len=0"), "--out", o], "heal.seq_len: must be an integer in [1, 10^13], got 0"),
    ("train-betas-out-of-range", lambda i, o: [*recipe(i, "optim.betas=[2, 3]"), "--out", o], "optim.betas: 2.0 is not in [0, 1)"),
    ("train-eps-negative", lambda i, o: [*recipe(i, "optim.eps=-1"), "--out", o], "optim.eps: must be a number > 0"),
    ("train-seed-negative", lambda i, o: [*recipe(i, "seed=-1"), "--out", o], "seed: must be an integer in [0, 2^32)"),
    ("train-weight-decay-negative", lambda i, o: [*recipe(i, "optim.weight_decay=-1"), "--out", o], "optim.weight_decay: must be a number >= 0"),
    ("train-lr-nan", lambda i, o: [*recipe(i, "optim.lr=.nan"), "--out", o], "optim.lr: must be a number > 0"),
    ("train-grad-clip-negative", lambda i, o: [*recipe(i, "grad_clip=-1"), "--out", o], "grad_clip: must be a number >= 0"),
    ("train-heal-loss-unknown", lambda i, o: [*recipe(i, "heal.loss=mse"), "--out", o], "heal.loss: unknown value 'mse' (choose from kl, residual)"),
    ("train-heal-checkpointing-not-bool", lambda i, o: [*recipe(i, "heal.activation_checkpointing=3"), "--out", o], "heal.activation_checkpointing"),
    ("train-heal-lr-zero", lambda i, o: [*recipe(i, "heal.lr=0"), "--out", o], "heal.lr: must be a number > 0"),
    ("train-heal-tokens-below-a-step", lambda i, o: [*recipe(i, "heal.tokens=10"), "--out", o], "less than one heal step"),
    ("train-flag-not-a-bool", lambda i, o: [*recipe(i, "allow_longer_seq=yes please"), "--out", o], "allow_longer_seq: must be true or false"),
    ("train-seq-len-beyond-positions", lambda i, o: [*recipe(i, "seq_len=512", "global_batch_size=2", "max_tokens=1024"), "--out", o], "seq_len: 512 exceeds the model's max_position_embeddings"),
    ("train-unknown-key", lambda i, o: [*recipe(i, "optim.momentum=0.9"), "--out", o], "unknown key 'optim.momentum'"),
    ("train-set-wrong-type", lambda i, o: [*recipe(i, "optim.lr=abc"), "--out", o], "--set optim.lr=abc: optim.lr: must be a number > 0, got 'abc'"),
    ("train-set-out-of-range", lambda i, o: [*recipe(i, "conversion.alpha=2"), "--out", o], "--set conversion.alpha=2: conversion.alpha: must be in [0, 1]"),
    ("train-recipe-recursive-alias", lambda i, o: ["train", i.file("self.yaml", "optim: &o {lr: 1.0e-3, again: *o}\n"), "--out", o], "alias *o of a mapping or list"),
    ("train-recipe-alias-bomb", lambda i, o: ["train", alias_bomb(i), "--out", o], "recipes allow aliases of single values only"),
    ("train-source-already-mixln", lambda i, o: [*recipe(i, f"source={i.converted}", validation(i)), "--out", o], "already a Mix-LN checkpoint"),
    ("train-data-shorter-than-a-window", lambda i, o: [*recipe(i, f"data.train={i.file('short.txt', 'Hi.')}", validation(i)), "--out", o], "less than one window of seq_len 32"),
    ("train-set-not-yaml", lambda i, o: [*recipe(i, "optim.lr=[1"), "--out", o], "not valid YAML"),
    ("train-recipe-not-utf8", lambda i, o: ["train", i.file("bad.yaml", b"\xff\xfe: 1"), "--out", o], "bad.yaml: the recipe is not UTF-8"),
    ("train-recipe-a-list", lambda i, o: ["train", i.file("list.yaml", "- 1\n- 2\n"), "--out", o], "a recipe must be a mapping"),
    ("train-recipe-bad-yaml", lambda i, o: ["train", i.file("broken.yaml", "a: [1\n"), "--out", o], "invalid YAML"),
    ("train-trackers-unknown", lambda i, o: [*recipe(i, "trackers=[nosuch]"), "--out", o], "trackers"),
    ("export-mixln-with-post-ln-blocks", lambda i, o: ["export", i.converted, o, "--to", "llama"], "no plain architecture computes"),
    ("export-gguf-mixln-with-post-ln-blocks", lambda i, o: ["export", i.converted, f"{o}.gguf", "--to", "gguf"], "no plain architecture computes"),
    ("export-unknown-target", lambda i, o: ["export", i.src, o, "--to", "onnx"], "--to"),
    ("export-type-without-gguf", lambda i, o: ["export", i.src, o, "--to", "llama", "--type", "q4_0"], "--type"),
    ("export-out-inside-source", lambda i, o: ["export", i.src, i.src / "plain", "--to", "llama", "--force"], "lies inside the input"),
    ("train-recipe-section-twice", lambda i, o: ["train", i.file("twice.yaml", "optim:\n  lr: 1.0e-4\nmax_tokens: 100\noptim:\n  eps: 1.0e-8\n"), "--out", o], "twice.yaml: optim is given twice (lines 1 and 4)"),
    ("train-recipe-key-twice", lambda i, o: ["train", i.file("twice.yaml", "max_tokens: 1000\nmax_tokens: 2000\n"), "--out", o], "twice.yaml: max_tokens is given twice (lines 1 and 2)"),
    ("train-recipe-nested-key-twice", lambda i, o: ["train", i.file("twice.yaml", "optim:\n  lr: 1.0e-4\n  lr: 1.0e-3\n"), "--out", o], "twice.yaml: optim.lr is given twice (lines 2 and 3)"),
    ("train-recipe-source-of-10-mb", lambda i, o: ["train", i.file("long.yaml", "source: " + "a" * 10_000_000 + "\n"), "--out", o], "aaa... (10,000,000 characters)"),
    ("train-set-source-of-1-mb-with-blanks", lambda i, o: [*recipe(i, "source=" + "a b " * 250_000), "--out", o], "source="),
    ("eval-hub-repo-of-two-ggufs", lambda i, o: ["eval", hub_repo(i, {"a.gguf": b"GGUF", "b.gguf": b"GGUF"})], "holds no config.json but 2 .gguf files (a.gguf, b.gguf)"),
    ("eval-hub-repo-of-a-card-only", lambda i, o: ["eval", hub_repo(i, {"README.md": b"a card"})], "holds no config.json and no .gguf file"),
    ("train-unknown-recipe", lambda i, o: ["train", "no-such-recipe", "--out", o], "no-such-recipe: neither a recipe file nor a shipped recipe"),
    ("train-source-missing", lambda i, o: [*recipe(i, f"source={i.root / 'gone'}"), "--out", o], "does not exist"),
    ("train-arms-unknown", lambda i, o: [*recipe(i, "arms=[mixln, postln]"), "--out", o], "arms: unknown arm 'postln' (choose from mixln, preln, lns)"),
    ("train-arm-unknown", lambda i, o: [*recipe(i), "--arm", "postln", "--out", o], "'--arm'"),
    ("convert-lns-with-alpha", lambda i, o: ["convert", i.src, o, "--layout", "lns", "--alpha", "0.25"], "--alpha: --layout lns makes no block Post-LN"),
    ("sweep-lns-without-training", lambda i, o: ["sweep", i.src, "--out", o, "--lns"], "--lns: the LNS retrofit computes the original's function"),
    ("compare-layernorm-scaling-not-bool", lambda i, o: ["compare", i.analysis("a", layernorm_scaling="yes"), "--out", o], "layernorm_scaling: must be true or false"),
    # ---- downstream tasks (lm-eval) ----
    ("eval-empty-task-name", lambda i, o: ["eval", i.src, "--tasks", "mixln_langref_next,"], "--tasks: 'mixln_langref_next,' holds an empty name"),
    ("eval-limit-0", lambda i, o: ["eval", i.src, "--tasks", "mixln_langref_next", "--limit", "0"], "'--limit': 0 is not in the range"),
    ("eval-tasks-batch-size-0", lambda i, o: ["eval", i.src, "--tasks", "mixln_langref_next", "--batch-size", "0"], "'--batch-size': 0 is not in the range"),
    # an lm-eval --limit past sys.maxsize once escaped as "internal error ValueError" from islice
    ("eval-limit-huge", lambda i, o: ["eval", i.src, "--tasks", "mixln_langref_next", "--limit", str(10**21)], "'--limit': 1000000000000000000000 is not in the range 1<=x<=1000000000"),
    ("analyze-task-limit-huge", lambda i, o: ["analyze", i.src, "--out", o, "--task", "mixln_langref_ppl", "--limit", str(10**10)], "'--limit'"),
    ("eval-batch-size-huge", lambda i, o: ["eval", i.src, "--batch-size", str(10**20)], "'--batch-size': 100000000000000000000 is not in the range 1<=x<=65536"),
    ("analyze-batch-size-huge", lambda i, o: ["analyze", i.src, "--out", o, "--batch-size", "65537"], "'--batch-size'"),
    ("prune-batch-size-huge", lambda i, o: ["prune", i.src, o, "--remove", "1", "--batch-size", "65537"], "'--batch-size'"),
    ("heal-batch-size-huge", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--batch-size", "65537"], "'--batch-size'"),
    ("eval-include-path-missing", lambda i, o: ["eval", i.src, "--tasks", "mine", "--include-path", i.root / "gone"], "--include-path: must be an existing folder"),
    ("eval-include-path-is-a-file", lambda i, o: ["eval", i.src, "--tasks", "mine", "--include-path", i.text], "--include-path: must be an existing folder"),
    ("eval-limit-without-tasks", lambda i, o: ["eval", i.src, "--limit", "5"], "--include-path and --limit go with --tasks"),
    ("analyze-unknown-task", lambda i, o: ["analyze", i.src, "--out", o, "--task", "no_such_task"], "--task: unknown task no_such_task"),
    ("analyze-task-limit-0", lambda i, o: ["analyze", i.src, "--out", o, "--task", "mixln_langref_ppl", "--limit", "0"], "'--limit'"),
    ("analyze-include-path-without-task", lambda i, o: ["analyze", i.src, "--out", o, "--include-path", i.root], "go with --task"),
    ("compare-task-drop-short", lambda i, o: ["compare", i.analysis("a", task_drop={"t": {"task": "t", "metric": "acc", "higher_is_better": True, "value": 0.5, "samples": 3, "layer_drop": [0.1]}}), "--out", o], "task_drop.t.layer_drop has 1 entries for 2 layers"),
    ("compare-task-drop-string-value", lambda i, o: ["compare", i.analysis("a", task_drop={"t": {"task": "t", "metric": "acc", "higher_is_better": True, "value": "high", "samples": 3, "layer_drop": [0.1, 0.2]}}), "--out", o], "analysis.json: task_drop.t.value: must be a finite number, got 'high'"),
    ("compare-per-document-not-numbers", lambda i, o: ["compare", i.analysis("a", per_document={"documents": "many"}), "--out", o], "analysis.json: per_document: not per-document scores (missing tokens, words"),
    ("compare-generation-text-not-a-string", lambda i, o: ["compare", i.analysis("a", generation={"new_tokens": 4, "repeated_4gram_share": 0, "continuations": [{"prompt": "p", "text": 3, "repeated_4gram_share": 0}]}), "--out", o], "analysis.json: generation.continuations[0].text: must be a string, got 3"),
    # ---- text ----
    ("eval-data-missing", lambda i, o: ["eval", i.src, "--data", i.root / "none.txt"], "--data"),
    ("eval-data-empty", lambda i, o: ["eval", i.src, "--seq-len", "32", "--data", i.file("empty.txt", "")], "no text found"),
    ("eval-data-too-short", lambda i, o: ["eval", i.src, "--seq-len", "32", "--data", i.file("short.txt", "Two words.")], "short.txt: gives only"),
    ("analyze-data-bad-json", lambda i, o: ["analyze", i.src, "--out", o, "--data", i.file("bad.jsonl", '{"text": "a"}\n{bro')], "bad.jsonl: invalid JSON at line 2"),
    ("analyze-data-not-utf8", lambda i, o: ["analyze", i.src, "--out", o, "--data", i.file("bin.txt", b"\xff\xfe\x00")], "bin.txt: cannot read"),
    ("heal-data-glob-matches-nothing", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--data", i.root / "*.nothing"], "glob pattern matches no files"),
    ("convert-calibration-too-short", lambda i, o: ["convert", i.src, o, "--calibration-data", i.file("short.txt", "Two words.")], "short.txt: gives only"),
    # ---- tokenize, and training on tokenized folders ----
    ("tokenize-data-missing", lambda i, o: ["tokenize", i.root / "gone.jsonl", "--tokenizer", i.src, "--out", o], "DATA"),
    ("tokenize-tokenizer-missing", lambda i, o: ["tokenize", i.text, "--tokenizer", i.root / "gone", "--out", o], "--tokenizer"),
    ("tokenize-num-proc-negative", lambda i, o: tokenize_row(i, o, "--num-proc", "-1"), "'--num-proc': -1 is not in the range"),
    ("tokenize-seq-len-negative", lambda i, o: tokenize_row(i, o, "--seq-len", "-1"), "'--seq-len'"),
    ("tokenize-shard-tokens-0", lambda i, o: tokenize_row(i, o, "--shard-tokens", "0"), "'--shard-tokens'"),
    ("tokenize-seq-len-above-shard", lambda i, o: tokenize_row(i, o, "--seq-len", "64", "--shard-tokens", "32"), "--seq-len 64 is more than --shard-tokens 32"),
    ("tokenize-fraction-one", lambda i, o: tokenize_row(i, o, "--validation-fraction", "1"), "'--validation-fraction'"),
    ("tokenize-fraction-nan", lambda i, o: tokenize_row(i, o, "--validation-fraction", "nan"), "--validation-fraction: must be"),
    ("tokenize-out-is-data", lambda i, o: ["tokenize", i.text, "--tokenizer", i.src, "--out", i.text, "--force"], "is the input DATA"),
    ("tokenize-out-inside-data", lambda i, o: ["tokenize", i.root, "--tokenizer", i.src, "--out", i.root / "tokens", "--force"], "lies inside the input DATA"),
    ("tokenize-out-is-tokenizer", lambda i, o: ["tokenize", i.text, "--tokenizer", i.src, "--out", i.src, "--force"], "is the input --tokenizer"),
    ("tokenize-out-is-validation", lambda i, o: ["tokenize", i.text, "--tokenizer", i.src, "--validation", i.file("v.txt", "x" * 99), "--out", i.root / "v.txt"], "is the input --validation"),
    ("tokenize-out-nonempty", lambda i, o: ["tokenize", i.text, "--tokenizer", i.src, "--out", i.variant("full")], "exists and is not empty"),
    ("tokenize-out-other-tokenization", lambda i, o: tokenize_row(i, tokens(i), "--validation-fraction", "0.5"), "exists and is not empty"),
    ("tokenize-out-tampered-shard", lambda i, o: tokenize_row(i, tokens(i, _flip_shard), "--validation-fraction", "0.2", "--shard-tokens", "2048"), "train-00000.bin: its sha256 is not the manifest's"),
    ("tokenize-nothing-held-out", lambda i, o: ["tokenize", i.text, "--tokenizer", i.src, "--out", o], "gives no validation tokens"),
    ("tokenize-data-bad-json", lambda i, o: ["tokenize", i.file("bad.jsonl", '{"text": "a"}\n{bro'), "--tokenizer", i.src, "--out", o], "bad.jsonl: invalid JSON at line 2"),
    ("train-tokens-manifest-not-json", lambda i, o: [*on_tokens(i, tokens(i, lambda f: (f / "mixln-tokens.json").write_text("{"))), "--out", o], "mixln-tokens.json: damaged"),
    ("train-tokens-manifest-tokens-edited", lambda i, o: [*on_tokens(i, tokens(i, _edit_manifest(lambda m: {**m, "splits": {**m["splits"], "train": {**m["splits"]["train"], "tokens": 1}}}))), "--out", o], "splits: train: tokens 1 is not the sum over its shards"),
    ("train-tokens-manifest-no-tokenizer", lambda i, o: [*on_tokens(i, tokens(i, _edit_manifest(lambda m: {k: v for k, v in m.items() if k != "tokenizer_sha256"}))), "--out", o], "(missing tokenizer_sha256)"),
    ("train-tokens-manifest-no-documents", lambda i, o: [*on_tokens(i, tokens(i, _edit_manifest(lambda m: {**m, "splits": {**m["splits"], "validation": {k: v for k, v in m["splits"]["validation"].items() if k != "documents"}}}))), "--out", o], "splits.validation: not a split's record (missing documents)"),
    ("train-tokens-manifest-shard-renamed", lambda i, o: [*on_tokens(i, tokens(i, _edit_manifest(lambda m: {**m, "splits": {**m["splits"], "train": {**m["splits"]["train"], "shards": [{**s, "file": "../x.bin"} for s in m["splits"]["train"]["shards"]]}}}))), "--out", o], "mixln-tokens.json: damaged"),
    ("train-tokens-shard-truncated", lambda i, o: [*on_tokens(i, tokens(i, _cut_shard)), "--out", o], "train-00001.bin: 4086 bytes, the manifest says 4096"),
    ("train-tokens-shard-missing", lambda i, o: [*on_tokens(i, tokens(i, lambda f: (f / "validation-00000.bin").unlink())), "--out", o], "validation-00000.bin: missing"),
    ("train-tokens-other-tokenizer", lambda i, o: [*on_tokens(i, tokens(i, tokenizer=other_tokenizer(i))), "--out", o], "tokenized with another tokenizer"),
    ("train-tokens-and-validation", lambda i, o: [*recipe(i, f"data.train={tokens(i)}"), "--out", o], "set data.validation to null"),
    ("train-num-proc-negative", lambda i, o: [*recipe(i, "data.num_proc=-1"), "--out", o], "data.num_proc: must be an integer in [0, 10^13], got -1"),
    # ---- study: every number and path checked before any run ----
    ("study-init-unknown", lambda i, o: ["study", i.src, "--out", o, "--init", "scaled,warm"], "--init: unknown scheme 'warm' (choose from scaled, plain)"),
    ("study-init-empty", lambda i, o: ["study", i.src, "--out", o, "--init", ","], "--init: ',' holds an empty name"),
    ("study-alpha-zero", lambda i, o: ["study", i.src, "--out", o, "--alpha", "0"], "'--alpha'"),
    ("study-alpha-nan", lambda i, o: ["study", i.src, "--out", o, "--alpha", "nan"], "--alpha: must be in (0, 1), got nan"),
    ("study-seeds-0", lambda i, o: ["study", i.src, "--out", o, "--seeds", "0"], "'--seeds'"),
    ("study-eval-tokens-0", lambda i, o: ["study", i.src, "--out", o, "--eval-tokens", "0"], "'--eval-tokens'"),
    ("study-set-unknown-key", lambda i, o: ["study", i.src, "--out", o, "--set", "optim.lrr=1"], "unknown key 'optim.lrr'"),
    ("study-set-out-of-range", lambda i, o: ["study", i.src, "--out", o, "--set", "max_tokens=0"], "max_tokens: must be an integer in [1, 10^13]"),
    ("study-out-inside-src", lambda i, o: ["study", i.src, "--out", i.src / "study"], "lies inside the input SRC"),
    ("study-out-is-src-via-dotdot", lambda i, o: ["study", i.src, "--out", i.root / "x" / ".." / "src"], "is the input SRC"),
    ("train-scaled-init-not-bool", lambda i, o: [*recipe(i, "conversion.scaled_init=maybe"), "--out", o], "conversion.scaled_init: must be true or false"),
    ("heal-dtype-unknown", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--dtype", "fp8"], "'--dtype'"),
    # ---- compare: types, not only keys ----
    ("compare-string-perplexity", lambda i, o: ["compare", i.analysis("a", perplexity="low"), "--out", o], "perplexity: must be a number > 0"),
    ("compare-layer-drop-nulls", lambda i, o: ["compare", i.analysis("a", layer_drop=[None, None]), "--out", o], "layer_drop: None is not a finite number"),
    ("compare-matrix-not-lists", lambda i, o: ["compare", i.analysis("a", angular_distance_matrix=[1, 2]), "--out", o], "angular_distance_matrix: must be"),
    ("compare-layers-a-string", lambda i, o: ["compare", i.analysis("a", num_layers="2"), "--out", o], "num_layers: must be an integer in [1, 10^6]"),
    ("compare-analysis-a-list", lambda i, o: ["compare", i.file("list.json", "[1, 2]"), "--out", o], "not a JSON object"),
    ("compare-metrics-lists", lambda i, o: ["compare", i.run("r", "[1, 2]\n"), "--out", o], "record 1: not a training record (not a JSON object)"),
    ("compare-metrics-null-record", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": 2.0}\n\nnull\n'), "--out", o], "record 2: not a training record (not a JSON object)"),
    ("compare-metrics-without-tokens", lambda i, o: ["compare", i.run("r", '{"step": 1, "loss": 2.0}\n'), "--out", o], "record 1: not a training record (missing tokens)"),
    ("compare-metrics-skipped-not-a-flag", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": 2.0, "skipped": "yes"}\n'), "--out", o], "metrics.jsonl: record 1: skipped: must be true or false, got 'yes'"),
    ("compare-metrics-string-loss", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": "x"}\n'), "--out", o], "record 1: loss: must be a finite number, got 'x'"),
    ("compare-summary-string", lambda i, o: ["compare", i.run("r", '{"step": 1, "tokens": 8, "loss": 2.0}\n', summary={"final_val_ppl": "x"}), "--out", o], "summary.json: final_val_ppl: must be a number > 0, got 'x'"),
    ("compare-metrics-not-utf8", lambda i, o: ["compare", i.run("r", b"\xff\xfe"), "--out", o], "not UTF-8"),
    # ---- a checkpoint's declared tying and rope against its tensors and transformers ----
    ("convert-tied-config-separate-head", lambda i, o: ["convert", i.variant("v", config=_set("tie_word_embeddings", True)), o, "--alpha", "0", "--strategy", "move"], "lm_head.weight differs from model.embed_tokens.weight, but"),
    ("eval-tied-config-separate-head", lambda i, o: ["eval", i.variant("v", config=_set("tie_word_embeddings", True)), "--seq-len", "32"], "config.json declares tie_word_embeddings true"),
    ("convert-rope-type-unknown-move", lambda i, o: ["convert", i.variant("v", config=rope(rope_type="bogus")), o, "--strategy", "move"], "rope_parameters.rope_type 'bogus' is not a rope type"),
    ("convert-rope-type-unknown", lambda i, o: ["convert", i.variant("v", config=rope(rope_type="bogus")), o], "rope_parameters.rope_type 'bogus' is not a rope type"),
    ("convert-rope-scaling-type-unknown", lambda i, o: ["convert", i.variant("v", config=lambda c: {**_without("rope_parameters")(c), "rope_scaling": {"type": "bogus", "factor": 2.0}}), o, "--strategy", "move"], "rope_scaling.type 'bogus' is not a rope type"),
    ("convert-rope-yarn-without-factor", lambda i, o: ["convert", i.variant("v", config=rope(rope_type="yarn", original_max_position_embeddings=256)), o, "--strategy", "move"], "'factor'"),
    ("convert-rope-factor-a-string", lambda i, o: ["convert", i.variant("v", config=rope(rope_type="linear", factor="x")), o, "--strategy", "move"], "rope_parameters"),
    ("convert-hidden-act-unknown", lambda i, o: ["convert", i.variant("v", config=_set("hidden_act", "bogus")), o, "--strategy", "move"], "hidden_act 'bogus' is not an activation"),
    # ---- sweep and study: every input checked before anything is written; --resume only their own run ----
    ("sweep-data-not-text", lambda i, o: ["sweep", i.src, "--out", o, "--data", binary(i)], "bin.txt: cannot read"),
    ("sweep-resume-a-users-folder", lambda i, o: ["sweep", i.src, "--out", mine(i), "--resume"], "holds no sweep"),
    ("sweep-resume-other-source", lambda i, o: ["sweep", shallower(i), "--out", finished_sweep(i), "--resume", "--alphas", "0", "--eval-tokens", "256"], "--resume: the sweep in"),
    ("sweep-seeds-huge", lambda i, o: ["sweep", i.src, "--out", o, "--seeds", "99999999999", "--train-tokens", "1024"], "'--seeds': 99999999999 is not in the range 1<=x<=100"),
    ("sweep-alphas-too-many", lambda i, o: ["sweep", i.src, "--out", o, "--alphas", ",".join(str(k / 1000) for k in range(1001))], "--alphas: give 1 to 100 numbers, got 1001"),
    ("study-init-twice", lambda i, o: ["study", i.src, "--out", o, "--init", "scaled,scaled", *STUDY], "--init: 'scaled' is given twice"),
    ("study-seeds-huge", lambda i, o: ["study", i.src, "--out", o, "--seeds", "99999999999"], "'--seeds': 99999999999 is not in the range 1<=x<=100"),
    ("study-data-not-text", lambda i, o: ["study", i.src, "--out", o, "--set", f"data.train={binary(i)}", *STUDY], "bin.txt: cannot read"),
    ("study-resume-a-users-folder", lambda i, o: ["study", i.src, "--out", mine(i), "--resume", *STUDY], "holds no study"),
    # ---- a resumed train over changed data; counts with an upper bound ----
    ("train-resume-data-changed", lambda i, o: resumed_over_changed_data(i), '/text.txt "'),  # started with data PATH "SHA", not "SHA"
    ("tokenize-num-proc-huge", lambda i, o: tokenize_row(i, o, "--num-proc", "10000"), "--num-proc: 10000 is more than"),
    ("train-num-proc-huge", lambda i, o: [*recipe(i, validation(i), "data.num_proc=10000"), "--out", o], "data.num_proc: 10000 is more than"),
    ("eval-tasks-too-many", lambda i, o: ["eval", i.src, "--tasks", ",".join(f"t{k}" for k in range(1000))], "--tasks: give 0 to 256 names, got 1000"),
    # ---- recipes by name: shipped recipes or real files only; messages that name the right thing ----
    ("recipes-path-outside-the-recipes", lambda i, o: ["recipes", "--path", "../evaluation/tasks/langref_next"], "../evaluation/tasks/langref_next: not a shipped recipe or config"),
    ("train-accelerate-config-as-recipe", lambda i, o: ["train", "multi_gpu_ddp", "--out", o], "multi_gpu_ddp: neither a recipe file nor a shipped recipe"),
    ("eval-include-path-malformed-yaml", lambda i, o: ["eval", i.src, "--tasks", "mine", "--include-path", malformed_task(i)], "mine.yaml: malformed YAML"),
    ("convert-heal-tokens-alpha-0", lambda i, o: ["convert", i.src, o, "--heal-tokens", "1024", "--alpha", "0"], "--heal-tokens: --alpha 0 makes no block Post-LN"),
    ("convert-heal-tokens-no-post-ln-layers", lambda i, o: ["convert", i.src, o, "--heal-tokens", "1024", "--post-ln-layers", "0"], "--heal-tokens: --post-ln-layers 0 makes no block Post-LN"),
    ("train-set-a-section", lambda i, o: [*recipe(i, "optim=1"), "--out", o], "'optim' is a section, not a key: set one of optim.lr, "),
    # ---- the upper bound every count has by its declared kind (a typo's extra zeros) ----
    ("eval-seq-len-huge", lambda i, o: ["eval", i.src, "--seq-len", "100000000000000"], "'--seq-len': 100000000000000 is not in the range 1<=x<=10000000000000"),
    ("analyze-span-huge", lambda i, o: ["analyze", i.src, "--out", o, "--span", "100000000000000"], "'--span': 100000000000000 is not in the range 1<=x<=10000000000000"),
    ("convert-post-ln-layers-huge", lambda i, o: ["convert", i.src, o, "--post-ln-layers", "100000000000000"], "'--post-ln-layers': 100000000000000 is not in the range 0<=x<=10000000000000"),
    ("train-set-trackers-empty-name", lambda i, o: [*recipe(i, "trackers=[tensorboard, '']"), "--out", o], "trackers: 'tensorboard,' holds an empty name"),
    # ---- Hugging Face Hub names, offline: what the caches lack is one line; a snapshot is an input ----
    ("convert-hub-model-not-cached", lambda i, o: ["convert", "org/absent", o], "SRC org/absent: no such file or folder, and the Hugging Face cache"),
    ("convert-hub-revision-not-cached", lambda i, o: ["convert", hub_model(i)[0] + "@v9", o], "holds no model org/tiny-llama at revision v9 (offline mode"),
    ("convert-dst-inside-hub-snapshot", lambda i, o: into_snapshot(i), "lies inside the input SRC"),
    ("heal-teacher-hub-model-not-cached", lambda i, o: ["heal", i.converted, "--teacher", "org/absent", "--out", o], "--teacher org/absent: no such file or folder"),
    ("train-source-hub-model-not-cached", lambda i, o: [*recipe(i, "source=org/absent"), "--out", o], "source org/absent: no such file or folder"),
    ("eval-hub-snapshot-lacks-a-shard", lambda i, o: ["eval", partial_snapshot(i)], "lacks model-"),
    ("eval-data-hub-dataset-not-cached", lambda i, o: ["eval", i.src, "--data", "org/absent"], "--data org/absent: no such file or folder, and datasets cannot load it"),
    ("eval-data-hub-dataset-other-revision", lambda i, o: ["eval", i.src, "--data", f"{hub_dataset(i)}@{'3' * 40}"], "is not in the datasets cache"),
    ("tokenize-hub-dataset-no-such-split", lambda i, o: ["tokenize", hub_dataset(i) + "::test", "--tokenizer", i.src, "--out", o], "no split test (splits: train)"),
    ("train-data-hub-dataset-not-cached", lambda i, o: [*recipe(i, "data.train=org/absent"), "--out", o], "data.train org/absent: no such file or folder"),
    # ---- the heal at scale: resume, checkpoints, tokenized data ----
    ("heal-checkpoint-interval-negative", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--checkpoint-interval", "-1"], "'--checkpoint-interval'"),
    ("heal-checkpoint-interval-huge", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--checkpoint-interval", "100000000000000000000"], "'--checkpoint-interval'"),
    ("train-heal-checkpoint-interval-negative", lambda i, o: [*recipe(i, "heal.checkpoint_interval=-1"), "--out", o], "heal.checkpoint_interval: must be an integer in [0, 10^13]"),
    ("heal-interrupted-without-resume", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", interrupted(o)], "a heal of it was interrupted at step 3"),
    ("heal-resume-other-settings", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", interrupted(o), "--resume"], "--resume: the heal in"),
    ("heal-resume-damaged-record", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", interrupted(o, "3"), "--resume"], "run.json: damaged"),
    ("heal-work-folder-holds-the-data", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", i.root / "healed", "--data", i.file(".healed.heal/text.txt", i.text.read_text())], "the heal's work folder"),
    ("heal-work-folder-is-the-users", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", users_folder(o), "--force"], "is not a heal's work folder"),
    ("heal-data-tokens-other-tokenizer", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--data", tokens_folder(i, lambda m: {**m, "tokenizer_sha256": "0" * 64})], "tokenized with another tokenizer"),
    ("train-heal-does-not-fit", lambda i, o: [*recipe(i, "heal.tokens=16777216", "heal.batch_size=65536", "heal.seq_len=256"), "--out", o], "heal: does not fit:"),
    ("heal-fsdp-one-process", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--fsdp"], "--fsdp: shards over several processes, and this heal has one"),
    ("heal-fsdp-residual", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--fsdp", "--loss", "residual"], "--fsdp: shards the whole models the kl loss runs; --loss residual"),
    ("heal-eval-data-tokens-damaged", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o, "--eval-data", tokens_folder(i, lambda m: {**m, "version": 99})], "mixln-tokens.json: damaged"),
    # ---- the lock file beside an output (.OUT.lock): a new file the run makes, or a lock a killed run left;
    # never followed through a link, never an input or a file of the user's ----
    ("export-lock-is-a-symlink", lambda i, o: ["export", i.src, lock_link(i, "plain", i.text), "--to", "llama"], "/.plain.lock is a symlink; remove it or choose another folder"),
    ("export-gguf-lock-is-a-symlink", lambda i, o: ["export", i.src, lock_link(i, "plain.gguf", i.text), "--to", "gguf"], "/.plain.gguf.lock is a symlink"),
    ("convert-lock-is-a-dangling-symlink", lambda i, o: ["convert", i.src, lock_link(i, "conv", i.root / "absent"), "--strategy", "move"], "/.conv.lock is a symlink"),
    ("convert-lock-is-calibration-data", lambda i, o: ["convert", i.src, i.root / "conv", "--calibration-data", i.file(".conv.lock", i.text.read_text())], "/.conv.lock: is the input --calibration-data"),
    ("convert-lock-is-a-users-file", lambda i, o: ["convert", i.src, users_lock(i, "conv"), "--strategy", "move"], "/.conv.lock exists and is not a mixln-convert lock; remove it or choose another folder"),
    ("train-lock-is-the-recipe", lambda i, o: ["train", i.file(".run.lock", "seed: 1\n"), *recipe(i)[2:], "--out", i.root / "run"], "/.run.lock exists and is not a mixln-convert lock"),
    ("sweep-lock-is-a-users-file", lambda i, o: ["sweep", i.src, "--out", users_lock(i, "sweep")], "/.sweep.lock exists and is not a mixln-convert lock"),
    # ---- a refusal once the output is held leaves no folder it made above it (OUT here) ----
    ("convert-nan-into-new-folders", lambda i, o: ["convert", nan_model(i), o / "a" / "b", "--strategy", "move"], "mlp.down_proj.weight holds NaN or inf"),
    ("export-nan-into-new-folders", lambda i, o: ["export", nan_model(i), o / "a" / "b", "--to", "llama"], "mlp.down_proj.weight holds NaN or inf"),
    ("export-gguf-nan-into-new-folders", lambda i, o: ["export", nan_model(i), o / "a" / "b.gguf", "--to", "gguf"], "mlp.down_proj.weight holds NaN or inf"),
    ("prune-nan-into-new-folders", lambda i, o: ["prune", nan_model(i), o / "a" / "b", "--layers", "1"], "mlp.down_proj.weight holds NaN or inf"),
    ("heal-diverges-into-new-folders", lambda i, o: ["heal", i.converted, "--teacher", i.src, "--out", o / "a" / "b", "--data", i.text, "--eval-data", i.text,
                                                     "--tokens", "64", "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "32",
                                                     "--loss", "residual", "--no-perplexity", "--lr", "1e30"], "the heal diverged at lr 1e+30"),
    ("analyze-nan-into-new-folders", lambda i, o: ["analyze", nan_model(i), "--out", o / "a" / "b", "--max-tokens", "256", "--seq-len", "32"], "holds NaN or inf"),
    ("train-data-short-into-new-folders", lambda i, o: [*recipe(i, f"data.train={i.file('short.txt', 'Hi.')}", validation(i)), "--out", o / "a" / "run"], "less than one window of seq_len 32"),
    # ---- a --set key given twice is refused, as a recipe's key given twice is ----
    ("train-set-key-twice", lambda i, o: ["train", "smollm2-135m-cpu", "--set", "optim.lr=1e-4", "--set", "optim.lr=1e-3", "--out", o], "--set optim.lr is given twice (1e-4 and 1e-3): give it once"),
    ("study-set-key-twice", lambda i, o: ["study", i.src, "--out", o, "--set", "seed=1", "--set", " seed=2"], "--set seed is given twice (1 and 2)"),
]


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_is_refused_cleanly(row, tmp_path, request, cli, monkeypatch):
    monkeypatch.setenv("MIXLN_CONVERT_CACHE", str(tmp_path / "cache"))
    _, build, fragment = row
    inputs = Inputs(tmp_path / "inputs", request.getfixturevalue)
    offline_hub(monkeypatch, *hub_caches(inputs))
    out = tmp_path / "out"
    argv = [str(a) for a in build(inputs, out)]
    before = digests(inputs.root)
    result = cli(*argv)
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), f"unhandled {result.exception!r}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert fragment in errors[0], errors[0]
    assert len(errors[0]) <= 2000 + len("Error: "), f"{len(errors[0]):,} characters"  # echoed input is cut
    assert "Traceback" not in result.output
    assert not out.exists()
    assert digests(inputs.root) == before
    leftovers = [p for p in inputs.root.rglob(".*tmp-*")]
    assert leftovers == []


# ---- faults while writing, signals, permissions, speed of refusals ------------------------------


def test_a_garbled_shard_is_refused_where_it_is_read(tmp_path, request, cli, monkeypatch):
    """Shards keep their sizes (so the start-up checks pass) but hold ids past the vocabulary:
    the first read is a one-line error naming the shard, with no checkpoint written."""
    monkeypatch.setenv("MIXLN_CONVERT_CACHE", str(tmp_path / "cache"))
    inputs = Inputs(tmp_path / "inputs", request.getfixturevalue)
    folder = tokens(inputs, _garble_shards)
    before = digests(inputs.root)
    result = cli(*[str(a) for a in on_tokens(inputs, folder)], "--out", str(tmp_path / "run"))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "train-0000" in errors[0] and "is id 65535, past the tokenizer's" in errors[0], result.stderr
    assert "Traceback" not in result.output
    assert digests(inputs.root) == before
    assert not list((tmp_path / "run").rglob("step-*"))


def test_disk_full_is_one_line_naming_dst_and_leaves_nothing(tiny_llama, tmp_path, cli, monkeypatch):
    import errno

    from mixln_convert.io import writer

    def full(file, data):
        raise OSError(errno.ENOSPC, "No space left on device", file.name)

    monkeypatch.setattr(writer, "_write_all", full)
    before = digests(tiny_llama)
    result = cli("convert", tiny_llama, tmp_path / "dst", "--strategy", "move")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"{tmp_path / 'dst'}: writing the output failed: No space left on device" in errors[0]
    assert "were written before the disk filled" in errors[0]
    assert list(tmp_path.iterdir()) == [] and digests(tiny_llama) == before


@pytest.mark.skipif(sys.platform != "linux", reason="a file size limit (RLIMIT_FSIZE) stands in for a full disk")
def test_a_short_gguf_write_is_named_and_leaves_nothing(tiny_llama, tmp_path):
    """gguf-py writes tensors with numpy's tofile, whose failure says only "N requested and M written" (once the
    whole message): past a file size limit here, as on a full disk, one line naming the file and a short write."""
    import resource

    out = tmp_path / "new" / "model.gguf"
    done = subprocess.run([sys.executable, "-m", "mixln_convert.cli", "export", str(tiny_llama), str(out), "--to", "gguf"],
                          capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000)))
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(rf"Error: {re.escape(str(out))}: writing the output failed: a short write \([\d,]+ of [\d,]+ "
                        r"bytes written\)", errors[0]), errors[0]
    assert list(tmp_path.iterdir()) == []


def test_a_short_write_on_a_full_disk_says_so(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mixln_convert.io import atomic

    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "model.gguf").write_bytes(b"x" * 2**20)
    message = atomic.write_failure(tmp_path / "model.gguf", OSError("2048 requested and 1784 written"), tmp_path / "tmp")
    assert message == (f"{tmp_path / 'model.gguf'}: writing the output failed: a short write (1,784 of 2,048 bytes "
                       "written); 1.0 MiB were written before the disk filled, free space and run again")


def test_a_small_file_written_on_a_full_disk_names_itself_and_leaves_no_temporary(tmp_path, monkeypatch):
    import errno
    import tempfile

    from mixln_convert.io import atomic

    real = tempfile.NamedTemporaryFile

    class FullDisk:  # the real temporary file, whose writes fail as on a full disk
        def __init__(self, *args, **kwargs):
            self.file = real(*args, **kwargs)
            self.name = self.file.name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            self.file.flush()

        def close(self):
            self.file.close()

    monkeypatch.setattr(atomic.tempfile, "NamedTemporaryFile", FullDisk)
    (tmp_path / "recipe.yaml").write_text("old\n")
    with pytest.raises(OSError) as raised:
        atomic.write_atomic(tmp_path / "recipe.yaml", "new\n")
    monkeypatch.undo()
    assert raised.value.filename == str(tmp_path / "recipe.yaml") and raised.value.errno == errno.ENOSPC
    assert [p.name for p in tmp_path.iterdir()] == ["recipe.yaml"] and (tmp_path / "recipe.yaml").read_text() == "old\n"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_users_umask(tiny_llama, tmp_path, cli, umask):
    old = os.umask(umask)
    try:
        result = cli("convert", tiny_llama, tmp_path / "dst", "--strategy", "move")
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "dst").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "dst" / "config.json").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_heal_leaves_no_temporary_folder(converted, tiny_llama, tmp_path, sig):
    out = tmp_path / "healed"
    cmd = [sys.executable, "-m", "mixln_convert.cli", "heal", str(converted), "--teacher", str(tiny_llama),
           "--out", str(out), "--tokens", str(2**21), "--seq-len", "32", "--eval-tokens", "256", "--no-perplexity"]
    # As from a terminal: SIGINT at its default even when the test runner was started with it
    # ignored (a background job of a non-interactive shell), which the child would inherit. stderr
    # to a file: a pipe nobody reads fills with progress bars and blocks the child.
    log = (tmp_path.parent / f"{tmp_path.name}-stderr.txt").open("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 600  # a loaded machine: wait for training to start, not a fixed time
    while time.time() < deadline and proc.poll() is None:
        if (tmp_path / ".healed.heal" / "heal_metrics.jsonl").is_file():
            break  # training has started (the heal's work folder holds its metrics as it goes)
        time.sleep(0.05)
    proc.send_signal(sig)
    code = proc.wait(timeout=180)
    log.seek(0)
    stderr = log.read()
    assert code != 0 and "Traceback" not in stderr, stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


FAST_REFUSALS = {
    "alpha": (["convert", "{src}", "{tmp}/dst", "--alpha", "1.5"], "'--alpha'"),
    "lns-with-alpha": (["convert", "{src}", "{tmp}/dst", "--layout", "lns", "--alpha", "0.25"], "--layout lns makes no"),
    "heal-tokens": (["heal", "{src}", "--teacher", "{src}", "--tokens", "1"], "--tokens"),
    "shard-size": (["prune", "{src}", "{tmp}/dst", "--remove", "1", "--max-shard-size", "lots"], "--max-shard-size"),
    # a known name beside the unknown one: only the unknown one is named (lm-eval's whole index is
    # read for it, ~15 s here, so this is the only eval case that asks it)
    "unknown-task": (["eval", "{src}", "--tasks", "mixln_langref_next,no_such_task"], "--tasks: unknown task no_such_task ("),
}


@pytest.mark.parametrize("case", FAST_REFUSALS)
def test_option_refusals_come_before_torch_is_imported(case, tiny_llama, tmp_path):
    """The property that makes a bad option answer within a second: the options (the packages' options.py) are
    checked before torch (seconds to import) and transformers are imported. Paths are checked by
    the API function, before any weights are read (the tables above)."""
    argv, fragment = FAST_REFUSALS[case]
    argv = [a.format(src=tiny_llama, tmp=tmp_path) for a in argv]
    code = ("import sys\nfrom mixln_convert.cli import main\ntry:\n    main(%r)\nexcept SystemExit as e:\n"
            "    print('exit', e.code, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))"
            % (argv,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip().startswith("exit ") and not done.stdout.strip().startswith("exit 0"), done.stdout
    assert done.stdout.strip().endswith("[]"), done.stdout
    assert fragment in done.stderr, done.stderr


@pytest.mark.parametrize("flag, value", [*[("--batch-size", v) for v in (2**16 + 1, 0, 2.5, float("inf"), True)],
                                         *[("--limit", v) for v in (10**9 + 1, 10**21, 0, 2.5, float("nan"), True)]])
def test_api_batch_sizes_and_limits_are_range_checked_before_any_work(flag, value, tiny_llama, converted, tmp_path):
    """A library caller's --batch-size and --limit get the flag's one-line error, before any work
    (a --limit past sys.maxsize once reached lm-eval's islice as "internal error ValueError")."""
    from mixln_convert.analysis.analyze import analyze
    from mixln_convert.evaluation.downstream import evaluate_tasks
    from mixln_convert.errors import MixLNError
    from mixln_convert.evaluation.perplexity import prepare_scoring
    from mixln_convert.healing import heal
    from mixln_convert.surgery.prune import prune

    calls = {"--batch-size": [lambda: analyze(tiny_llama, tmp_path / "a", batch_size=value, progress=False),
                              lambda: heal(converted, tiny_llama, tmp_path / "h", batch_size=value, progress=False),
                              lambda: prune(tiny_llama, tmp_path / "p", remove=1, batch_size=value),
                              lambda: prepare_scoring(tiny_llama, max_tokens=64, batch_size=value),
                              lambda: evaluate_tasks(None, None, ["t"], None, batch_size=value)],
             "--limit": [lambda: analyze(tiny_llama, tmp_path / "a", limit=value, progress=False),
                         lambda: evaluate_tasks(None, None, ["t"], None, limit=value)]}
    for call in calls[flag]:
        with pytest.raises(MixLNError, match=rf"^{flag}: "):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_api_tasks_given_as_a_string_or_none_read_as_the_cli_reads_them():
    """tasks="a,b" was once iterated into the unknown tasks 'a', ',' and 'b', and tasks=None was a TypeError."""
    from mixln_convert.analysis.options import AnalyzeOptions
    from mixln_convert.errors import MixLNError
    from mixln_convert.evaluation.options import EvalOptions

    assert EvalOptions(tasks="hellaswag").tasks == ("hellaswag",)
    assert AnalyzeOptions(tasks="a, b").tasks == ("a", "b") and EvalOptions(tasks=None).tasks == ()
    with pytest.raises(MixLNError, match=r"^--task: 'a,' holds an empty name"):
        AnalyzeOptions(tasks="a,")
    with pytest.raises(MixLNError, match=r"^--task: 'a' is given twice"):
        AnalyzeOptions(tasks="a, b,a")


def test_api_shard_size_none_is_refused_where_there_is_no_default(tiny_llama, converted, tmp_path):
    """None is a conversion's default (the source's largest shard); heal and prune have none, and
    once took it through their checks to a TypeError in the writer, after the whole heal."""
    from mixln_convert.errors import MixLNError
    from mixln_convert.healing import heal
    from mixln_convert.surgery.prune import prune

    for call in (lambda: heal(converted, tiny_llama, tmp_path / "h", max_shard_size=None, progress=False),
                 lambda: prune(tiny_llama, tmp_path / "p", remove=1, max_shard_size=None, progress=False)):
        with pytest.raises(MixLNError, match=r"^--max-shard-size: cannot read size None"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [0, -1, True, 2.5, float("nan"), 2**50 + 1, "0", "lots"])
def test_api_shard_sizes_are_refused_when_the_options_are_made(value, tiny_llama, converted, tmp_path):
    """A library caller's max_shard_size is checked with the other options, before any work (an int 0
    or -1 once reached the writer unchecked)."""
    from mixln_convert.conversion.converter import convert
    from mixln_convert.errors import MixLNError
    from mixln_convert.healing import heal
    from mixln_convert.surgery.prune import prune

    for call in (lambda: convert(tiny_llama, tmp_path / "c", max_shard_size=value, progress=False),
                 lambda: heal(converted, tiny_llama, tmp_path / "h", max_shard_size=value, progress=False),
                 lambda: prune(tiny_llama, tmp_path / "p", remove=1, max_shard_size=value, progress=False)):
        with pytest.raises(MixLNError, match=r"^--max-shard-size: "):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**14, 10**400, 0, 2.5, True])
def test_api_token_counts_are_range_checked_before_any_work(value, tiny_llama, tmp_path):
    """A library caller's token count gets the flag's one-line error too, before anything is written
    (inf and NaN once escaped as OverflowError / ValueError from int(), an int past float's range from isfinite)."""
    from mixln_convert.analysis.analyze import analyze
    from mixln_convert.conversion.converter import convert
    from mixln_convert.errors import MixLNError
    from mixln_convert.evaluation.perplexity import prepare_scoring
    from mixln_convert.data import tokenize
    from mixln_convert.healing import heal

    calls = {"--max-tokens": lambda: analyze(tiny_llama, tmp_path / "a", max_tokens=value, progress=False),
             "eval_at": lambda: heal(tiny_llama, tiny_llama, tmp_path / "h", eval_at=(value,), progress=False),
             "max_validation_tokens": lambda: tokenize(None, tiny_llama, tmp_path / "t", max_validation_tokens=value),
             "--calibration-tokens": lambda: convert(tiny_llama, tmp_path / "c", calibration_tokens=value, progress=False),
             "--max-tokens ": lambda: prepare_scoring(tiny_llama, max_tokens=value)}
    for flag, call in calls.items():
        with pytest.raises(MixLNError, match=rf"^{flag.strip()}: must be an integer in \[1, 10\^13\], got "):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
