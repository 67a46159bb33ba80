"""`mixln-convert tokenize` and the tokenized folders training reads: ids identical to a plain
tokenization, N processes = 1, the validation split, rerun and resume, reads limited to the windows used."""

import json
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mixln_convert.data import PackedWindows, open_tokens, read_texts, tokenize, windows
from mixln_convert.data.corpus import token_ids
from mixln_convert.data.shards import MANIFEST, file_sha256, token_dtype
from mixln_convert.data.tokenization import _digest, held_out, tokenizer_fingerprint
from mixln_convert.errors import MixLNWarning
from tiny import tiny_tokenizer

REPO = Path(__file__).parent.parent
WORDS = "the of model layer norm residual stream token block attention gradient quick brown fox jumps".split()
SHARD = 4096  # tokens per shard: a handful of shards from the corpus below


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """1,200 documents in two JSON-lines files (one gzipped), one of them twice."""
    import gzip

    rng = random.Random(0)
    docs = [" ".join(rng.choices(WORDS, k=rng.randint(5, 60))) for _ in range(1200)]
    docs[700] = docs[3]  # a copy: both copies must land on the same side
    folder = tmp_path_factory.mktemp("corpus")
    with open(folder / "a.jsonl", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[:600])
    with gzip.open(folder / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[600:])
    return folder


def stream(folder: Path, tokenizer, split: str) -> np.ndarray:
    train, validation = open_tokens(folder, tokenizer)
    return np.asarray((train if split == "train" else validation)[:])


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tokenized(corpus, tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=1, shard_tokens=SHARD, progress=False)
    return out


def test_shards_are_a_plain_tokenization_split_by_document(tokenized, corpus, tokenizer):
    docs = read_texts(corpus)
    sides = [held_out(_digest(d), 0.1) for d in docs]
    train_docs = [d for d, side in zip(docs, sides) if not side]
    validation_docs = [d for d, side in zip(docs, sides) if side]
    assert 60 < len(validation_docs) < 180 and not set(train_docs) & set(validation_docs)
    assert sides[3] == sides[700]  # copies on one side
    assert np.array_equal(stream(tokenized, tokenizer, "train"), token_ids(tokenizer, train_docs))
    assert np.array_equal(stream(tokenized, tokenizer, "validation"), token_ids(tokenizer, validation_docs))

    manifest = json.loads((tokenized / MANIFEST).read_text())
    assert manifest["dtype"] == "uint16" and manifest["tokenizer_sha256"] == tokenizer_fingerprint(tokenizer)
    assert [(s["path"], s["bytes"]) for s in manifest["sources"]] == [
        (str(p), p.stat().st_size) for p in (corpus / "a.jsonl", corpus / "b.jsonl.gz")]
    assert manifest["validation"] == {"rule": "sha256(document)[:8] < fraction * 2**64", "fraction": 0.1}
    train = manifest["splits"]["train"]
    assert train["documents"] == len(train_docs) and manifest["splits"]["validation"]["documents"] == len(validation_docs)
    assert len(train["shards"]) > 3 and all(s["tokens"] == SHARD for s in train["shards"][:-1])
    for shard in train["shards"]:
        path = tokenized / shard["file"]
        assert path.stat().st_size == 2 * shard["tokens"] and file_sha256(path) == shard["sha256"]
    assert sorted(p.name for p in tokenized.parent.iterdir()) == ["tokens"]  # no partial folder left


