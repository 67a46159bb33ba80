"""One Checkpoint type for every input: an HF folder (safetensors or .bin, sharded or not) or a
GGUF file, opened, classified and validated once per process (:func:`open_checkpoint`).

A checkpoint gives its config, architecture, tokenizer, lazy tensors and, when asked, the whole
model. Nothing here loads a whole model to get one tensor: safetensors shards are memory-mapped
and read per tensor, and a tensor read unchanged says where its bytes lie (``stored_bytes``) so
that a writer can copy them file to file; .bin shards are memory-mapped with
``torch.load(mmap=True, weights_only=True)`` (never plain unpickling); a GGUF file is
memory-mapped too and dequantized one tensor at a time.

Before any of that, the file headers are checked against the config (:mod:`.validate`); every
tensor read is checked for NaN/inf, and so is every model loaded whole.
"""

import copy
import fnmatch
import hashlib
import json
import math
import os
import pickle
import re
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import torch

from ..architectures import architecture_of_any, architecture_of_gguf
from ..errors import MixLNError
from .checkpoint_files import EXTRA_FILE_PATTERNS, WEIGHT_FILES
from .validate import check_config, check_config_loads, check_finite, check_tensors


def read_json(path: Path):
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


# safetensors' dtype names -> bytes per element, of the dtypes a model checkpoint may hold
_FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header's size


