"""The one data path of calibration, evaluation, heal and training: documents -> a token stream
(EOS between documents) -> fixed-length windows -> a seeded sampler that reshuffles at every pass.
Small text becomes one cached int32 array; training data is a tokenized folder (:mod:`.shards`).
"""

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MixLNError, warn
from ..evaluation.options import EvalOptions
from ..fetch import cache_dir
from ..limits import check_processes
from ..io.hub import HubDataset
from ..io.paths import resolved
from .corpus import source_files, token_ids
from .options import TokenizeCommand, TokenizeOptions
from .shards import MANIFEST, ShardWindows, TokenShards, check_shards, is_tokens_folder, read_manifest
from .tokenization import settings, source_sha256, tokenize, tokenizer_fingerprint


@dataclass
class Splits:
    train: TokenShards  # the training documents' token stream, memory-mapped shards
    validation: np.ndarray  # 1-D token stream of documents that are not in train


def token_stream(tokenizer, texts: list[str], max_tokens: int | None = None, what: str = "the text") -> np.ndarray:
    """The documents' token ids, EOS between them, at most ``max_tokens``: a 1-D int32 array
    memory-mapped from ``cache_dir()/tokens/<hash>.npy`` (keyed by tokenizer, texts and limit)."""
    key = hashlib.sha256(f"{tokenizer_fingerprint(tokenizer)} max={max_tokens}".encode())
    for text in texts:
        key.update(text.encode() + b"\0")
    path = cache_dir() / "tokens" / f"{key.hexdigest()[:32]}.npy"
    if not path.is_file():
        ids = token_ids(tokenizer, texts, max_tokens)[:max_tokens]
        if len(ids) == 0:
            raise MixLNError(f"{what}: the text gives no tokens")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy", delete=False) as tmp:
            np.save(tmp, ids)
        os.replace(tmp.name, path)  # atomic: concurrent runs never read half a file
    return np.load(path, mmap_mode="r")


def windows(stream, seq_len: int, what: str, flag: str | None = "seq_len"):
    """``stream`` (an array or :class:`TokenShards`) cut into [n, seq_len] windows, the remainder dropped;
    ``what`` names the text and ``flag`` the option that set ``seq_len`` (None: the command fixes it)."""
    n = len(stream) // seq_len
    if n == 0:
        remedy = f"lower {flag} or give more text" if flag else "give more text"
        raise MixLNError(f"{what}: gives only {len(stream)} tokens, less than one window of "
                         f"{f'{flag} ' if flag else ''}{seq_len}{'' if flag else ' tokens'}: {remedy}")
    if isinstance(stream, TokenShards):
        return ShardWindows(stream, n, seq_len)
    return stream[: n * seq_len].reshape(n, seq_len)


def open_tokens(folder, tokenizer) -> tuple[TokenShards, TokenShards]:
    """The train and validation streams of the tokenized ``folder``, checked against its manifest (shard sizes;
    ids are range-checked as they are read) and ``tokenizer``."""
    manifest = read_manifest(folder)
    if manifest.tokenizer_sha256 != tokenizer_fingerprint(tokenizer):
        raise MixLNError(f"{folder}: tokenized with another tokenizer (sha256 {manifest.tokenizer_sha256[:12]}, "
                         f"the source's is {tokenizer_fingerprint(tokenizer)[:12]}); tokenize the text again with "
                         f"{TokenizeCommand.flag('tokenizer_ckpt')} set to the source")
    check_shards(folder, manifest)
    limit = len(tokenizer)
    return TokenShards(folder, manifest, "train", limit), TokenShards(folder, manifest, "validation", limit)