def test_the_manifest_reads_back_as_written_and_a_damaged_one_is_refused_naming_file_and_key(tokenized, tmp_path):
    import shutil

    from mixln_convert.data.shards import read_manifest
    from mixln_convert.errors import MixLNError

    written = (tokenized / MANIFEST).read_text()
    assert json.dumps(read_manifest(tokenized).to_dict(), indent=1) + "\n" == written  # key for key
    copy = tmp_path / "copy"
    shutil.copytree(tokenized, copy)
    for damage, key in [(lambda m: m["splits"]["train"]["shards"][1].update(sha256=7),
                         "splits.train.shards[1].sha256: must be a string"),
                        (lambda m: m.update(dtype="int8"), "dtype: unknown dtype 'int8'"),
                        (lambda m: m["splits"].pop("validation"), "splits: validation is missing")]:
        manifest = json.loads(written)
        damage(manifest)
        (copy / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(MixLNError) as refused:
            read_manifest(copy)
        assert str(refused.value).startswith(f"{copy / MANIFEST}: damaged ({key}") and "\n" not in str(refused.value)


def test_the_hold_out_rule_is_a_record_written_as_read_and_a_damaged_one_is_refused_naming_file_and_key(
        tokenized, tmp_path):
    import shutil

    from mixln_convert.data.shards import HoldOut, read_manifest
    from mixln_convert.errors import MixLNError

    rule = "sha256(document)[:8] < fraction * 2**64"
    assert read_manifest(tokenized).validation == HoldOut(rule=rule, fraction=0.1)
    # the validation sources' rule has no fraction: none is written
    assert HoldOut(rule="the documents of the validation sources").to_dict() == {
        "rule": "the documents of the validation sources"}
    written = (tokenized / MANIFEST).read_text()
    copy = tmp_path / "copy"
    shutil.copytree(tokenized, copy)
    for validation, key in [({"fraction": 0.1}, "validation: not a hold-out rule (missing rule)"),
                            ({"rule": 7}, "validation.rule: must be a string"),
                            ({"rule": rule, "fraction": 2}, "validation.fraction: must be in (0, 1)"),
                            ([rule], "validation: not a hold-out rule (not a JSON object)")]:
        (copy / MANIFEST).write_text(json.dumps({**json.loads(written), "validation": validation}))
        with pytest.raises(MixLNError) as refused:
            read_manifest(copy)
        assert str(refused.value).startswith(f"{copy / MANIFEST}: damaged ({key}") and "\n" not in str(refused.value)


def test_two_processes_write_the_same_shards(tokenized, corpus, tokenizer, tmp_path):
    out = tmp_path / "two"
    tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=2, shard_tokens=SHARD, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in tokenized.iterdir()}


def test_rerun_writes_nothing_and_changed_inputs_need_force(tokenized, corpus, tokenizer):
    before = files(tokenized)
    tokenize(corpus, tokenizer, tokenized, validation_fraction=0.1, num_proc=1, shard_tokens=SHARD, progress=False)
    assert files(tokenized) == before and sorted(p.name for p in tokenized.parent.iterdir()) == ["tokens"]
    from mixln_convert.errors import MixLNError

    with pytest.raises(MixLNError, match="exists and is not empty"):  # other settings: not this tokenization
        tokenize(corpus, tokenizer, tokenized, validation_fraction=0.2, shard_tokens=SHARD, progress=False)
    assert files(tokenized) == before


def test_explicit_validation_documents_never_train(corpus, tokenizer, tmp_path):
    docs = read_texts(corpus)
    given = tmp_path / "validation.jsonl"
    given.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:5]))
    out = tmp_path / "tokens"
    manifest = tokenize(corpus, tokenizer, out, validation=given, shard_tokens=SHARD, progress=False)
    rest = [d for d in docs if d not in set(docs[:5])]
    assert manifest.splits["validation"].documents == 5 and manifest.splits["train"].documents == len(rest)
    assert manifest.sources[0] == {"role": "validation", "path": str(given), "bytes": given.stat().st_size,
                                   "sha256": file_sha256(given)}
    assert np.array_equal(stream(out, tokenizer, "train"), token_ids(tokenizer, rest))
    assert np.array_equal(stream(out, tokenizer, "validation"), token_ids(tokenizer, docs[:5]))


