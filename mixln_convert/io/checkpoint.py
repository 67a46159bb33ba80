"""The one Checkpoint type every input is read through (an HF folder: :mod:`.loader`; a GGUF file:
:mod:`.gguf`): its config, tensors by name, tokenizer and model, each checked once; and what a writer
takes (:class:`StoredTensor`). Apart from both readers, so that neither imports the other to build on it.
"""

import hashlib
import json
import os
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from ..architectures import converted_architecture
from ..errors import MixLNError, first_line
from .checkpoint_files import TOKENIZER_CONFIG, TOKENIZER_FILES
from .validate import check_finite


def tokenizer_files(folder: Path) -> list[str]:
    """Which of :data:`TOKENIZER_FILES` (what a tokenizer's vocabulary is built from) ``folder`` holds."""
    return [name for name in TOKENIZER_FILES if all((folder / f).is_file() for f in name.split(" with "))]


@dataclass(frozen=True)
class StoredTensor:
    """A tensor to write and, where its bytes lie unchanged in a file (``path`` at ``offset``), that
    place: a writer copies them from there in the kernel, never through this process."""

    tensor: torch.Tensor
    path: Path | None = None
    offset: int = 0

    def to(self, dtype: torch.dtype) -> "StoredTensor | torch.Tensor":
        """As ``Tensor.to``: itself if already ``dtype`` (still copied file to file), else the cast tensor."""
        return self if self.tensor.dtype == dtype else self.tensor.to(dtype)


class Checkpoint(ABC):
    """A validated input checkpoint: ``config`` (a dict), ``arch``, tensors by name, the tokenizer and the model."""

    path: Path
    config: dict
    arch: object

    @property
    def is_mixln(self) -> bool:
        return converted_architecture(self.config) is not None

    @property
    def where(self) -> str:
        """What error messages about this checkpoint's config name."""
        return str(self.path / "config.json") if self.path.is_dir() else str(self.path)

    def fingerprint(self) -> str:
        """A key changing whenever one of the checkpoint's files does (name, size, mtime), for cross-run caches."""
        files = [self.path] if self.path.is_file() else sorted(p for p in self.path.iterdir() if p.is_file())
        listing = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return hashlib.sha256(json.dumps([str(self.path), listing]).encode()).hexdigest()

    @abstractmethod
    def names(self) -> list[str]: ...

    @abstractmethod
    def get(self, name: str) -> torch.Tensor: ...

    def stored(self, name: str) -> StoredTensor:
        """``get(name)`` to be written unchanged, with where its bytes lie if a writer can copy them."""
        return StoredTensor(self.get(name))

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

    def _read_tokenizer(self):
        """transformers' reading of the tokenizer, unchecked: AutoTokenizer picks its class by the tokenizer
        config and by the config's model type (a ``qwen2`` config reads any declared class as Qwen2Tokenizer)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path)

    def _tokenizer_sources(self) -> str:
        """The files a tokenizer is built from, and which of them the checkpoint holds: what a refusal names."""
        held = tokenizer_files(self.path)
        return f"{', '.join(TOKENIZER_FILES)}; {self.path} holds {', '.join(held) if held else 'none of them'}"

    def tokenizer_class_name(self) -> str | None:
        """The name of the class transformers reads this checkpoint's tokenizer as; None where it reads none.
        Out of a process that has not imported transformers (a streaming conversion), asked of a child process."""
        if "tokenizer" in self.__dict__:
            return type(self.tokenizer).__name__
        if "transformers" in sys.modules:
            try:
                return type(self._read_tokenizer()).__name__
            except Exception:  # noqa: BLE001  (an unreadable tokenizer: its output fails to load the same way)
                return None
        code = ("import sys; from transformers import AutoTokenizer as A; "
                "print(type(A.from_pretrained(sys.argv[1])).__name__)")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        try:
            done = subprocess.run([sys.executable, "-c", code, str(self.path)], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, env=env, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        name = (done.stdout.strip().splitlines() or [""])[-1]
        return name if done.returncode == 0 and name.isidentifier() else None

    def pin_tokenizer_class(self, dst: Path) -> None:
        """Name the class this checkpoint's tokenizer reads as in ``dst``'s tokenizer_config.json: a config of
        another model type (a converted ``mixln_qwen2``) would otherwise read the files as another class
        (TokenizersBackend for Qwen2Tokenizer), which encodes the same text differently."""
        file = Path(dst) / TOKENIZER_CONFIG
        if not file.is_file() and not tokenizer_files(Path(dst)):
            return  # no tokenizer to name
        try:
            config = json.loads(file.read_text()) if file.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return  # refused when loaded, as the source's is
        name = self.tokenizer_class_name() if isinstance(config, dict) else None
        if name is None or config.get("tokenizer_class") == name:
            return
        file.write_text(json.dumps({**config, "tokenizer_class": name}, indent=2, sort_keys=True) + "\n")

    def check_loadable(self) -> None:
        """What transformers itself refuses in the config, as one line naming it; checked once a tokenizer or model
        is built (a streaming conversion never imports transformers). A GGUF's config is transformers' reading."""

    @cached_property
    def tokenizer(self):
        """The checkpoint's tokenizer, loaded once per process."""
        self.check_loadable()
        try:
            tokenizer = self._read_tokenizer()
        except Exception as e:  # a damaged file fails its own way: tokenizers raises a bare Exception
            reason = first_line(e).rstrip()
            if reason.endswith(":"):  # transformers lists what it tried on the lines below ("... from one of:")
                reason = f"{reason} {self._tokenizer_sources()}"
            raise MixLNError(f"{self.path}: cannot load its tokenizer ({reason})") from None
        size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)  # ids may skip some
        if size > self.config["vocab_size"]:
            raise MixLNError(f"{self.path}: its tokenizer has {size} tokens, more than the model's "
                             f"vocab_size {self.config['vocab_size']}")
        if not tokenizer("The model", add_special_tokens=False)["input_ids"]:  # e.g. tokenizer.json missing
            raise MixLNError(f"{self.path}: its tokenizer turns text into no tokens (is tokenizer.json missing?)")
        if tokenizer.eos_token_id is None:  # every text the tool scores or trains on separates documents with it
            raise MixLNError(f"{self.path}: its tokenizer has no eos_token_id (or one past its vocabulary)")
        return tokenizer

    def model(self, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu"):
        """The whole causal LM in eval mode, values checked, a fresh copy at every call (no remote code)."""
        from ..model import register  # noqa: F401  (registers the Mix-LN classes with the Auto* factories)

        self.check_loadable()
        model = self._load_model(dtype)
        for name, tensor in model.state_dict().items():
            check_finite(name, tensor, str(self.path))
        return model.to(device).eval()
