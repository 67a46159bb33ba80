"""Text -> a tokenized folder (:mod:`.shards`): documents streamed from their files, tokenized in
worker processes a chunk at a time, appended in document order to fixed-size shards.

Memory holds the chunks in flight (two per worker) and nothing that grows with the corpus. The
output depends on the documents and settings only, never on the number of workers: chunks are
cut from the document sequence alone and their results appended in order.

The folder is built in ``.TOKENS.partial`` beside TOKENS (locked while a run writes it) and
renamed into place when complete; its ``progress.json``, written after every chunk (how far the
run got, each shard's length and sha256), lets a killed run resume. A rerun on the same inputs
and settings finds the finished folder and writes nothing.
"""

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import MixLNError, warn
from ..io.atomic import replace_dir, try_lock, wait_for_lock, write_atomic, write_failure
from ..io.paths import check_not_input, check_readable, checkpoint_path, resolved
from ..io.hub import HubDataset
from ..io.records import Record, Result
from ..options import FORCE, OUT
from ..schema import TOKENS, TOKENS_OR_ZERO, ByName, Nested, Numbers, String, setting
from .corpus import embedded_corpus, file_documents, source_files
from .options import TokenizeCommand, TokenizeOptions
from .shards import (FORMAT, MANIFEST, TOKEN_SPLITS, VERSION, HoldOut, ShardRecord, SplitRecord, TokenManifest,
                     TokenShardWriter, check_shards, file_sha256, read_manifest, token_dtype)

CHUNK_CHARS = 2**20  # text per worker task: small enough to bound memory, large enough to amortize a task
PARALLEL_BYTES = 2**24  # below 16 MiB of input, starting worker processes costs more than it saves
PROGRESS = "progress.json"
log = logging.getLogger(__name__)  # notices of a resumed or waiting run


@dataclass(frozen=True, kw_only=True)
class SplitProgress(Record):
    shards: list[ShardRecord] = setting(kind=Nested(ShardRecord, "a shard's record", many=True))
    documents: int = setting(kind=TOKENS_OR_ZERO)


@dataclass(frozen=True, kw_only=True)
class Progress(Result):
    """``progress.json``: how far a run got (after input ``position[0]``'s document ``position[1]``) with the
    settings of sha256 ``settings_sha256``, and each split's shards so far (the last one's sha256 None)."""
    FILE = PROGRESS
    WHAT = "a tokenize run's progress"

    settings_sha256: str = setting(kind=String())
    position: list[int] = setting(kind=Numbers(TOKENS_OR_ZERO, 2, 2))
    splits: dict[str, SplitProgress] = setting(kind=ByName(Nested(SplitProgress, "a split's progress")))

    def check(self, file: Path) -> None:
        for split in TOKEN_SPLITS:
            if split not in self.splits:
                raise MixLNError(f"{file}: splits: {split} is missing")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides a tokenizer's ids: its full definition and EOS id."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{definition}\0eos={tokenizer.eos_token_id}".encode()).hexdigest()


def held_out(digest: bytes, fraction: float) -> bool:
    """Whether the document of sha256 ``digest`` is in the validation hold-out. By content hash, not
    position: the split ignores file order, and copies of a document land on the same side."""
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Encoder:
    """The tokenizer as a worker process uses it: picklable, and a fast tokenizer travels as its
    definition (tokenizers alone, without transformers, whose import takes seconds). Its ids are
    those of ``tokenizer(texts, add_special_tokens=False)``."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.definition = backend.to_str() if backend else None
        self.tokenizer = None if backend else tokenizer  # a slow or test tokenizer: called as it is
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise MixLNError("the tokenizer has no eos_token_id to separate documents with")
        self.vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else 2**31 - 1

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_str(self.definition)
            self.tokenizer.no_truncation()  # as transformers calls it: whole documents
            self.tokenizer.no_padding()
        if self.definition is not None:
            return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def __getstate__(self):
        return {**self.__dict__, "tokenizer": None if self.definition is not None else self.tokenizer}


_WORKER: dict = {}  # a worker process's settings; below, the worker side: a chunk of documents -> token ids


def _init_worker(encoder: Encoder, fraction: float | None, excluded: frozenset, pooled: bool) -> None:
    if pooled:  # one thread a worker: the workers are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        # Ctrl-C reaches the whole process group: the main process stops the pool; a worker that
        # died of it mid-task would leave the pool waiting for its result
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.update(encoder=encoder, fraction=fraction, excluded=excluded)


def _ids(encoded: list[list[int]], eos: int) -> np.ndarray:
    """Each document's ids preceded by EOS, as one array."""
    count = sum(len(ids) + 1 for ids in encoded)
    return np.fromiter(chain.from_iterable(chain((eos,), ids) for ids in encoded), np.int64, count)


