"""Documents -> one token stream (EOS between documents, cached in the user cache) -> fixed-length
blocks -> a seeded sampler that reshuffles at every pass over the data: the one data path of
calibration, evaluation, heal and training."""

import hashlib
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import MixLNError
from ..fetch import cache_dir
from .corpus import read_texts, token_ids


@dataclass
class Splits:
    train: np.ndarray  # 1-D token stream of the training documents
    validation: np.ndarray  # 1-D token stream of documents that are not in train


def _held_out(text: str, fraction: float) -> bool:
    # By content hash, not position: the split ignores file order, and copies of a document land
    # on the same side.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") < fraction * 2**64


def split_texts(data: dict) -> tuple[list[str], list[str]]:
    """Training and validation documents of a recipe's ``data`` section; no document is in both."""
    train = read_texts(data["train"], split="train")
    if data["validation"] is not None or data["train"] is None:
        validation = read_texts(data["validation"], split="validation")
    else:
        validation = [t for t in train if _held_out(t, data["validation_fraction"])]
        if not validation:
            raise MixLNError(f"{data['train']}: data.validation_fraction {data['validation_fraction']} holds out no "
                             "document; give data.validation or a larger fraction")
    held = set(validation)
    return [t for t in train if t not in held], validation


def token_stream(tokenizer, texts: list[str], max_tokens: int | None = None, what: str = "the text") -> np.ndarray:
    """The documents' token ids, EOS between them, at most ``max_tokens``: a 1-D int32 array
    memory-mapped from ``cache_dir()/tokens/<hash>.npy`` (keyed by tokenizer, texts and limit)."""
    key = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    key.update((backend.to_str() if backend else repr(sorted(tokenizer.get_vocab().items()))).encode())
    key.update(f"eos={tokenizer.eos_token_id} max={max_tokens}".encode())
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


def blocks(stream: np.ndarray, seq_len: int, what: str, flag: str = "seq_len") -> np.ndarray:
    """``stream`` cut into [n, seq_len] blocks (a view; the remainder is dropped). ``what`` names the
    text and ``flag`` the option that set ``seq_len`` in the error when not one block fits."""
    n = len(stream) // seq_len
    if n == 0:
        raise MixLNError(f"{what}: gives only {len(stream)} tokens, less than one block of {flag} {seq_len}: "
                         f"lower {flag} or give more text")
    return stream[: n * seq_len].reshape(n, seq_len)


def load_splits(data: dict, tokenizer, train_tokens: int) -> Splits:
    """Token streams of a recipe's ``data`` section: ``train_tokens`` of training text (no more is
    tokenized) and ``data["eval_tokens"]`` of validation text."""
    train, validation = split_texts(data)
    return Splits(train=token_stream(tokenizer, train, train_tokens),
                  validation=token_stream(tokenizer, validation, data["eval_tokens"]))


class PackedBlocks(Dataset):
    """``length`` training sequences drawn from ``blocks`` pass after pass, each pass in a fresh
    order seeded by (seed, pass). Sample i is a pure function of i, so the data position of a
    resumed run is simply the number of samples already drawn."""

    def __init__(self, blocks: np.ndarray, length: int, seed: int):
        self.blocks, self.length, self.seed = blocks, length, seed
        self._order = (None, None)  # (pass, permutation) of the pass being served

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        epoch, j = divmod(i, len(self.blocks))
        if self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.blocks)))
        return torch.from_numpy(self.blocks[self._order[1][j]].astype(np.int64))


def token_blocks(tokenizer, texts: list[str], seq_len: int, max_tokens: int | None = None, *,
                 flag: str = "--seq-len", source=None) -> torch.Tensor:
    """The documents' token stream cut into [n_blocks, seq_len] int64 blocks (which may span
    documents): ``max_tokens`` tokens in whole blocks, at least one, and no more is tokenized.
    Errors name ``flag`` (the option that set ``seq_len``) and ``source`` (where the text came from)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise MixLNError(f"{flag}: must be a positive integer, got {seq_len!r}")
    want = None if max_tokens is None else max(1, max_tokens // seq_len) * seq_len
    what = str(source or "the text")
    return torch.from_numpy(blocks(token_stream(tokenizer, texts, want, what), seq_len, what, flag).astype(np.int64))