def test_the_api_takes_a_checkpoint_for_its_tokenizer_and_never_writes_an_input(corpus, tiny_llama, tmp_path):
    """tokenize() checks its paths itself (the CLI only parses): a checkpoint folder gives its
    tokenizer, and an output that is an input is refused, --force or not, with the input unchanged."""
    from mixln_convert.errors import MixLNError
    from mixln_convert.io.loader import open_checkpoint

    by_path = tokenize(corpus, str(tiny_llama), tmp_path / "a", validation_fraction=0.1, shard_tokens=SHARD,
                       progress=False)
    in_hand = tokenize(corpus, open_checkpoint(tiny_llama).tokenizer, tmp_path / "b", validation_fraction=0.1,
                       shard_tokens=SHARD, progress=False)
    assert by_path.tokenizer_sha256 == in_hand.tokenizer_sha256 and by_path.splits == in_hand.splits
    before = files(corpus)
    for out, named in ((corpus, "DATA"), (tiny_llama, "--tokenizer")):
        with pytest.raises(MixLNError, match=f"^--out {out}: is the input {named} "):
            tokenize(corpus, str(tiny_llama), out, force=True, progress=False)
    with pytest.raises(MixLNError, match="^DATA .*gone.txt: no such file or folder"):
        tokenize(tmp_path / "gone.txt", str(tiny_llama), tmp_path / "c", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(MixLNError, match="exists and is not a folder"):
        tokenize(corpus, str(tiny_llama), tmp_path / "file", force=True, progress=False)
    assert files(corpus) == before and not (tmp_path / "c").exists() and (tmp_path / "file").read_text() == "x"


def test_limits_and_seq_len(corpus, tokenizer, tmp_path):
    manifest = tokenize(corpus, tokenizer, tmp_path / "t", seq_len=100, shard_tokens=SHARD, max_tokens=10_000,
                        max_validation_tokens=500, progress=False)
    assert manifest.shard_tokens == 4000  # whole windows of 100
    assert [s.tokens for s in manifest.splits["train"].shards] == [4000, 4000, 2000]
    assert manifest.splits["validation"].tokens == 500
    full = token_ids(tokenizer, [d for d in read_texts(corpus) if not held_out(_digest(d), 0.01)])
    assert np.array_equal(stream(tmp_path / "t", tokenizer, "train"), full[:10_000])  # a prefix, cut exactly


class WideTokenizer:
    """Whitespace 'tokenizer' of numbers, with a vocabulary too large for uint16."""

    eos_token_id = 0

    def __len__(self):
        return 100_000

    def get_vocab(self):
        return {"wide": 0}

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[int(w) for w in t.split()] for t in texts]}


def test_a_vocabulary_beyond_uint16_gets_int32_shards(tmp_path):
    assert token_dtype(2**16) == "uint16" and token_dtype(2**16 + 1) == "int32"
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"{70000 + i} 3 99999"}) + "\n" for i in range(50)))
    manifest = tokenize(data, WideTokenizer(), tmp_path / "t", validation_fraction=0.5, progress=False)
    assert manifest.dtype == "int32"
    train = stream(tmp_path / "t", WideTokenizer(), "train")
    assert train.dtype == np.int32 and train.max() == 99999 and 70000 <= train[0] < 70050


# Tokenizes the corpus, SIGKILLing itself after the 5th chunk's shards are written but before its
# progress is recorded: the partial folder then holds a shard longer than its record.
KILLED = """
import os, signal, sys
from mixln_convert.data import shards, tokenization
sys.path.insert(0, sys.argv[3])
from tiny import tiny_tokenizer

tokenization.CHUNK_CHARS = 2000
calls, append = [], shards.TokenShardWriter.append
def append_then_die(self, ids):
    append(self, ids)
    calls.append(1)
    if len(calls) == 10:  # two writers a chunk: after the 5th chunk
        os.kill(os.getpid(), signal.SIGKILL)
shards.TokenShardWriter.append = append_then_die
tokenization.tokenize(sys.argv[1], tiny_tokenizer(), sys.argv[2], validation_fraction=0.1, num_proc=1,
                  shard_tokens=1000, progress=False)
"""