def _encode_chunk(task: tuple) -> tuple:
    """``(position, role, texts)`` -> ``(position, train ids, validation ids, train documents,
    validation documents)``. ``role``: the split of every document ("train": but those in the
    excluded validation set, "validation"), or "held_out": each document's split by :func:`held_out`."""
    position, role, texts = task
    encoder, fraction, excluded = _WORKER["encoder"], _WORKER["fraction"], _WORKER["excluded"]
    if role == "train":  # a copy of a validation document is dropped
        texts = [t for t in texts if _digest(t) not in excluded] if excluded else texts
    sides = [held_out(_digest(t), fraction) if role == "held_out" else role == "validation" for t in texts]
    encoded = encoder(texts)
    train = [ids for ids, side in zip(encoded, sides) if not side]
    validation = [ids for ids, side in zip(encoded, sides) if side]
    return position, _ids(train, encoder.eos), _ids(validation, encoder.eos), len(train), len(validation)


def _results(tasks, workers: int, initargs: tuple):
    """The tasks' results in task order; at most two tasks per worker in flight (Pool.imap would
    read the whole corpus ahead). Spawned workers: forking a process that holds threads (torch,
    a fast tokenizer) can deadlock."""
    if workers == 1:
        _init_worker(*initargs)
        yield from map(_encode_chunk, tasks)
        return
    try:
        pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, initargs)
    except OSError as e:  # the system's process or memory limit: the cause is the count, not the disk
        raise MixLNError(f"cannot start {workers} tokenizing processes ({e.strerror or e}); ask for fewer "
                         f"({TokenizeOptions.flag('num_proc')}, data.num_proc)") from None
    with pool:
        pending = deque()
        for task in tasks:
            pending.append(pool.apply_async(_encode_chunk, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _inputs(train, validation) -> list[tuple[str, object, dict]]:
    """(role, file, Hub dataset or embedded split, manifest record) of each input, validation first: a
    document's split is decided as soon as it is read."""
    def described(source, role):
        if source is None:  # the embedded corpus: its texts are small, so they are the record
            split = "train" if role == "train" else "validation"
            digest = hashlib.sha256("\0".join(embedded_corpus(split)).encode()).hexdigest()
            return [(role, split, {"embedded": split, "sha256": digest})]
        # the content, not the date: an edit that keeps the date (a copy with -p, rsync -t), or a
        # resumed training run over a file edited in place, is seen as the other text it is; a Hub
        # dataset by the commit it is read at
        return [(role, f, f.record() if isinstance(f, HubDataset) else
                 {"path": str(resolved(f)), "bytes": f.stat().st_size, "sha256": source_sha256(f)})
                for f in source_files(source)]

    explicit = validation is not None or train is None
    return [*(described(validation, "validation") if explicit else []),
            *described(train, "train" if explicit else "held_out")]


def source_sha256(path: Path) -> str:
    """sha256 of a source file's content, read once per process while the file stays as it was (a
    training run fingerprints its data, then keys the token cache on it). The status change time
    is in the key: every write changes it, and unlike the modification time no user can set it back."""
    stat = path.stat()
    return _sha256_of(str(resolved(path)), stat.st_size, stat.st_ctime_ns, stat.st_ino)


@lru_cache(maxsize=4096)
def _sha256_of(path: str, size: int, ctime_ns: int, inode: int) -> str:
    return file_sha256(Path(path))


def _documents(item) -> object:
    return iter(embedded_corpus(item)) if isinstance(item, str) else file_documents(item, streaming=True)


def _chunks(inputs, start: tuple[int, int]):
    """``(position after it, role, texts)`` tasks from input ``start[0]``, document ``start[1]``
    on; a chunk holds about CHUNK_CHARS of text and never spans two inputs."""
    for i, (role, item, _) in enumerate(inputs[start[0]:], start[0]):
        done = start[1] if i == start[0] else 0
        texts, size = [], 0
        for n, text in enumerate(islice(_documents(item), done, None), done + 1):
            texts.append(text)
            size += len(text)
            if size >= CHUNK_CHARS:
                yield (i, n), role, texts
                texts, size = [], 0
        if texts:
            yield (i, n), role, texts


def settings(tokenizer, train, options: TokenizeOptions = TokenizeOptions(), max_tokens: int | None = None,
             max_validation_tokens: int | None = None) -> dict:
    """What decides a tokenized folder's content: equal settings, equal shards. Each source file is
    recorded by its size and the sha256 of its whole content (one read, a fraction of what
    tokenizing it costs)."""
    seq_len, shard_tokens = options.seq_len, options.shard_tokens
    if seq_len is not None:
        shard_tokens -= shard_tokens % seq_len  # a window never spans two shards
    inputs = _inputs(train, options.validation)
    encoder = Encoder(tokenizer)
    return {
        "format": FORMAT, "version": VERSION, "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
        "eos_token_id": encoder.eos, "dtype": token_dtype(encoder.vocab_size), "shard_tokens": shard_tokens,
        "seq_len": seq_len, "max_tokens": max_tokens, "max_validation_tokens": max_validation_tokens,
        "validation": ({"rule": "the documents of the validation sources"} if inputs[0][0] == "validation" else
                       {"rule": "sha256(document)[:8] < fraction * 2**64", "fraction": options.validation_fraction}),
        "sources": [{"role": role, **record} for role, _, record in inputs],
    }


def _resumed(partial: Path, key: str, writers: dict) -> tuple[tuple[int, int], dict]:
    """Where an earlier run to ``partial`` stopped, its writers resumed; (0, 0) and a fresh folder
    if there is no such run, or it had other settings, or its files disagree with its record."""
    try:
        if (partial / PROGRESS).exists():  # none: no run, or one stopped before its first chunk
            progress = Progress.read(partial / PROGRESS)
            if progress.settings_sha256 != key:
                raise ValueError("other settings")
            for split, writer in writers.items():
                writer.resume(progress.splits[split].shards)
            log.info(f"resuming {partial.name} at input {progress.position[0] + 1}, document {progress.position[1]}")
            return tuple(progress.position), {s: progress.splits[s].documents for s in TOKEN_SPLITS}
    except FileNotFoundError:  # a shard the record names is gone: started afresh, as a missing record
        pass
    except (OSError, ValueError, TypeError, MixLNError) as e:  # TypeError: a count like 5.0 in the record
        warn(f"{partial} holds a run that does not resume ({str(e)[:200]}); starting afresh")
    for writer in writers.values():
        writer.resume([])
    for path in partial.iterdir():
        path.unlink()
    return (0, 0), {s: 0 for s in TOKEN_SPLITS}


def _check_paths(train, tokenizer, out, validation, named: str, force: bool):
    """``out`` resolved and the tokenizer, once the inputs are there and ``out`` may be written (a
    folder of an earlier tokenization is the caller's to compare)."""
    tokenizer_flag, validation_flag = TokenizeCommand.flag("tokenizer_ckpt"), TokenizeOptions.flag("validation")
    tokenizer_path = checkpoint_path(tokenizer, tokenizer_flag) if isinstance(tokenizer, (str, os.PathLike)) else None
    for flag, path in (("DATA", train), (validation_flag, validation)):
        if isinstance(path, (str, os.PathLike)):
            check_readable(path, flag)
    out = check_not_input(out, {"DATA": train, tokenizer_flag: tokenizer_path, validation_flag: validation}, OUT)
    if out.exists() and not out.is_dir():
        raise MixLNError(f"{named}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file() and not force:
        raise MixLNError(f"{named}: exists and is not empty (use {FORCE} to replace it)")
    if tokenizer_path is None:
        return out, tokenizer
    from ..io.loader import open_checkpoint  # here: it imports torch

    return out, open_checkpoint(tokenizer_path).tokenizer


def tokenize(train, tokenizer, out, options: TokenizeOptions | None = None, *, max_tokens: int | None = None,
             max_validation_tokens: int | None = None, force: bool = False, progress: bool = True,
             wait: bool = False, named: str | None = None, **fields) -> TokenManifest:
    """Tokenize the documents of ``train`` (a file, folder or glob; None: the embedded corpus) with
    ``tokenizer`` (one in hand, or a checkpoint's: a folder, .gguf or Hub model name) into the
    tokenized folder ``out``; returns its manifest. ``options``: a
    :class:`~mixln_convert.data.options.TokenizeOptions`, or its fields as keyword arguments (training
    never sees a validation document). ``max_tokens``/``max_validation_tokens`` stop once both
    splits have that many. ``out`` is written only when complete; an interrupted run resumes. Another run
    writing ``out`` is an error, or with ``wait`` (a shared cache) waited for, and its folder
    used. Messages call ``out`` ``named`` (default: ``--out OUT``)."""
    options = TokenizeOptions.given(options, fields)
    for name, count in (("max_tokens", max_tokens), ("max_validation_tokens", max_validation_tokens)):
        if count is not None:  # the API's (training's token cache): a count like the options'
            TOKENS.check(name, count)
    named = named or f"{OUT} {out}"
    out, tokenizer = _check_paths(train, tokenizer, out, options.validation, named, force)
    wanted = settings(tokenizer, train, options, max_tokens, max_validation_tokens)
    partial = out.with_name(f".{out.name}.partial")
    while True:  # until the folder is there, made by another run, or this run holds the lock to write it
        try:  # a complete folder of these settings; a damaged one (manifest, a shard's size or sha256) is an error
            manifest = read_manifest(out) if (out / MANIFEST).is_file() else None
            if manifest is not None and manifest.settings() == wanted:
                check_shards(out, manifest, hashes=True)
                return manifest
        except MixLNError:
            if not force:  # a damaged folder: --force rebuilds it
                raise
        if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
            raise MixLNError(f"{named}: exists and is not empty (use {FORCE} to replace it)")
        try:
            partial.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MixLNError(f"{named}: cannot write the output folder ({e.strerror})") from None
        lock = try_lock(partial)
        if lock is not None and _same_folder(lock, partial):
            break
        if lock is not None:  # the folder locked was renamed into place or removed meanwhile: look again
            os.close(lock)
            continue
        if not wait:
            raise MixLNError(f"{named}: another run is writing it ({partial} is locked)")
        log.info(f"waiting for another run to finish tokenizing the same text ({partial})")
        wait_for_lock(partial)
    try:
        return _build(wanted, out, partial, Encoder(tokenizer), train, options.validation, options.num_proc,
                      progress)
    except MixLNError:  # bad input: a rerun needs other input, so nothing of this run can resume
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as e:  # a full disk: the run resumes once there is space
        raise MixLNError(write_failure(out, e, partial, kept=True)) from None
    finally:
        os.close(lock)


def _same_folder(fd: int, path: Path) -> bool:
    """Whether the open folder ``fd`` is still the one at ``path``."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _build(wanted, out: Path, partial: Path, encoder: Encoder, train, validation, num_proc: int,
           progress: bool) -> TokenManifest:
    inputs = _inputs(train, validation)
    made = TokenManifest(**{**wanted, "validation": HoldOut(**wanted["validation"])}, splits={})
    writers = {s: TokenShardWriter(partial, s, made.dtype, made.shard_tokens, limit)
               for s, limit in zip(TOKEN_SPLITS, (made.max_tokens, made.max_validation_tokens))}
    key = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()
    position, documents = _resumed(partial, key, writers)
    excluded = frozenset(_digest(text) for role, item, _ in inputs if role == "validation" for text in _documents(item))
    fraction = made.validation.fraction
    if not num_proc:  # auto: a worker per available core, for input worth it
        # a Hub dataset's size is known only once it is streamed, and rarely small
        big = (sum(record.get("bytes", 0) for _, _, record in inputs) >= PARALLEL_BYTES
               or any("dataset" in record for _, _, record in inputs))
        num_proc = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) if big else 1
    # None: no bar when stderr is not a terminal
    with tqdm(initial=sum(w.tokens for w in writers.values()), unit="tok", unit_scale=True, desc="tokenizing",
              disable=None if progress else True) as bar:
        for (i, n), train_ids, validation_ids, n_train, n_validation in _results(
                _chunks(inputs, position), num_proc, (encoder, fraction, excluded, num_proc > 1)):
            before = sum(w.tokens for w in writers.values())
            for split, ids, count in zip(TOKEN_SPLITS, (train_ids, validation_ids), (n_train, n_validation)):
                writers[split].append(ids)
                documents[split] += count
            record = Progress(settings_sha256=key, position=[i, n], splits={
                s: SplitProgress(shards=w.shards, documents=documents[s]) for s, w in writers.items()})
            write_atomic(partial / PROGRESS, json.dumps(record.to_dict()))
            bar.update(sum(w.tokens for w in writers.values()) - before)
            bar.set_postfix_str(f"input {i + 1}/{len(inputs)}", refresh=False)
            if all(w.full for w in writers.values()):
                break
    splits = {}
    for split, writer in writers.items():
        shards = writer.close()
        if not shards:
            raise MixLNError(f"{train or 'embedded:train'}: gives no {split} tokens"
                             + ("; give a validation source or a larger fraction" if split == "validation" else ""))
        splits[split] = SplitRecord(documents=documents[split], tokens=writer.tokens, shards=shards)
    manifest = replace(made, splits=splits)
    (partial / PROGRESS).unlink()
    write_atomic(partial / MANIFEST, json.dumps(manifest.to_dict(), indent=1) + "\n")
    replace_dir(partial, out)
    return manifest
