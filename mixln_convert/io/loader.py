"""Lazy tensor access to a source checkpoint: an HF folder (safetensors or .bin, sharded or
not) or a GGUF file.

Nothing here loads a whole model to get one tensor: safetensors shards are memory-mapped and
read per tensor, and a tensor read unchanged says where its bytes lie (``stored_bytes``) so
that a writer can copy them file to file; .bin shards are memory-mapped with
``torch.load(mmap=True, weights_only=True)`` (never plain unpickling). GGUF is the exception: transformers dequantizes it as a whole, which
is fine for the small models that ship as GGUF here.
"""

import fnmatch
import json
import pickle
import re
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import MixLNError

# Files beside the weights that a converted checkpoint needs too (tokenizer, generation defaults).
EXTRA_FILE_PATTERNS = (
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "generation_config.json",
    "vocab.*", "merges.txt", "chat_template*", "*.model", "LICENSE*",
)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise MixLNError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MixLNError(f"{path}: unreadable JSON ({e})") from None


@dataclass(frozen=True)
class StoredBytes:
    """Where a source tensor's bytes lie in its file, and its in-place version counter when read."""

    path: Path
    offset: int
    version: int


def stored_bytes(tensor: torch.Tensor) -> StoredBytes | None:
    """Where ``tensor``'s bytes lie on disk, if it is a source tensor as read (not modified in
    place since): a writer can then copy them file to file, in the kernel."""
    stored = getattr(tensor, "stored_bytes", None)
    return stored if stored is not None and stored.version == tensor._version else None


class FolderCheckpoint:
    """An HF checkpoint folder; ``get(name)`` reads one tensor from the shard that holds it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.config = read_json(self.path / "config.json")
        self._open_name, self._open_shard = None, None
        self._offsets = {}  # safetensors shard -> {tensor name: file offset of its bytes}
        self.shard_of = self._index()  # tensor name -> shard file
        for shard in sorted(set(self.shard_of.values())):
            if not (self.path / shard).is_file():
                raise MixLNError(f"{self.path / shard}: shard named in the index is missing")

    def _index(self) -> dict[str, str]:
        for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                                   ("pytorch_model.bin.index.json", "pytorch_model.bin")):
            if (self.path / index_name).is_file():
                return dict(read_json(self.path / index_name)["weight_map"])
            if (self.path / single).is_file():
                return {name: single for name in self._shard_names(single)}
        raise MixLNError(f"{self.path}: no model.safetensors, pytorch_model.bin or index found")

    def _shard_names(self, shard: str) -> list[str]:
        return list(self._open(shard).keys())

    def _open(self, shard: str):
        """The open handle of ``shard`` (for names and shapes, and .bin tensors); one at a time."""
        if self._open_name != shard:
            self._open_name, self._open_shard = shard, self._load(shard)
        return self._open_shard

    def _load(self, shard: str):
        file = self.path / shard
        try:
            if shard.endswith(".safetensors"):
                return safe_open(str(file), framework="pt", device="cpu")
            return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except pickle.UnpicklingError as e:  # weights_only met something other than tensors
            code = re.search(r"GLOBAL (\S+)", str(e))
            what = f"calls {code.group(1)}" if code else "holds objects other than tensors"
            raise MixLNError(f"{file}: refused to load: its pickle {what} (only tensors are read from "
                             ".bin files, with torch.load(weights_only=True))") from None
        except Exception as e:  # safetensors and torch raise several types for a bad file
            raise MixLNError(f"{file}: corrupt or unreadable checkpoint shard ({type(e).__name__}: {e})") from None

    def names(self) -> list[str]:
        return list(self.shard_of)

    def get(self, name: str) -> torch.Tensor:
        """One tensor; from safetensors, a view of the memory-mapped shard (no copy)."""
        try:
            shard = self.shard_of[name]
        except KeyError:
            raise MixLNError(f"{self.path}: tensor {name} not found in the checkpoint") from None
        if not shard.endswith(".safetensors"):
            return self._open(shard)[name]
        # A memory map of its own per tensor, released with the tensor: pages read through a
        # shared map would count in this process's memory until the whole shard is done.
        with self._load(shard) as handle:
            tensor = handle.get_tensor(name)
        tensor.stored_bytes = StoredBytes(self.path / shard, self._data_offsets(shard)[name], tensor._version)
        return tensor

    def _data_offsets(self, shard: str) -> dict[str, int]:
        """File offset of each tensor's bytes: a safetensors file is an 8-byte header length, a
        JSON header of offsets relative to its end, then the bytes."""
        if shard not in self._offsets:
            with open(self.path / shard, "rb") as file:
                length = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(length))
            self._offsets[shard] = {name: 8 + length + entry["data_offsets"][0]
                                    for name, entry in header.items() if name != "__metadata__"}
        return self._offsets[shard]

    def shape(self, name: str) -> tuple[int, ...]:
        if self.shard_of[name].endswith(".safetensors"):
            return tuple(self._open(self.shard_of[name]).get_slice(name).get_shape())
        return tuple(self.get(name).shape)

    def dtype(self) -> torch.dtype:
        return self.get(self.names()[0]).dtype

    def largest_shard_bytes(self) -> int:
        """Size of the largest shard file: what a streaming conversion may hold in memory at once."""
        return max((self.path / s).stat().st_size for s in set(self.shard_of.values()))

    def copy_extras(self, dst: Path) -> None:
        for file in sorted(self.path.iterdir()):
            if file.is_file() and any(fnmatch.fnmatch(file.name, p) for p in EXTRA_FILE_PATTERNS):
                shutil.copy2(file, dst / file.name)


class GGUFCheckpoint:
    """A .gguf file, dequantized to float32 through transformers' GGUF loader."""

    def __init__(self, path: Path):
        self.path = Path(path)
        arch = gguf_architecture(self.path)
        if arch != "llama":
            raise MixLNError(f"{self.path}: GGUF architecture {arch!r} is not supported (expected 'llama')")

    @cached_property
    def _model(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.path.parent, gguf_file=self.path.name, dtype=torch.float32)

    @cached_property
    def config(self) -> dict:
        config = self._model.config.to_dict()
        config.pop("quantization_config", None)  # the dequantized weights are plain tensors
        config["architectures"] = ["LlamaForCausalLM"]
        return config

    @cached_property
    def _state_dict(self) -> dict[str, torch.Tensor]:
        state = self._model.state_dict()
        if self._model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        return state

    def names(self) -> list[str]:
        return list(self._state_dict)

    def get(self, name: str) -> torch.Tensor:
        return self._state_dict[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state_dict[name].shape)

    def dtype(self) -> torch.dtype:
        return torch.float32

    def largest_shard_bytes(self) -> int:
        """The whole dequantized model: it is in memory anyway."""
        return sum(t.numel() * t.element_size() for t in self._state_dict.values())

    def copy_extras(self, dst: Path) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        AutoTokenizer.from_pretrained(self.path.parent, gguf_file=self.path.name).save_pretrained(dst)
        GenerationConfig.from_model_config(self._model.config).save_pretrained(dst)


def gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # a truncated or foreign file fails in many ways inside gguf
        raise MixLNError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def open_checkpoint(path) -> FolderCheckpoint | GGUFCheckpoint:
    """Open a source checkpoint: an HF folder or a ``.gguf`` file."""
    path = Path(path)
    if not path.exists():
        raise MixLNError(f"{path}: no such checkpoint")
    if path.is_file() and path.suffix == ".gguf":
        return GGUFCheckpoint(path)
    if path.is_dir():
        return FolderCheckpoint(path)
    raise MixLNError(f"{path}: expected a checkpoint folder or a .gguf file")