def test_a_killed_run_resumes_to_identical_shards(corpus, tokenizer, tmp_path, monkeypatch, caplog):
    from mixln_convert.data import tokenization as module

    monkeypatch.setattr(module, "CHUNK_CHARS", 2000)
    whole = tmp_path / "whole"
    tokenize(corpus, tokenizer, whole, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", KILLED, str(corpus), str(out), str(REPO / "tests")],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    partial = tmp_path / ".out.partial"
    progress = json.loads((partial / "progress.json").read_text())
    shards = progress["splits"]["train"]["shards"]
    assert not out.exists() and len(shards) >= 2 and progress["position"][0] == 0
    assert (partial / shards[-1]["file"]).stat().st_size > 2 * shards[-1]["tokens"]  # written past its record

    with caplog.at_level(logging.INFO, "mixln_convert"):
        tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    assert "resuming .out.partial at input 1" in caplog.text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in whole.iterdir()}
    assert not partial.exists()


def _stopped_after_three_chunks(module, monkeypatch, corpus, tokenizer, out):
    """A tokenize run into ``out`` stopped (as if killed) after 3 chunks of 2,000 characters: its partial folder
    holds their shards and progress.json."""
    results = module._results

    def stop_after_three_chunks(*args):
        for n, result in enumerate(results(*args)):
            if n == 3:
                raise KeyboardInterrupt
            yield result

    monkeypatch.setattr(module, "CHUNK_CHARS", 2000)
    monkeypatch.setattr(module, "_results", stop_after_three_chunks)
    with pytest.raises(KeyboardInterrupt):
        tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    monkeypatch.setattr(module, "_results", results)


def test_a_damaged_partial_folder_starts_afresh(corpus, tokenizer, tmp_path, monkeypatch):
    from mixln_convert.data import tokenization as module

    whole = tmp_path / "whole"
    tokenize(corpus, tokenizer, whole, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    partial = tmp_path / ".out.partial"
    _stopped_after_three_chunks(module, monkeypatch, corpus, tokenizer, tmp_path / "out")
    record = json.loads((partial / "progress.json").read_text())
    first = partial / record["splits"]["train"]["shards"][0]["file"]
    first.write_bytes(b"\0\0" + first.read_bytes()[2:])  # a full shard, tampered
    with pytest.warns(MixLNWarning, match="does not resume"):
        tokenize(corpus, tokenizer, tmp_path / "out", validation_fraction=0.1, num_proc=1, shard_tokens=1000,
                 progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == {
        p.name: p.read_bytes() for p in whole.iterdir()}


@pytest.mark.parametrize("damage, key", [
    (lambda p: p["splits"]["train"]["shards"][0].update(tokens="many"),
     "splits.train.shards[0].tokens: must be an integer"),
    (lambda p: p["splits"].pop("validation"), "splits: validation is missing"),
    (lambda p: p.update(position=[0]), "position: give 2 numbers, got 1"),
    (lambda p: p.pop("settings_sha256"), "not a tokenize run's progress (missing settings_sha256)")])
def test_a_stopped_run_s_progress_is_a_record_and_a_damaged_one_starts_afresh_naming_file_and_key(
        corpus, tokenizer, tmp_path, monkeypatch, damage, key):
    from mixln_convert.data import tokenization as module

    partial = tmp_path / ".out.partial"
    _stopped_after_three_chunks(module, monkeypatch, corpus, tokenizer, tmp_path / "out")
    file = partial / module.PROGRESS
    written = file.read_text()
    progress = module.Progress.read(file)
    assert progress.splits["train"].shards[0].sha256 is not None and progress.splits["train"].shards[-1].sha256 is None
    assert json.dumps(progress.to_dict()) == written  # key for key, byte for byte
    record = json.loads(written)
    damage(record)
    file.write_text(json.dumps(record))
    with pytest.warns(MixLNWarning, match="does not resume") as warned:
        tokenize(corpus, tokenizer, tmp_path / "out", validation_fraction=0.1, num_proc=1, shard_tokens=1000,
                 progress=False)
    assert f"({file}: {key}" in str(warned[0].message)
    assert not partial.exists() and (tmp_path / "out" / MANIFEST).is_file()


def test_a_full_disk_keeps_the_partial_folder_and_says_so_and_a_rerun_resumes(corpus, tokenizer, tmp_path,
                                                                              monkeypatch, caplog):
    import errno

    from mixln_convert.data import shards, tokenization as module
    from mixln_convert.errors import MixLNError

    whole = tmp_path / "whole"
    tokenize(corpus, tokenizer, whole, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    append, calls = shards.TokenShardWriter.append, []

    def fills_up(self, ids):  # the disk fills after a few chunks' ids
        calls.append(1)
        if len(calls) > 8:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.folder / "train-00003.bin"))
        return append(self, ids)

    monkeypatch.setattr(module, "CHUNK_CHARS", 2000)
    monkeypatch.setattr(shards.TokenShardWriter, "append", fills_up)
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    with pytest.raises(MixLNError) as refused:
        tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    message = str(refused.value)
    assert message.startswith(f"{out}: writing the output failed: No space left on device") and "\n" not in message
    assert f"are kept in {partial}: free space and run again to resume" in message
    assert partial.is_dir() and not out.exists()

    monkeypatch.setattr(shards.TokenShardWriter, "append", append)
    with caplog.at_level(logging.INFO, "mixln_convert"):
        tokenize(corpus, tokenizer, out, validation_fraction=0.1, num_proc=1, shard_tokens=1000, progress=False)
    assert "resuming .out.partial" in caplog.text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in whole.iterdir()}