class Checkpoint(ABC):
    """A validated input checkpoint: ``config`` (a dict), ``arch``, tensors by name, the
    tokenizer and, on request, the whole model."""

    path: Path
    config: dict
    arch: object

    @property
    def is_mixln(self) -> bool:
        return self.config.get("model_type") == self.arch.converted["model_type"]

    @property
    def where(self) -> str:
        """What error messages about this checkpoint's config name."""
        return str(self.path / "config.json") if self.path.is_dir() else str(self.path)

    def fingerprint(self) -> str:
        """A key that changes whenever one of the checkpoint's files does (name, size, mtime): for
        results computed from its weights and cached across runs."""
        files = [self.path] if self.path.is_file() else sorted(p for p in self.path.iterdir() if p.is_file())
        listing = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return hashlib.sha256(json.dumps([str(self.path), listing]).encode()).hexdigest()

    @abstractmethod
    def names(self) -> list[str]: ...

    @abstractmethod
    def get(self, name: str) -> torch.Tensor: ...

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]: ...

    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @abstractmethod
    def largest_shard_bytes(self) -> int: ...

    @abstractmethod
    def copy_extras(self, dst: Path) -> None: ...

    @abstractmethod
    def _load_model(self, dtype): ...

    @abstractmethod
    def _tokenizer_args(self) -> tuple[Path, dict]: ...

    def check_loadable(self) -> None:
        """What transformers itself refuses in the config, as one line naming it; checked once, when a
        tokenizer or model is first built (it imports transformers, which a streaming conversion never
        does). A GGUF's config is transformers' own reading already."""

    @cached_property
    def tokenizer(self):
        """The checkpoint's tokenizer, loaded once per process."""
        from transformers import AutoTokenizer

        self.check_loadable()

        folder, kwargs = self._tokenizer_args()
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MixLNError(f"{self.path}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
        if len(tokenizer) > self.config["vocab_size"]:
            raise MixLNError(f"{self.path}: its tokenizer has {len(tokenizer)} tokens, more than the model's "
                             f"vocab_size {self.config['vocab_size']}")
        return tokenizer

    def model(self, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu"):
        """The whole causal LM in eval mode, values checked; Mix-LN checkpoints load through this
        package's registered classes (no remote code). A fresh copy at every call."""
        from ..model import register  # noqa: F401  (registers the Mix-LN classes with the Auto* factories)

        self.check_loadable()
        model = self._load_model(dtype)
        for name, tensor in model.state_dict().items():
            check_finite(name, tensor, str(self.path))
        return model.to(device).eval()


class FolderCheckpoint(Checkpoint):
    """An HF checkpoint folder; ``get(name)`` reads one tensor from the shard that holds it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.config = read_json(self.path / "config.json")
        check_config(self.config, self.where)
        self.arch = architecture_of_any(self.config, self.where)
        self._open_name, self._open_shard = None, None
        self._headers = {}  # safetensors shard -> {tensor name: header entry with the file offset}
        self.shard_of = self._index()  # tensor name -> shard file
        check_tensors({name: self.shape(name) for name in self.shard_of}, self.config, self.arch, str(self.path))
        if self.config.get("tie_word_embeddings") and self.arch.lm_head in self.shard_of:
            self._check_tied_head()

    def _check_tied_head(self) -> None:
        """A config that ties the head to the embeddings, over weights that hold a head of their
        own: transformers 5 uses that head where it differs from the embeddings, 4.x the
        embeddings, so the model would be whatever the loading version makes of it. Refused,
        unless the head equals the embeddings (a tied head saved anyway)."""
        head, embed = self.arch.lm_head, self.arch.embed
        if not torch.equal(self.get(head), self.get(embed)):
            raise MixLNError(f"{self.path / self.shard_of[head]}: tensor {head} differs from {embed}, but "
                             f"{self.where} declares tie_word_embeddings true; set it to false to use the head, "
                             f"or remove {head} to tie")

    def check_loadable(self) -> None:
        if not self.__dict__.get("_loadable"):
            check_config_loads(self.config, self.where)
            self._loadable = True

    def _index(self) -> dict[str, str]:
        for index_name, single in WEIGHT_FILES:
            if (self.path / index_name).is_file():
                return self._read_index(self.path / index_name)
            if (self.path / single).is_file():
                return {name: single for name in self._shard_names(single)}
        raise MixLNError(f"{self.path}: no model.safetensors, pytorch_model.bin or index found")

    def _read_index(self, file: Path) -> dict[str, str]:
        index = read_json(file)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise MixLNError(f"{file}: weight_map must be a non-empty mapping of tensor names to shard files")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or Path(shard).name != shard or shard in (".", ".."):
                raise MixLNError(f"{file}: tensor {name} maps to {shard!r}, not a shard file name in this folder")
        for shard in sorted(set(weight_map.values())):
            if not (self.path / shard).is_file():
                raise MixLNError(f"{self.path / shard}: shard named in the index is missing")
            held = set(self._shard_names(shard))
            absent = [name for name, s in weight_map.items() if s == shard and name not in held]
            if absent:
                raise MixLNError(f"{self.path / shard}: lacks tensor {absent[0]}, which {file.name} places there")
        return dict(weight_map)

    def _shard_names(self, shard: str) -> list[str]:
        if shard.endswith(".safetensors"):
            return list(self._header(shard))
        return list(self._open(shard).keys())

    def _open(self, shard: str):
        """The open handle of ``shard`` (for names and shapes, and .bin tensors); one at a time."""
        if self._open_name != shard:
            self._open_name, self._open_shard = shard, self._load(shard)
        return self._open_shard

    def _load(self, shard: str):
        from safetensors import safe_open

        file = self.path / shard
        try:
            if shard.endswith(".safetensors"):
                return safe_open(str(file), framework="pt", device="cpu")
            state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except pickle.UnpicklingError as e:  # weights_only met something other than tensors
            code = re.search(r"GLOBAL (\S+)", str(e))
            what = f"calls {code.group(1)}" if code else "holds objects other than tensors"
            raise MixLNError(f"{file}: refused to load: its pickle {what} (only tensors are read from "
                             ".bin files, with torch.load(weights_only=True))") from None
        except Exception as e:  # safetensors and torch raise several types for a bad file
            raise MixLNError(f"{file}: corrupt or unreadable checkpoint shard ({type(e).__name__}: {e})") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise MixLNError(f"{file}: not a state dict of tensors")
        return state

    def _header(self, shard: str) -> dict[str, dict]:
        """A safetensors shard's header, checked against the file: an 8-byte header length, a JSON
        header of dtypes, shapes and offsets relative to its end, then the bytes (all of them:
        a truncated shard is refused here, before any work)."""
        if shard in self._headers:
            return self._headers[shard]
        file = self.path / shard
        bad = f"{file}: corrupt safetensors shard"
        try:
            size = file.stat().st_size
            with open(file, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                if size < 8 or length > min(size - 8, _MAX_HEADER):
                    raise MixLNError(f"{bad} (header length {length} for a file of {size} bytes)")
                header = json.loads(f.read(length))
        except OSError as e:
            raise MixLNError(f"{file}: cannot read ({e.strerror})") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MixLNError(f"{bad} (its header is not JSON)") from None
        if not isinstance(header, dict):
            raise MixLNError(f"{bad} (its header is not a JSON object)")
        entries, end = {}, 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (first, last) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise MixLNError(f"{bad} (tensor {name}: malformed header entry)") from None
            if dtype not in _FLOAT_DTYPES:
                raise MixLNError(f"{file}: tensor {name} has dtype {dtype}; a model's weights are floating point")
            numel = 1
            for d in shape:
                numel *= d
            if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last
                    and last - first == numel * _FLOAT_DTYPES[dtype]):
                raise MixLNError(f"{bad} (tensor {name}: offsets {[first, last]} do not fit shape {shape} {dtype})")
            entries[name] = {"shape": tuple(shape), "offset": 8 + length + first}
            end = max(end, last)
        if 8 + length + end > size:
            raise MixLNError(f"{file}: truncated ({size} bytes, its header needs {8 + length + end})")
        self._headers[shard] = entries
        return entries

    def names(self) -> list[str]:
        return list(self.shard_of)

    def get(self, name: str) -> torch.Tensor:
        """One tensor, its values checked; from safetensors, a view of the memory-mapped shard (no copy)."""
        try:
            shard = self.shard_of[name]
        except KeyError:
            raise MixLNError(f"{self.path}: tensor {name} not found in the checkpoint") from None
        if not shard.endswith(".safetensors"):
            tensor = self._open(shard)[name]
            check_finite(name, tensor, str(self.path / shard))
            return tensor
        # A memory map of its own per tensor, released with the tensor: pages read through a
        # shared map would count in this process's memory until the whole shard is done.
        with self._load(shard) as handle:
            tensor = handle.get_tensor(name)
        check_finite(name, tensor, str(self.path / shard))
        tensor.stored_bytes = StoredBytes(self.path / shard, self._header(shard)[name]["offset"], tensor._version)
        return tensor

    def shape(self, name: str) -> tuple[int, ...]:
        shard = self.shard_of[name]
        if shard.endswith(".safetensors"):
            return self._header(shard)[name]["shape"]
        return tuple(self._open(shard)[name].shape)

    def dtype(self) -> torch.dtype:
        return self.get(self.names()[0]).dtype

    def largest_shard_bytes(self) -> int:
        """Size of the largest shard file: what a streaming conversion may hold in memory at once."""
        return max((self.path / s).stat().st_size for s in set(self.shard_of.values()))

    def copy_extras(self, dst: Path) -> None:
        for file in sorted(self.path.iterdir()):
            if file.is_file() and any(fnmatch.fnmatch(file.name, p) for p in EXTRA_FILE_PATTERNS):
                shutil.copy2(file, dst / file.name)

    def _load_model(self, dtype):
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype or "auto")
        except (OSError, ValueError, KeyError) as e:
            raise MixLNError(f"{self.path}: cannot load the model ({str(e).splitlines()[0]})") from None

    def _tokenizer_args(self) -> tuple[Path, dict]:
        return self.path, {}


class GGUFCheckpoint(Checkpoint):
    """A .gguf file: its tensor table and metadata checked from the header, read once per process;
    ``get(name)`` dequantizes one tensor (gguf-py) to float32. transformers gives the config and
    the tokenizer, as it reads them, but not the weights: its loader parses the whole header again
    for the config and maps every tensor name through gguf-py's tables, ~10x the dequantization."""

    def __init__(self, path: Path):
        self.path = Path(path)
        meta, stored = _read_gguf_header(self.path)
        self.arch = architecture_of_gguf(meta["general.architecture"], str(self.path))
        prefix = meta["general.architecture"] + "."
        layout = {key: meta.get(prefix + gguf_key) for key, gguf_key in self.arch.gguf["config"].items()}
        if layout.get("vocab_size") is None and "tokenizer.ggml.tokens" in meta:
            layout["vocab_size"] = meta["tokenizer.ggml.tokens"]
        layout["tie_word_embeddings"] = self.arch.gguf["lm_head"] not in stored
        check_config(layout, str(self.path))
        # names of at most one layer past the deepest the file holds: an absurd block_count is refused
        # by check_tensors at once, not after listing its layers
        deepest = max((_layer_index(n, self.arch) for n in stored), default=-1)
        names = self.arch.gguf_names(min(layout["num_hidden_layers"], deepest + 2))
        ignored = ("rope_freqs.weight",)  # LLaMA 3 GGUFs store the rope scaling the config gives too
        unknown = [n for n in stored if n not in names and n not in ignored and not _beyond(n, self.arch, layout)]
        if unknown:
            raise MixLNError(f"{self.path}: unexpected GGUF tensor {unknown[0]} for a {self.arch.name} model")
        self._stored = {names.get(n, n): tensor for n, tensor in stored.items() if n not in ignored}
        check_tensors({name: _gguf_shape(t) for name, t in self._stored.items()}, layout, self.arch, str(self.path))
        self._layout = layout
        self.stored_types = sorted({t.tensor_type.name for t in stored.values()})  # Q4_1, Q8_0, F32, ...

    @cached_property
    def _hf_config(self):
        """transformers' config of the GGUF (read from its metadata, no weights)."""
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name)
        except (OSError, ValueError, KeyError) as e:
            raise MixLNError(f"{self.path}: cannot read its config ({str(e).splitlines()[0]})") from None
        if hasattr(config, "quantization_config"):  # the dequantized weights are plain tensors
            del config.quantization_config
        config.architectures = [self.arch.name]
        self._check_read_alike(config)
        return config

    def _check_read_alike(self, config) -> None:
        """transformers' reading of the sizes against the file's own: it reads some families' metadata
        in part (Qwen3's head_dim: never, its default 128 instead of attention.key_length), and a
        model of a config that differs would not hold the file's tensors."""
        from transformers import __version__

        for key, value in self._layout.items():
            read = getattr(config, key, None)
            if key == "head_dim" and read is None:  # Qwen2's config has none: hidden_size / heads
                read = config.hidden_size // config.num_attention_heads
            if key != "max_position_embeddings" and value is not None and read != value:
                raise MixLNError(f"{self.path}: transformers {__version__} reads {key} {read!r} from this GGUF, "
                                 f"whose metadata and tensors say {value!r}; it cannot load the file")

    @cached_property
    def config(self) -> dict:
        return self._hf_config.to_dict()

    def names(self) -> list[str]:
        return list(self._stored)

    def get(self, name: str) -> torch.Tensor:
        """The tensor dequantized to float32, a fresh copy (the file stays memory-mapped read-only).
        llama.cpp stores LLaMA's q_proj and k_proj with each head's rotary halves interleaved (its
        "norm" rope; ``interleaved_rotary`` in architectures/*.json); undone here. Qwen's rope is
        llama.cpp's "neox" one, HF's own order: stored as it is."""
        import numpy as np
        from gguf import dequantize

        stored = self._stored[name]
        shape = _gguf_shape(stored)
        try:
            weights = dequantize(stored.data, stored.tensor_type).reshape(shape)
        except (NotImplementedError, ValueError) as e:
            raise MixLNError(f"{self.path}: cannot dequantize {stored.name} ({stored.tensor_type.name}: {e})") from None
        heads = {"attn_q": self._layout["num_attention_heads"], "attn_k": self._layout["num_key_value_heads"]}
        role = stored.name.split(".")[-2]
        if self.arch.gguf["interleaved_rotary"] and role in heads:
            n = heads[role]
            weights = weights.reshape(n, shape[0] // n // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
        tensor = torch.from_numpy(np.array(weights, dtype=np.float32))
        check_finite(name, tensor, str(self.path))
        return tensor

    def shape(self, name: str) -> tuple[int, ...]:
        return _gguf_shape(self._stored[name])

    def dtype(self) -> torch.dtype:
        return torch.float32  # what the dequantized tensors are; stored_types says what the file holds

    def largest_shard_bytes(self) -> int:
        """The whole model in float32: the file is one shard."""
        return sum(4 * math.prod(self.shape(name)) for name in self._stored)

    def copy_extras(self, dst: Path) -> None:
        from transformers import GenerationConfig

        self.tokenizer.save_pretrained(dst)
        GenerationConfig.from_model_config(self._hf_config).save_pretrained(dst)

    def _load_model(self, dtype):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        state = {name: self.get(name) for name in self._stored}
        try:
            model = MODEL_FOR_CAUSAL_LM_MAPPING[type(self._hf_config)].from_pretrained(
                None, config=copy.deepcopy(self._hf_config), state_dict=state, dtype=torch.float32)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise MixLNError(f"{self.path}: cannot load the model ({str(e).splitlines()[0]})") from None
        return model.to(dtype) if dtype not in (None, "auto") else model

    def _tokenizer_args(self) -> tuple[Path, dict]:
        return self.path.parent, {"gguf_file": self.path.name}


def _gguf_shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's shape as a checkpoint's ([out, in]; GGUF stores it reversed)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _layer_index(gguf_name: str, arch) -> int:
    """The layer a GGUF tensor belongs to, -1 for none."""
    match = re.match(re.escape(arch.gguf["layer_prefix"]).replace(re.escape("{i}"), r"(\d+)"), gguf_name)
    return int(match.group(1)) if match else -1


def _beyond(gguf_name: str, arch, layout: dict) -> bool:
    """A GGUF layer tensor of a layer past the config's depth (check_tensors names it)."""
    return _layer_index(gguf_name, arch) >= layout["num_hidden_layers"]


def _read_gguf_header(path: Path) -> tuple[dict, dict]:
    """A GGUF file's scalar metadata ({key: value}; token lists as their length) and its tensors
    ({GGUF name: gguf-py's ReaderTensor}, the data memory-mapped read-only), in file order."""
    from gguf import GGUFReader, GGUFValueType

    try:
        reader = GGUFReader(path)
        meta = {}
        for key, field in reader.fields.items():
            if not field.types:
                continue
            if field.types[0] == GGUFValueType.ARRAY:
                meta[key] = len(field.data)
            elif field.types[0] == GGUFValueType.STRING:
                meta[key] = bytes(field.parts[field.data[0]]).decode()
            else:
                meta[key] = field.parts[field.data[0]].tolist()[0]
        tensors = {t.name: t for t in reader.tensors}
    except Exception as e:  # a truncated or foreign file fails in many ways inside gguf
        raise MixLNError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    if "general.architecture" not in meta:
        raise MixLNError(f"{path}: GGUF file without general.architecture")
    return meta, tensors


def open_checkpoint(path) -> Checkpoint:
    """The checkpoint at ``path`` (an HF folder or a ``.gguf`` file), validated; opened once per
    process for as long as its files are unchanged. A Checkpoint passes through as it is."""
    if isinstance(path, Checkpoint):
        return path
    path = Path(path)
    if not path.exists():
        raise MixLNError(f"{path}: no such checkpoint")
    if path.is_file() and path.suffix == ".gguf":
        marker = path
    elif path.is_dir():
        marker = path / "config.json"
        if not marker.is_file():
            raise MixLNError(f"{path}: no config.json; expected a checkpoint folder or a .gguf file")
    else:
        raise MixLNError(f"{path}: expected a checkpoint folder or a .gguf file")
    stat = marker.stat()
    return _open(os.path.realpath(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)


@lru_cache(maxsize=8)
def _open(path: str, mtime_ns: int, size: int, inode: int) -> Checkpoint:
    return GGUFCheckpoint(Path(path)) if path.endswith(".gguf") and os.path.isfile(path) else FolderCheckpoint(Path(path))
