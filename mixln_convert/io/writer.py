"""Checkpoint writing: a streaming sharded safetensors writer, config, tokenizer and model code
(into the atomic folders of :mod:`.atomic`)."""

import json
import os
import struct
from importlib import resources
from pathlib import Path

import torch

from ..errors import MixLNError
from .checkpoint import StoredTensor
from .model_card import write_card

MODEL_CODE = ("configuration_mixln.py", "modeling_mixln.py")  # saved beside a Mix-LN checkpoint's weights
# safetensors' names of the dtypes a checkpoint holds.
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def tool_stamp(**record) -> dict:
    """A provenance record of this tool: what config.json's ``mixln_provenance`` entries start with; a GGUF
    ``source``'s own facts (name, licence, stored types, pre-tokenizer) beside it, as the file says them now."""
    from .. import __version__
    from .lineage import source_facts

    return {"tool": f"mixln-convert {__version__}", **record, **source_facts(record.get("source"))}


# config keys an output never carries over: a dequantized GGUF has no quantizer, the source's
# folder name is not the output's, and transformers 4's torch_dtype would contradict ``dtype``
_DROPPED_CONFIG = ("quantization_config", "_name_or_path", "torch_dtype")


def write_checkpoint(folder: Path, tensors, config: dict, source, max_shard_bytes: int, *, desc: str,
                     total: int | None = None, progress: bool = True, exported=None) -> None:
    """The one rewrite pipe of convert, heal and prune: ``tensors`` ((name, tensor or :class:`StoredTensor`)
    pairs, streamed) as safetensors shards, ``config`` (or a function giving it once they are written, so a
    provenance can state their cost) as config.json, the source's extras, a Mix-LN config's model code, and
    the model card (README.md) of what the config records, as read from the source (and, for a plain model
    ``export`` wrote, its ``exported`` record, a :class:`~.lineage.Export`)."""
    from tqdm.auto import tqdm

    writer = ShardedWriter(folder, max_shard_bytes)
    for name, tensor in tqdm(tensors, total=total, desc=desc, unit="tensor", disable=not progress):
        writer.add(name, tensor)
    writer.close()
    config = {k: v for k, v in (config() if callable(config) else config).items() if k not in _DROPPED_CONFIG}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    source.copy_extras(folder)
    if "auto_map" in config:
        copy_model_code(folder)
    # after the extras: a source's own card is never the output's
    write_card(folder, config, source.path, exported, where=source.where)


def copy_model_code(folder: Path) -> None:
    """The Mix-LN modeling code that a converted config's ``auto_map`` points to, from this package
    (never from an input folder), so plain transformers loads the output with trust_remote_code."""
    code = resources.files("mixln_convert.model")
    for name in MODEL_CODE:
        (Path(folder) / name).write_bytes(code.joinpath(name).read_bytes())


def write_safetensors(path: Path, tensors: list[tuple[str, StoredTensor]], metadata: dict) -> None:
    """Write ``tensors`` (CPU, contiguous) as one safetensors file, emptying the list as it goes: a
    tensor whose bytes lie unchanged in a source file is copied by the kernel (``copy_file_range``); others
    are written and dropped at once (safetensors' ``save_file`` would hold them all in memory till the end)."""
    header, offset = {"__metadata__": metadata}, 0
    for name, stored in tensors:
        tensor = stored.tensor
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise MixLNError(f"{path.parent}: tensor {name} has dtype {tensor.dtype}, which this writer does "
                             "not handle")
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # tensor data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb", buffering=0) as file:
        _write_all(file, struct.pack("<Q", len(encoded)) + encoded)
        while tensors:
            _, stored = tensors.pop(0)  # the list held the last reference but this one
            if stored.path is None or not _copy_file_range(stored, file):
                _write_all(file, stored.tensor.reshape(-1).view(torch.uint8).numpy())


def _write_all(file, data) -> None:
    view = memoryview(data).cast("B")
    while view:  # a single write may take less (Linux: at most ~2 GiB)
        view = view[file.write(view):]


def _copy_file_range(stored: StoredTensor, file) -> bool:
    """Append ``stored``'s bytes from its file to ``file`` in the kernel; False where this
    system or these file systems cannot (the caller then writes the bytes itself)."""
    if not hasattr(os, "copy_file_range"):  # Linux only
        return False
    start, done, size = file.tell(), 0, stored.tensor.nbytes
    try:
        with open(stored.path, "rb") as source:
            while done < size:
                copied = os.copy_file_range(source.fileno(), file.fileno(), size - done, stored.offset + done)
                if copied == 0:
                    raise OSError(f"{stored.path}: shorter than its header says")
                done += copied
        return True
    except OSError:
        file.seek(start)
        return False


class ShardedWriter:
    """Collect tensors and write them as ``model-XXXXX-of-YYYYY.safetensors`` shards, each flushed as soon
    as the next tensor would exceed ``max_shard_bytes`` (so memory holds at most one shard of computed
    tensors); :meth:`close` writes the index last, or one ``model.safetensors``, as transformers does."""

    def __init__(self, folder: Path, max_shard_bytes: int):
        self.folder = Path(folder)
        self.max_shard_bytes = max_shard_bytes
        self.pending: list[tuple[str, StoredTensor]] = []
        self.pending_bytes = 0
        self.shards: list[list[str]] = []  # tensor names of each flushed shard, in order
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor | StoredTensor) -> None:
        stored = tensor if isinstance(tensor, StoredTensor) else StoredTensor(tensor)
        size = stored.tensor.nbytes
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self._flush()
        if stored.path is None:  # bytes in memory only: written from there
            stored = StoredTensor(stored.tensor.detach().cpu().contiguous())
        self.pending.append((name, stored))
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        self.shards.append([name for name, _ in self.pending])
        write_safetensors(self._temp_name(len(self.shards) - 1), self.pending, {"format": "pt"})
        self.pending_bytes = 0

    def _temp_name(self, k: int) -> Path:
        return self.folder / f"shard-{k:05d}.partial"

    def close(self) -> None:
        """Flush, give shards their final names, write the index."""
        if self.pending or not self.shards:
            self._flush()
        n = len(self.shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        for k, name in enumerate(names):
            self._temp_name(k).rename(self.folder / name)
        if n > 1:
            weight_map = {t: names[k] for k, shard in enumerate(self.shards) for t in shard}
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