def test_each_rank_reads_only_the_windows_it_trains_on(tokenized, tokenizer):
    """Opening a tokenized folder maps no shard; each of two ranks maps and reads only the windows
    its share of the samples needs, and the two shares together are the one-process samples."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    train, _ = open_tokens(tokenized, tokenizer)
    seq_len = 256
    assert train.maps == {}
    one = [row.tolist() for row in DataLoader(PackedWindows(windows(train, seq_len, "t"), 12, 0), batch_size=2)]
    read_by_rank = []
    for rank in (0, 1):
        train, _ = open_tokens(tokenized, tokenizer)
        window_view = windows(train, seq_len, "t")
        read = []
        getitem = type(window_view).__getitem__
        window_view.__class__ = type("Counting", (type(window_view),), {
            "__getitem__": lambda self, j: read.append(int(j)) or getitem(self, j)})
        loader = prepare_data_loader(DataLoader(PackedWindows(window_view, 12, 0), batch_size=2), num_processes=2,
                                     process_index=rank, put_on_device=False)
        rows = [row.tolist() for batch in loader for row in batch]
        assert len(read) == 6 and len(rows) == 6
        assert set(train.maps) == {j * seq_len // SHARD for j in read} | {((j + 1) * seq_len - 1) // SHARD for j in read}
        read_by_rank.append((set(read), rows))
    assert not read_by_rank[0][0] & read_by_rank[1][0]
    assert sorted(read_by_rank[0][1] + read_by_rank[1][1]) == sorted(r for batch in one for r in batch)


def test_train_reads_a_tokenized_folder_without_tokenizing(tiny_llama, corpus, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from mixln_convert.data import tokenization
    from mixln_convert.workflows.train import train
    from mixln_convert.training import load_recipe

    folder = tmp_path / "tokens"
    tokenize(corpus, AutoTokenizer.from_pretrained(tiny_llama), folder, validation_fraction=0.1, shard_tokens=SHARD,
             progress=False)
    before = {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in folder.iterdir()}
    monkeypatch.setattr(tokenization, "_build", lambda *a, **k: pytest.fail("train tokenized"))
    sets = [f"source={tiny_llama}", f"data.train={folder}", "data.validation=null", "seq_len=32",
            "micro_batch_size=2", "global_batch_size=2", "max_tokens=128", "data.eval_tokens=256", "precision=fp32",
            "schedule.warmup_steps=1", "heal.tokens=0"]
    summary = train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run", arms=("preln",), progress=False)["preln"]
    assert summary.steps == 2 and summary.final_val_loss > 0
    assert {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in folder.iterdir()} == before


def test_window_order_is_a_permutation_of_every_size():
    from mixln_convert.data.stream import WindowOrder

    for n in (1, 2, 3, 5, 64, 1000, 4097):
        for seed, epoch in ((0, 0), (1, 0), (0, 1)):
            order = WindowOrder(n, seed, epoch)
            assert sorted(order(j) for j in range(n)) == list(range(n)), (n, seed, epoch)
    passes = [[WindowOrder(1000, 0, epoch)(j) for j in range(1000)] for epoch in range(2)]
    assert passes[0] != passes[1] and passes[0] != sorted(passes[0])  # reshuffled each pass, not the identity


def test_the_sampler_holds_nothing_the_size_of_the_corpus():
    """A trillion windows: a permutation array would need 8 TB; the sampler answers at once."""
    class Huge:
        def __len__(self):
            return 10**12

        def __getitem__(self, i):
            return np.full(4, i % 50_000, dtype=np.uint16)

    data = PackedWindows(Huge(), 3 * 10**12, seed=0)
    first, later = data[0], data[2 * 10**12 + 5]  # the third pass
    assert first.shape == (4,) and later.shape == (4,) and not np.array_equal(first.numpy(), later.numpy())


def test_an_edit_that_keeps_size_and_date_is_other_text(tmp_path, tokenizer):
    """Sources are recorded by content: text edited in place to the same size, its date put back,
    is not the tokenization made before (a token cache keyed on size and date reused it)."""
    from mixln_convert.data.tokenization import settings

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox " * 50)
    before = settings(tokenizer, text)
    stat = text.stat()
    text.write_text("the quick brown box " * 50)
    os.utime(text, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert text.stat().st_size == stat.st_size and settings(tokenizer, text) != before


def test_a_run_needing_the_token_cache_another_run_writes_waits_and_shares_it(corpus, tokenizer, tmp_path,
                                                                            monkeypatch):
    """Two trains on the same text: the second waits while the first holds the cache folder's
    lock, then reads what it wrote (it used to fail, calling the cache folder its --out). The
    `tokenize` command, whose --out is the user's, still refuses at once."""
    import threading

    from mixln_convert.data.stream import load_splits
    from mixln_convert.errors import MixLNError
    from mixln_convert.io.atomic import try_lock
    from mixln_convert.training.recipe import Data

    monkeypatch.setenv("MIXLN_CONVERT_CACHE", str(tmp_path / "cache"))
    data = Data(train=str(corpus), validation_fraction=0.1, eval_tokens=64)
    load_splits(data, tokenizer, 512, progress=False)  # where the cache folder of these settings is
    (folder,) = (tmp_path / "cache" / "tokens").iterdir()
    written = {p.name: p.read_bytes() for p in folder.iterdir()}
    os.rename(folder, tmp_path / "aside")
    partial = folder.with_name(f".{folder.name}.partial")
    partial.mkdir()
    lock = try_lock(partial)  # the first run, tokenizing
    with pytest.raises(MixLNError, match=f"--out {folder}: another run is writing it"):
        tokenize(corpus, tokenizer, folder, validation_fraction=0.1, progress=False,
                 max_tokens=512, max_validation_tokens=64)
    found = []
    second = threading.Thread(target=lambda: found.append(load_splits(data, tokenizer, 512, progress=False)))
    second.start()
    second.join(timeout=2)
    assert second.is_alive() and not found  # waiting, not failing
    os.rename(tmp_path / "aside", folder)  # the first run finishes: its folder in place, its lock released
    partial.rmdir()
    os.close(lock)
    second.join(timeout=60)
    assert len(found) == 1 and {p.name: p.read_bytes() for p in folder.iterdir()} == written
