"""Training and validation tokens: documents -> one token stream per split (EOS between documents,
cached in the user cache) -> fixed-length blocks, served in a seeded order that reshuffles at
every pass over the data."""

import hashlib
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data.corpus import read_texts, token_ids
from ..errors import MixLNError
from ..fetch import cache_dir
from .recipe import optimizer_steps


@dataclass
class Splits:
    train: np.ndarray  # [n, seq_len] token ids
    validation: np.ndarray  # [m, seq_len], from documents that are not in train


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


def token_stream(tokenizer, texts: list[str], max_tokens: int | None = None) -> np.ndarray:
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
            raise MixLNError("the text gives no tokens")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy", delete=False) as tmp:
            np.save(tmp, ids)
        os.replace(tmp.name, path)  # atomic: concurrent runs never read half a file
    return np.load(path, mmap_mode="r")


def _blocks(stream: np.ndarray, seq_len: int, what: str) -> np.ndarray:
    n = len(stream) // seq_len
    if n == 0:
        raise MixLNError(f"{what}: only {len(stream)} tokens, less than one block of seq_len={seq_len}")
    return stream[: n * seq_len].reshape(n, seq_len)


def load_splits(recipe: dict, tokenizer) -> Splits:
    """Token blocks of a recipe's training data (no more than its budget uses) and validation data
    (``data.eval_tokens``)."""
    data, seq_len = recipe["data"], recipe["seq_len"]
    train, validation = split_texts(data)
    budget = optimizer_steps(recipe) * recipe["global_batch_size"] * seq_len
    return Splits(
        train=_blocks(token_stream(tokenizer, train, budget), seq_len, data["train"] or "embedded:train"),
        validation=_blocks(token_stream(tokenizer, validation, data["eval_tokens"]), seq_len,
                           data["validation"] or data["train"] or "embedded:validation"),
    )


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
