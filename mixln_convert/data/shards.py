"""The tokenized-folder format (written by ``mixln-convert tokenize``, or by ``train`` into the user cache).

Per split (``train``, ``validation``): files ``<split>-00000.bin``, ... of raw little-endian token
ids (uint16 where the vocabulary fits, else int32), EOS between documents; and ``mixln-tokens.json``:
the settings they were made with and each shard's token count and sha256. The layout of nanoGPT's
``.bin`` token files: a training process memory-maps only the windows it trains on.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MixLNError
from ..io.records import Record, Result
from ..options import FORCE
from ..schema import OPEN_FRACTION, TOKENS, TOKENS_OR_ZERO, ByName, Choice, Count, Nested, Shaped, String, setting

MANIFEST = "mixln-tokens.json"
FORMAT = "mixln-convert tokens"
VERSION = 1
TOKEN_SPLITS = ("train", "validation")
DTYPES = {"uint16": np.dtype("<u2"), "int32": np.dtype("<i4")}


def token_dtype(vocab_size: int) -> str:
    """The narrowest stored dtype that holds every id of a vocabulary of ``vocab_size``."""
    return "uint16" if vocab_size <= 2**16 else "int32"


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(2**24):
            digest.update(piece)
    return digest.hexdigest()


@dataclass(kw_only=True)
class ShardRecord:
    """One shard file of a split: its tokens and sha256 (None while the writer fills it; never in a manifest)."""
    file: str = setting(kind=String())
    tokens: int = setting(kind=TOKENS)
    sha256: str | None = setting(None, String())


@dataclass(frozen=True, kw_only=True)
class SplitRecord:
    documents: int = setting(kind=TOKENS_OR_ZERO)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    shards: list[ShardRecord] = setting(kind=Nested(ShardRecord, "a shard's record", many=True))


@dataclass(frozen=True, kw_only=True)
class HoldOut(Record):
    """Which documents are validation (tokenization.settings): those of the validation sources, or by content
    hash under ``fraction`` (:func:`~.tokenization.held_out`)."""
    SPARSE = True
    rule: str = setting(kind=String())
    fraction: float | None = setting(None, OPEN_FRACTION)


# each source's record (a file's or a Hub dataset's): compared whole with what a rerun would record, never read
# field by field
SOURCES = Shaped(lambda v: isinstance(v, list) and all(isinstance(s, dict) for s in v), "a list of objects")


# kw_only: the fields keep the file's order, the settings (tokenization.settings) first, then the splits
@dataclass(frozen=True, kw_only=True)
class TokenManifest(Result):
    """``mixln-tokens.json``: the settings the shards were made with and each split's shards."""
    FILE = MANIFEST
    WHAT = "a tokenized folder's manifest"

    format: str = setting(kind=Choice((FORMAT,), "format"))
    version: int = setting(kind=Count(VERSION, VERSION))
    tokenizer_sha256: str = setting(kind=String())
    eos_token_id: int = setting(kind=TOKENS_OR_ZERO)
    dtype: str = setting(kind=Choice(tuple(DTYPES), "dtype"))
    shard_tokens: int = setting(kind=TOKENS)
    seq_len: int | None = setting(None, TOKENS)
    max_tokens: int | None = setting(None, TOKENS)
    max_validation_tokens: int | None = setting(None, TOKENS)
    validation: HoldOut = setting(kind=Nested(HoldOut, "a hold-out rule"))
    sources: list[dict] = setting(kind=SOURCES)
    splits: dict[str, SplitRecord] = setting(kind=ByName(Nested(SplitRecord, "a split's record")))

    def check(self, file: Path) -> None:
        for split in TOKEN_SPLITS:
            if split not in self.splits:
                raise MixLNError(f"{file}: splits: {split} is missing")
            record = self.splits[split]
            for i, shard in enumerate(record.shards):
                if shard.file != shard_name(split, i) or shard.tokens > self.shard_tokens or shard.sha256 is None:
                    raise MixLNError(f"{file}: splits: {split}: shards: {i}: not {shard_name(split, i)} of at most "
                                     f"{self.shard_tokens} tokens with its sha256")
            if record.tokens != sum(s.tokens for s in record.shards):
                raise MixLNError(f"{file}: splits: {split}: tokens {record.tokens} is not the sum over its shards")

    def settings(self) -> dict:
        """What the shards were made with: :func:`~.tokenization.settings` of the run that made them."""
        return {key: value for key, value in self.to_dict().items() if key != "splits"}


