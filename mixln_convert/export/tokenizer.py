"""A checkpoint's tokenizer as llama.cpp's GGUF metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``).

A GGUF source's own fields are copied as they are. Otherwise the tokenizer this package loads is written
as llama.cpp's ``convert_hf_to_gguf.py`` writes one:

- byte-level BPE (GPT-2, LLaMA 3, Qwen, SmolLM): model ``gpt2``, the tokens, the merges, and in
  ``tokenizer.ggml.pre`` llama.cpp's name of the pre-tokenizer's split (it does not read the split itself);
- BPE with byte fallback (SentencePiece vocabularies: LLaMA 1/2, Mistral): model ``llama``, the pieces
  with scores ranking them by merge (what llama.cpp merges by), and the merges too (what transformers reads).

Ids past the tokenizer's, up to the model's vocab_size, are ``[PADn]`` tokens of type UNUSED, as llama.cpp pads them.
"""

import json
import re
from typing import NamedTuple

from ..errors import MixLNError, warn

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class Field(NamedTuple):
    """One GGUF metadata entry: ``GGUFWriter.add_key_value``'s arguments."""

    key: str
    value: object
    type: object  # gguf.GGUFValueType
    sub_type: object = None  # of an array's items


def tokenizer_fields(source, vocab_size: int) -> list[Field]:
    """The tokenizer metadata of ``source`` for a model of ``vocab_size`` embedding rows; a tokenizer
    llama.cpp cannot hold is refused, naming the checkpoint, before anything is written."""
    if not source.path.is_file():
        return folder_tokenizer_fields(source.tokenizer, vocab_size, str(source.path))
    from gguf import GGUFReader, GGUFValueType

    # a GGUF: its ``tokenizer.*`` fields are llama.cpp's already, copied as stored
    fields = GGUFReader(source.path).fields.items()
    return [Field(key, f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
            for key, f in fields if key.startswith("tokenizer.") and f.types]


def folder_tokenizer_fields(tokenizer, vocab_size: int, where: str) -> list[Field]:
    """The metadata of a transformers fast tokenizer (:mod:`this module <.tokenizer>`'s two kinds)."""
    from gguf import GGUFValueType as T
    from gguf import Keys

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    kind = tokenizer_kind(state, where)
    merges = [merge_text(merge) for merge in state["model"].get("merges") or []]
    tokens, types = token_table(tokenizer, vocab_size, kind)
    K = Keys.Tokenizer
    fields = [Field(K.MODEL, kind, T.STRING),
              Field(K.PRE, bpe_pre_tokenizer(state.get("pre_tokenizer"), where) if kind == "gpt2" else "default",
                    T.STRING),
              Field(K.LIST, tokens, T.ARRAY, T.STRING), Field(K.TOKEN_TYPE, types, T.ARRAY, T.INT32),
              Field(K.MERGES, merges, T.ARRAY, T.STRING)]
    if kind == "llama":
        fields.append(Field(K.SCORES, merge_scores(tokens, merges), T.ARRAY, T.FLOAT32))
    for key, token_id in ((K.BOS_ID, tokenizer.bos_token_id), (K.EOS_ID, tokenizer.eos_token_id),
                          (K.UNK_ID, tokenizer.unk_token_id), (K.PAD_ID, tokenizer.pad_token_id)):
        if token_id is not None:
            fields.append(Field(key, token_id, T.UINT32))
    add_bos, add_eos, space_prefix = special_behaviour(tokenizer)
    fields += [Field(K.ADD_BOS, add_bos, T.BOOL), Field(K.ADD_EOS, add_eos, T.BOOL)]
    if kind == "llama":
        fields.append(Field(K.ADD_PREFIX, space_prefix, T.BOOL))
    if isinstance(tokenizer.chat_template, str):
        fields.append(Field(K.CHAT_TEMPLATE, tokenizer.chat_template, T.STRING))
    return fields


def tokenizer_kind(state: dict, where: str) -> str:
    """llama.cpp's tokenizer model for a tokenizer.json ``state``: ``gpt2`` (byte-level BPE) or ``llama``
    (BPE with byte fallback, SentencePiece's); any other is refused."""
    model = state.get("model") or {}
    byte_level = "ByteLevel" in json.dumps([state.get("pre_tokenizer"), state.get("decoder")])
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return "llama"
    if model.get("type") == "BPE" and byte_level:
        return "gpt2"
    raise MixLNError(f"{where}: its tokenizer ({model.get('type')} model{', byte-level' if byte_level else ''}) is "
                     "neither byte-level BPE nor BPE with byte fallback (SentencePiece's); llama.cpp's gpt2 and "
                     "llama tokenizers hold only those")


def token_table(tokenizer, vocab_size: int, kind: str) -> tuple[list[str], list[int]]:
    """Every id's token and llama.cpp token type, ``vocab_size`` of them."""
    from gguf import TokenType

    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = []
    for i, token in enumerate(tokens):
        if i not in by_id:
            types.append(TokenType.UNUSED)
        elif kind == "llama" and i == tokenizer.unk_token_id:
            types.append(TokenType.UNKNOWN)
        elif i in added:
            types.append(TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        else:
            types.append(TokenType.BYTE if kind == "llama" and BYTE_TOKEN.fullmatch(token) else TokenType.NORMAL)
    return tokens, [int(t) for t in types]


def merge_text(merge) -> str:
    """A merge as llama.cpp stores it, "left right": tokenizer.json's newer [left, right] pairs joined, a
    space inside a part spelled U+0120 as gguf-py's SpecialVocab spells it."""
    return merge if isinstance(merge, str) else " ".join(part.replace(" ", "\u0120") for part in merge)


def merge_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """SentencePiece-style scores: llama.cpp's ``llama`` tokenizer merges the adjacent pair whose joined
    piece scores highest, so a piece made by merge k scores -k (the earlier merge wins, as in BPE); a
    piece no merge makes scores below all of them."""
    rank = {}
    for k, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", ""), k)
    return [-float(rank.get(token, len(merges) + i)) for i, token in enumerate(tokens)]


def bpe_pre_tokenizer(pre: dict | None, where: str) -> str:
    """llama.cpp's name (``tokenizer.ggml.pre``) of a byte-level BPE pre-tokenizer: GPT-2's own
    regex, SmolLM's single digits before it, or a known split regex (transformers' table of them);
    ``default`` with a warning for one neither knows."""
    parts = (pre or {}).get("pretokenizers", [pre] if pre else [])
    kinds = [part.get("type") for part in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        name = next((name for name, split in known_splits().items() if split == regex), None)
        if name:
            return name
    warn(f"{where}: its tokenizer's pre-tokenizer ({', '.join(map(str, kinds)) or 'none'}) is none that llama.cpp "
         "names; written as tokenizer.ggml.pre 'default', with which llama.cpp may split text differently")
    return "default"


def known_splits() -> dict[str, str]:
    """{llama.cpp pre-tokenizer name: its split regex}, as transformers' GGUF reader knows them (or none)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return {}
    return GGUF_PRE_TOKENIZER_SPLITS


def special_behaviour(tokenizer) -> tuple[bool, bool, bool]:
    """Whether encoding adds BOS, adds EOS, and starts a text with SentencePiece's space: observed on a
    word, as the tokenizer's post-processor and normalizer make it (no config flag says it for all)."""
    with_special = tokenizer("a")["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    added = len(with_special) > len(plain)
    add_bos = added and tokenizer.bos_token_id is not None and with_special[0] == tokenizer.bos_token_id
    add_eos = added and tokenizer.eos_token_id is not None and with_special[-1] == tokenizer.eos_token_id
    pieces = tokenizer.convert_ids_to_tokens(plain)
    return add_bos, add_eos, bool(pieces) and pieces[0].startswith("\u2581")


__all__ = ["Field", "tokenizer_fields"]