def load_splits(data, tokenizer, train_tokens: int, progress: bool = True) -> Splits:
    """Token streams of a recipe's ``data`` section: the training stream and ``data.eval_tokens`` of
    validation text; text is tokenized into the user cache first (``train_tokens`` of it, no more)."""
    if is_tokens_folder(data.train):
        if data.validation is not None:
            raise MixLNError(f"data.validation: {data.validation}: data.train {data.train} is a tokenized "
                             "folder, whose manifest fixes the validation split; set data.validation to null")
        folder = data.train
    else:
        if data.num_proc:  # checked here as the recipe key, before the options name it --num-proc
            check_processes("data.num_proc", data.num_proc)
        options = TokenizeOptions(validation=data.validation, validation_fraction=data.validation_fraction,
                                  num_proc=data.num_proc)
        wanted = settings(tokenizer, data.train, options, max_tokens=train_tokens,
                          max_validation_tokens=data.eval_tokens)
        key = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()
        folder = cache_dir() / "tokens" / key[:32]
        if not is_tokens_folder(folder):
            # runs on the same text share the folder: a second one waits for the first to finish it
            tokenize(data.train, tokenizer, folder, options, max_tokens=train_tokens,
                     max_validation_tokens=data.eval_tokens, force=True, progress=progress, wait=True,
                     named=f"the token cache {folder} of data.train")
    train, validation = open_tokens(folder, tokenizer)
    return Splits(train=train, validation=np.asarray(validation[: data.eval_tokens]))


def data_fingerprint(*sources: str | None) -> dict[str, str]:
    """{file: sha256} of every file the data ``sources`` read (None: the embedded corpus; a tokenized folder:
    its manifest, which holds each shard's sha256); {name: commit} of a Hub dataset."""
    found = {}
    for source in sources:
        if source is not None:
            for f in [Path(source) / MANIFEST] if is_tokens_folder(source) else source_files(source):
                if isinstance(f, HubDataset):
                    found[str(f)] = f.record()["revision"]
                else:
                    found[str(resolved(f))] = source_sha256(f)
    return found


class PackedWindows:
    """``length`` training sequences drawn from ``windows`` pass after pass, each pass in a fresh order
    (:class:`WindowOrder`). Sample i is a pure function of i: a resumed run's position is a count."""

    def __init__(self, windows, length: int, seed: int):  # windows: an [n, seq_len] array or ShardWindows
        self.windows, self.length, self.seed = windows, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import torch

        epoch, j = divmod(i, len(self.windows))
        return torch.from_numpy(self.windows[WindowOrder(len(self.windows), self.seed, epoch)(j)].astype(np.int64))


class WindowOrder:
    """A seeded pseudo-random permutation of range(n) evaluated one position at a time, in O(1)
    memory: a 4-round Feistel network over the smallest even bit width holding n, walking the
    cycle until the value falls inside range(n) (fewer than 4 steps expected)."""

    MASK = 2**64 - 1

    def __init__(self, n: int, seed: int, epoch: int):
        self.n = n
        self.half = max(1, ((n - 1).bit_length() + 1) // 2)
        self.keys = [self._mix(seed * 1_000_003 + epoch * 10_007 + r + 1) for r in range(4)]

    @classmethod
    def _mix(cls, x: int) -> int:  # splitmix64's finalizer
        x = (x + 0x9E3779B97F4A7C15) & cls.MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & cls.MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & cls.MASK
        return x ^ (x >> 31)

    def _round_trip(self, x: int) -> int:
        low_mask = (1 << self.half) - 1
        left, right = x >> self.half, x & low_mask
        for key in self.keys:
            left, right = right, left ^ (self._mix(right ^ key) & low_mask)
        return (left << self.half) | right

    def __call__(self, j: int) -> int:
        if not 0 <= j < self.n:
            raise IndexError(j)
        x = self._round_trip(j)
        while x >= self.n:
            x = self._round_trip(x)
        return x


def token_windows(tokenizer, texts: list[str], seq_len: int, max_tokens: int | None = None, *,
                  flag: str = EvalOptions.flag("seq_len"), source=None):
    """The documents' token stream cut into [n_windows, seq_len] int64 windows (which may span documents):
    ``max_tokens`` tokens in whole windows, at least one; errors name ``flag`` and ``source``."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise MixLNError(f"{flag}: must be a positive integer, got {seq_len!r}")
    import torch

    want = None if max_tokens is None else max(1, max_tokens // seq_len) * seq_len
    what = str(source or "the text")
    found = windows(token_stream(tokenizer, texts, want, what), seq_len, what, flag)
    if want is not None and found.size < want:  # said, not silently capped: the result records what was used
        warn(f"{what}: gives {found.size:,} tokens in windows of {seq_len}, fewer than the {want:,} asked for; "
             "using those")
    return torch.from_numpy(found.astype(np.int64))