class TokenShardWriter:
    """Appends one split's token ids to fixed-size shard files, at most ``limit`` tokens in all."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int, limit: int | None = None):
        self.folder, self.split, self.dtype = folder, split, DTYPES[dtype]
        self.shard_tokens, self.limit = shard_tokens, limit
        self.shards: list[ShardRecord] = []  # the last one may be filling
        self.tokens = 0
        self._digest = None  # sha256 of the shard being filled

    def resume(self, shards: list[ShardRecord]) -> None:
        """Continue after ``shards`` (the :attr:`shards` a killed run recorded): the full shards checked, the last
        cut back to its recorded length (the run may have written past it); ValueError if the files disagree."""
        self.shards = list(shards)
        for shard in self.shards[:-1]:
            path = self.folder / shard.file
            if shard.tokens != self.shard_tokens or path.stat().st_size != shard.tokens * self.dtype.itemsize \
                    or file_sha256(path) != shard.sha256:
                raise ValueError(f"{path} is not the shard recorded")
        self.tokens = sum(s.tokens for s in self.shards)
        if shards:
            last = self.folder / self.shards[-1].file
            size = self.shards[-1].tokens * self.dtype.itemsize
            if last.stat().st_size < size:
                raise ValueError(f"{last} is shorter than recorded")
            self._digest = hashlib.sha256()
            with open(last, "r+b") as f:
                f.truncate(size)
                while piece := f.read(2**24):
                    self._digest.update(piece)

    @property
    def full(self) -> bool:
        return self.limit is not None and self.tokens >= self.limit

    def append(self, ids: np.ndarray) -> None:
        """Append ``ids`` (each document's ids preceded by EOS; the split's very first EOS is
        dropped, so EOS stands between documents), cut at the limit."""
        if self.tokens == 0:
            ids = ids[1:]
        if self.limit is not None:
            ids = ids[: max(0, self.limit - self.tokens)]
        if len(ids) and int(ids.max()) > np.iinfo(self.dtype).max:
            raise MixLNError(f"token id {int(ids.max())} does not fit the {self.dtype.name} shards")
        while len(ids):
            if not self.shards or self.shards[-1].tokens == self.shard_tokens:
                self.shards.append(ShardRecord(file=shard_name(self.split, len(self.shards)), tokens=0))
                self._digest = hashlib.sha256()
                (self.folder / self.shards[-1].file).write_bytes(b"")
            shard = self.shards[-1]
            piece = ids[: self.shard_tokens - shard.tokens].astype(self.dtype).tobytes()
            with open(self.folder / shard.file, "ab") as f:
                f.write(piece)
            self._digest.update(piece)
            taken = len(piece) // self.dtype.itemsize
            shard.tokens += taken
            self.tokens += taken
            ids = ids[taken:]
            if shard.tokens == self.shard_tokens:
                shard.sha256 = self._digest.hexdigest()

    def close(self) -> list[ShardRecord]:
        """The finished split's shards, the last one's sha256 included."""
        if self.shards and self.shards[-1].sha256 is None:
            self.shards[-1].sha256 = self._digest.hexdigest()
        return self.shards


def is_tokens_folder(path) -> bool:
    return path is not None and (Path(path) / MANIFEST).is_file()


def read_manifest(folder: Path) -> TokenManifest:
    """The manifest of a tokenized folder, its fields checked."""
    path = Path(folder) / MANIFEST
    try:
        return TokenManifest.read(path)
    except MixLNError as e:
        raise MixLNError(f"{path}: damaged ({str(e).removeprefix(f'{path}: ')}); run mixln-convert tokenize again "
                         f"with {FORCE}") from None


def check_shards(folder: Path, manifest: TokenManifest, hashes: bool = False) -> None:
    """Every shard of the manifest is there with its recorded size (and, with ``hashes``, its sha256)."""
    itemsize = DTYPES[manifest.dtype].itemsize
    for split in TOKEN_SPLITS:
        for shard in manifest.splits[split].shards:
            path = Path(folder) / shard.file
            size = path.stat().st_size if path.is_file() else None
            if size != shard.tokens * itemsize:
                found = "missing" if size is None else f"{size} bytes"
                raise MixLNError(f"{path}: {found}, the manifest says {shard.tokens * itemsize}; the tokenized "
                                 f"folder is damaged (run mixln-convert tokenize again with {FORCE})")
            if hashes and file_sha256(path) != shard.sha256:
                raise MixLNError(f"{path}: its sha256 is not the manifest's; the tokenized folder is damaged "
                                 f"(run mixln-convert tokenize again with {FORCE})")


class TokenShards:
    """One split of a tokenized folder as one token stream: ``len()`` and ``[a:b]`` slices (an array), each
    shard memory-mapped on first use. Hashing every shard would read the whole corpus in every process, so a
    shard's ids are checked where they are read instead: one at or past ``id_limit`` is an error."""

    def __init__(self, folder: Path, manifest: TokenManifest, split: str, id_limit: int | None = None):
        self.folder, self.split, self.id_limit = Path(folder), split, id_limit
        self.dtype = DTYPES[manifest.dtype]
        self.shards = manifest.splits[split].shards
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards])  # stream offset of each shard
        self.maps: dict[int, np.memmap] = {}  # shard index -> its memory map, once used

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, step = where.indices(len(self))
        if step != 1:
            raise IndexError("token shards are sliced with step 1 only")
        pieces, k = [], int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            offset = start - int(self.starts[k])
            if k not in self.maps:
                self.maps[k] = np.memmap(self.folder / self.shards[k].file, dtype=self.dtype, mode="r")
            piece = self.maps[k][offset: offset + stop - start]
            if self.id_limit is not None and len(piece) and int(piece.max()) >= self.id_limit:
                at = int(np.argmax(piece >= self.id_limit))
                raise MixLNError(f"{self.folder / self.shards[k].file}: token {offset + at} is id {int(piece[at])}, "
                                 f"past the tokenizer's {self.id_limit} ids; the tokenized folder is damaged "
                                 f"(mixln-convert tokenize on the same files checks every shard; {FORCE} rebuilds it)")
            pieces.append(piece)
            start += len(piece)
            k += 1
        return np.concatenate(pieces) if len(pieces) > 1 else (pieces[0] if pieces else np.zeros(0, self.dtype))


class ShardWindows:
    """A token stream cut into ``n`` windows of ``seq_len``, read on demand (:func:`~.stream.windows`)."""

    def __init__(self, stream: TokenShards, n: int, seq_len: int):
        self.stream, self.n, self.seq_len = stream, n, seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j) -> np.ndarray:
        j = int(j)
        if not 0 <= j < self.n:
            raise IndexError(j)
        return self.stream[j * self.seq_len: (j + 1) * self.seq_len]
