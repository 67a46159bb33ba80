"""A GGUF file as a :class:`~.loader.Checkpoint`, its tensors dequantized one at a time."""

import copy
import json
import math
import re
import tempfile
from functools import cached_property
from pathlib import Path

import torch

from ..architectures import architecture_of_gguf
from ..errors import MixLNError, first_line
from .checkpoint import Checkpoint
from .validate import check_config, check_finite, check_tensors


class GGUFCheckpoint(Checkpoint):
    """A .gguf file, its header checked; ``get(name)`` dequantizes one tensor (gguf-py). transformers gives
    the config and the tokenizer, but not the weights: its loader reparses the header, far slower."""

    def __init__(self, path: Path):
        self.path = Path(path)
        meta, stored = _read_header(self.path)
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
        # a layer tensor past the config's depth is not unknown: check_tensors names it
        unknown = [n for n in stored if n not in names and n not in ignored
                   and _layer_index(n, self.arch) < layout["num_hidden_layers"]]
        if unknown:
            raise MixLNError(f"{self.path}: unexpected GGUF tensor {unknown[0]} for a {self.arch.name} model")
        self._stored = {names.get(n, n): tensor for n, tensor in stored.items() if n not in ignored}
        check_tensors({name: _shape(t) for name, t in self._stored.items()}, layout, self.arch, str(self.path))
        self._layout = layout
        self.stored_types = sorted({t.tensor_type.name for t in stored.values()})  # Q4_1, Q8_0, F32, ...
        self._token_count = meta.get("tokenizer.ggml.tokens")  # how many tokens the file's vocabulary lists
        self._pre = meta.get("tokenizer.ggml.pre")  # llama.cpp's pre-tokenizer name: how the file splits text

    @cached_property
    def _hf_config(self):
        """transformers' config of the GGUF (read from its metadata, no weights)."""
        from transformers import AutoConfig, __version__

        try:
            config = AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name)
        except (OSError, ValueError, KeyError) as e:
            raise MixLNError(f"{self.path}: cannot read its config ({first_line(e)})") from None
        if hasattr(config, "quantization_config"):  # the dequantized weights are plain tensors
            del config.quantization_config
        config.architectures = [self.arch.name]
        # transformers reads some families' metadata in part (Qwen3's head_dim: never, its default 128
        # instead of attention.key_length), and a model of a config that differs would not hold the tensors
        for key, value in self._layout.items():
            read = getattr(config, key, None)
            if key == "head_dim" and read is None:  # Qwen2's config has none: hidden_size / heads
                read = config.hidden_size // config.num_attention_heads
            if key != "max_position_embeddings" and value is not None and read != value:
                raise MixLNError(f"{self.path}: transformers {__version__} reads {key} {read!r} from this GGUF, "
                                 f"whose metadata and tensors say {value!r}; it cannot load the file")
        return config

    @cached_property
    def config(self) -> dict:
        config = self._hf_config.to_dict()
        check_config(config, str(self.path))  # transformers' reading holds what the metadata says (eps, rope)
        return config

    def names(self) -> list[str]:
        return list(self._stored)

    def get(self, name: str) -> torch.Tensor:
        """The tensor dequantized to float32, a fresh copy (the file stays memory-mapped read-only).
        llama.cpp stores LLaMA's q_proj and k_proj with each head's rotary halves interleaved (its "norm"
        rope; ``interleaved_rotary`` in architectures/*.json), undone here; Qwen's "neox" rope is HF's order."""
        import numpy as np
        from gguf import dequantize

        stored = self._stored[name]
        shape = _shape(stored)
        try:
            weights = dequantize(stored.data, stored.tensor_type).reshape(shape)
        except (NotImplementedError, ValueError) as e:
            raise MixLNError(f"{self.path}: cannot dequantize {stored.name} ({stored.tensor_type.name}: {e})") from None
        q_heads = self._layout["num_attention_heads"]  # a GGUF without attention.head_count_kv has as many k heads
        heads = {"attn_q": q_heads, "attn_k": self._layout["num_key_value_heads"] or q_heads}
        role = stored.name.split(".")[-2]
        if self.arch.gguf["interleaved_rotary"] and role in heads:
            n = heads[role]
            weights = weights.reshape(n, shape[0] // n // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
        tensor = torch.from_numpy(np.array(weights, dtype=np.float32))
        check_finite(name, tensor, str(self.path))
        return tensor

    def shape(self, name: str) -> tuple[int, ...]:
        return _shape(self._stored[name])

    def dtype(self) -> torch.dtype:
        return torch.float32  # what the dequantized tensors are; stored_types says what the file holds

    def largest_shard_bytes(self) -> int:
        """The whole model in float32: the file is one shard."""
        return sum(4 * math.prod(self.shape(name)) for name in self._stored)

    def copy_extras(self, dst: Path) -> None:
        from transformers import GenerationConfig

        self.tokenizer.save_pretrained(dst)
        self.pin_tokenizer_class(dst)
        GenerationConfig.from_model_config(self._hf_config).save_pretrained(dst)

    def _load_model(self, dtype):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        state = {name: self.get(name) for name in self._stored}
        try:
            model = MODEL_FOR_CAUSAL_LM_MAPPING[type(self._hf_config)].from_pretrained(
                None, config=copy.deepcopy(self._hf_config), state_dict=state, dtype=torch.float32)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise MixLNError(f"{self.path}: cannot load the model ({first_line(e)})") from None
        return model.to(dtype) if dtype not in (None, "auto") else model

    def _read_tokenizer(self):
        """transformers' reading of the GGUF's tokenizer as its saved files read back: what every output holds.
        Read from the metadata, a Qwen2Tokenizer keeps the pipeline transformers converts (no NFC normalizer);
        read from files, it builds its own from the vocabulary, which encodes some texts otherwise."""
        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as folder:
            AutoTokenizer.from_pretrained(self.path.parent, gguf_file=self.path.name).save_pretrained(folder)
            if isinstance(self._token_count, int):
                _drop_tokens_past(Path(folder), self._token_count)
            if self._pre in DIGIT_SPLIT_PRES:
                _split_digits(Path(folder))
            tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.name_or_path = str(self.path)
        return tokenizer

    def _tokenizer_sources(self) -> str:
        return f"the tokenizer.ggml.* metadata of {self.path}"


# llama.cpp's pre-tokenizers that split every number character (\p{N}) on its own before GPT-2's regex
# (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM: "\p{N}", then GPT-2's): transformers' GGUF reader keeps only
# the byte-level part, so "x²+y²=z², ½ of ¾" or "2026" would split otherwise than the file does
DIGIT_SPLIT_PRES = ("smollm",)


def _split_digits(folder: Path) -> None:
    """The saved tokenizer in ``folder`` with tokenizers' Digits(individual_digits=True) before its byte-level
    pre-tokenizer: the split of a GGUF whose tokenizer.ggml.pre is in DIGIT_SPLIT_PRES (SmolLM's own
    tokenizer.json has the same two steps; Digits splits every Unicode number character, as \\p{N} does)."""
    file = folder / "tokenizer.json"
    saved = json.loads(file.read_text()) if file.is_file() else {}
    pre = saved.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        return  # not the byte-level split transformers reads a "gpt2" vocabulary with: left as read
    saved["pre_tokenizer"] = {"type": "Sequence",
                              "pretokenizers": [{"type": "Digits", "individual_digits": True}, pre]}
    file.write_text(json.dumps(saved))


def _drop_tokens_past(folder: Path, count: int) -> None:
    """The saved tokenizer in ``folder`` without the added tokens past the GGUF's ``count`` tokens: transformers
    gives a byte-level vocabulary without ``<|endoftext|>`` (LLaMA 3's, a tiny one) that token as a default, at an
    id no embedding row holds (the tool then refused the file: "more tokens than vocab_size")."""
    file = folder / "tokenizer.json"
    saved = json.loads(file.read_text()) if file.is_file() else {}
    past = {entry["content"] for entry in saved.get("added_tokens", []) if entry.get("id", 0) >= count}
    if not past:
        return
    saved["added_tokens"] = [entry for entry in saved["added_tokens"] if entry.get("id", 0) < count]
    file.write_text(json.dumps(saved))
    for path in (folder / "tokenizer_config.json", folder / "special_tokens_map.json"):
        if not path.is_file():
            continue
        config = json.loads(path.read_text())
        decoder = config.get("added_tokens_decoder")
        if isinstance(decoder, dict):
            config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < count}
        for key, value in list(config.items()):
            content = value.get("content") if isinstance(value, dict) else value
            if key.endswith("_token") and content in past:
                config[key] = None
        path.write_text(json.dumps(config))


def _shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's shape as a checkpoint's ([out, in]; GGUF stores it reversed)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _layer_index(gguf_name: str, arch) -> int:
    """The layer a GGUF tensor belongs to, -1 for none."""
    match = re.match(re.escape(arch.gguf["layer_prefix"]).replace(re.escape("{i}"), r"(\d+)"), gguf_name)
    return int(match.group(1)) if match else -1


def _read_header(path: Path) -> tuple[dict, dict]:
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
