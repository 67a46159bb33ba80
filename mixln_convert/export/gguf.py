"""A plain checkpoint (:mod:`.plain`) as one llama.cpp GGUF file, written with gguf-py's ``GGUFWriter``.

Tensor names and config keys are the architectures/*.json ``gguf`` tables that :mod:`..io.gguf` reads
GGUFs with, inverted, so what this writes reads back tensor for tensor. llama.cpp's LLaMA (its "norm"
rope) wants each q/k head's rotary halves interleaved: rows permuted here as its convert_hf_to_gguf.py
does, undone by both readers; Qwen's "neox" rope is HF's order. Matrices take ``--type``; vectors
(norm gains, biases) stay float32, and a q8_0 matrix whose rows are no multiple of 32 f16, as
llama.cpp's converter writes them. The file is written tensor by tensor (one in memory at a time) into
a temporary folder beside it and renamed into place; it is read back before that (config and
tokenizer as transformers reads them), and a difference is a warning: llama.cpp reads it itself.
"""

import math
import os
from pathlib import Path

from .. import __version__
from ..errors import MixLNError, first_line, warn
from ..io.atomic import atomic_output_file
from ..io.checkpoint import StoredTensor
from ..io.paths import check_not_input
from ..options import FORCE
from .options import ExportOptions
from .plain import folds_lns, plain_config, plain_names, plain_tensors
from .tokenizer import Field, tokenizer_fields

# --type -> (gguf-py's GGMLQuantizationType of matrices, LlamaFileType of general.file_type), by name
TENSOR_TYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"),
                "q8_0": ("Q8_0", "MOSTLY_Q8_0")}
# a text the written tokenizer must encode as the source's: words, digits, runs of blanks, a newline, non-ASCII
TO_GGUF = f"{ExportOptions.flag('to')} gguf"  # the option this module writes for, as its messages name it
SAMPLE_TEXT = "Hello, world! In 2024 the model's 12,345 tokens\n  were  indented\tand ünïcödé — 中文 too."


def check_gguf_destination(out, inputs: dict, force: bool) -> Path:
    """OUT of ``--to gguf``, before any work: a ``.gguf`` file path that is no input, not a folder, and
    exists only with ``force``, in a folder that can be written. Returns it resolved."""
    target = check_not_input(out, inputs, flag="OUT")
    if target.suffix != ".gguf":
        raise MixLNError(f"OUT {out}: {TO_GGUF} writes one file; name it NAME.gguf")
    if target.is_dir():
        raise MixLNError(f"OUT {out}: is a folder; {TO_GGUF} writes one .gguf file")
    if target.exists() and not target.is_file():
        raise MixLNError(f"OUT {out}: exists and is not a regular file")
    if target.exists() and not force:
        raise MixLNError(f"OUT {out}: exists (use {FORCE} to replace it)")
    parent = next((p for p in target.parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise MixLNError(f"OUT {out}: cannot create it ({parent} is not a writable folder)")
    return target


def write_gguf(source, arch, out, tensor_type: str, inputs: dict, *, force: bool, progress: bool) -> None:
    """The GGUF file ``out`` of ``source`` (a plain model of family ``arch``), matrices of ``tensor_type``,
    with its tokenizer; everything llama.cpp's reading would lose is refused before the file is made."""
    hf_config = transformers_config(source, arch)
    names = plain_names(source)
    gguf_names = gguf_tensor_names(source, arch, names)
    metadata = model_fields(source, arch, hf_config, tensor_type) + tokenizer_fields(source, hf_config.vocab_size)
    dst = check_gguf_destination(out, inputs, force)
    with atomic_output_file(dst, str(out), lambda: check_gguf_destination(out, inputs, force), inputs) as path:
        write_file(path, source, arch, hf_config, names, gguf_names, metadata, tensor_type, progress)
        check_read_back(path, out, source)


def transformers_config(source, arch):
    """The plain model's transformers config (its family's defaults filled in: the rope theta, the head
    size, the epsilon a config.json may leave out), refused where llama.cpp's architecture and
    transformers' GGUF reader cannot state it: rope scaling, an activation other than SiLU, a feature
    the family's JSON lists as unsupported (sliding-window attention)."""
    from transformers import AutoConfig

    config = plain_config(source.config, arch)
    for key, feature in arch.unsupported_config.items():
        if config.get(key) is not None and config[key] is not False:
            raise MixLNError(f"{source.where}: {key} {config[key]}: llama.cpp's {arch.gguf_architecture} has no "
                             f"{feature}; {TO_GGUF} exports only checkpoints with {key} null or false")
    try:
        hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    except (TypeError, ValueError, KeyError) as e:  # transformers' own validation of the config's values
        raise MixLNError(f"{source.where}: transformers refuses the config ({first_line(e)})") from None
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise MixLNError(f"{source.where}: rope_parameters rope_type {rope['rope_type']!r}: transformers' GGUF reader "
                         f"reads no rope scaling for {arch.gguf_architecture}; {TO_GGUF} exports the default rope "
                         f"only ({ExportOptions.flag('to')} llama keeps it)")
    if hf_config.hidden_act != "silu":
        raise MixLNError(f"{source.where}: hidden_act {hf_config.hidden_act!r}: llama.cpp's "
                         f"{arch.gguf_architecture} computes SiLU; {TO_GGUF} exports only hidden_act silu")
    return hf_config


def gguf_tensor_names(source, arch, names: list[str]) -> dict[str, str]:
    """{checkpoint tensor name: GGUF tensor name} of ``names`` (the reading table inverted); a tensor
    llama.cpp's architecture has no name for is refused."""
    to_gguf = {ours: theirs for theirs, ours in arch.gguf_names(source.config["num_hidden_layers"]).items()}
    unnamed = [name for name in names if name not in to_gguf]
    if unnamed:
        raise MixLNError(f"{source.path}: tensor {unnamed[0]} has no name in llama.cpp's {arch.gguf_architecture} "
                         f"architecture; {TO_GGUF} cannot write it")
    return {name: to_gguf[name] for name in names}


def model_fields(source, arch, hf_config, tensor_type: str) -> list[Field]:
    """The general and ``<arch>.*`` metadata llama.cpp's loader reads: the sizes by the JSON ``config``
    table, the rope and norm constants, the file type."""
    from gguf import GGML_QUANT_VERSION, GGUFValueType, LlamaFileType

    prefix = arch.gguf_architecture
    sizes = {key: getattr(hf_config, key, None) for key in arch.gguf["config"]}
    # the attention head size: a config's own, else hidden_size / heads (Qwen2's config states none)
    sizes["head_dim"] = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    sizes["num_key_value_heads"] = hf_config.num_key_value_heads or hf_config.num_attention_heads
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    fields = [Field("general.type", "model", GGUFValueType.STRING),
              Field("general.file_type", int(LlamaFileType[TENSOR_TYPES[tensor_type][1]]), u32),
              Field("general.quantization_version", GGML_QUANT_VERSION, u32),
              Field("general.description", description(source, arch), GGUFValueType.STRING),
              *provenance_fields(source, arch)]
    fields += [Field(f"{prefix}.{gguf_key}", int(sizes[key]), u32) for key, gguf_key in arch.gguf["config"].items()
               if sizes[key] is not None]
    fields += [Field(f"{prefix}.attention.value_length", sizes["head_dim"], u32),
               Field(f"{prefix}.rope.dimension_count", sizes["head_dim"], u32),
               Field(f"{prefix}.rope.freq_base", float(hf_config.rope_parameters["rope_theta"]), f32),
               Field(f"{prefix}.attention.layer_norm_rms_epsilon", float(hf_config.rms_norm_eps), f32)]
    return fields


def source_history(source):
    """The records of ``source`` (an exported folder's, from its mixln_export.json, as a card reads them)."""
    from ..io.lineage import history, read_export

    return history(source.config, read_export(source.path) if source.path.is_dir() else None, source.where)


def description(source, arch) -> str:
    """general.description: what the file was made from, step by step as the model card says it (no local path:
    a file travels)."""
    from ..io.model_card import history_text

    folded = ", its LayerNorm Scaling folded into the norm gains" if folds_lns(source) else ""
    steps = history_text(source_history(source), source.path, plain_config(source.config, arch))
    return (f"Exported by mixln-convert {__version__} from a {source.config.get('model_type')} checkpoint{folded}. "
            f"{steps}")


HUB = "https://huggingface.co/"


def provenance_fields(source, arch) -> list[Field]:
    """general.name, the carried licence, the base model (general.base_model.*: the chain's first Hub model, or
    a GGUF's own name) and, for a Hub model exported as it is, general.source.*, as llama.cpp's converter names them."""
    from gguf import GGUFValueType, Keys

    from ..io.hub import snapshot_model
    from ..io.model_card import base_model, carried_license, title

    G, S, U32 = Keys.General, GGUFValueType.STRING, GGUFValueType.UINT32
    history = source_history(source)
    fields = [Field(G.NAME, title(history, source.path, plain_config(source.config, arch)), S)]
    license = carried_license(history, source.path)
    fields += [Field(key, license[name], S) for key, name in ((G.LICENSE, "license"), (G.LICENSE_NAME, "license_name"),
                                                             (G.LICENSE_LINK, "license_link")) if license.get(name)]
    parent = {}
    hub = base_model(history, source.path)
    if hub:
        organization, _, name = hub.rpartition("/")
        parent = {G.BASE_MODEL_NAME: name, G.BASE_MODEL_ORGANIZATION: organization, G.BASE_MODEL_REPO_URL: HUB + hub}
    elif gguf := history.origin_gguf(source.path):  # a GGUF's own words of itself
        parent = {G.BASE_MODEL_NAME: gguf.name, G.BASE_MODEL_ORGANIZATION: gguf.organization,
                  G.BASE_MODEL_REPO_URL: gguf.repo_url or gguf.source_repo_url}
    if any(parent.values()):
        fields.append(Field(G.BASE_MODEL_COUNT, 1, U32))
        fields += [Field(key.format(id=0), value, S) for key, value in parent.items() if value]
    direct = snapshot_model(source.path)
    if direct:  # the Hub model itself, exported
        fields += [Field(G.SOURCE_URL, HUB + direct[0], S), Field(G.SOURCE_REPO_URL, HUB + direct[0], S)]
    return fields


def stored_type(shape: tuple[int, ...], tensor_type: str):
    """The GGMLQuantizationType a tensor of ``shape`` is stored as under ``--type tensor_type``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if len(shape) < 2:
        return GGMLQuantizationType.F32
    wanted = GGMLQuantizationType[TENSOR_TYPES[tensor_type][0]]
    block, _ = GGML_QUANT_SIZES[wanted]
    return wanted if shape[-1] % block == 0 else GGMLQuantizationType.F16


def write_file(path: Path, source, arch, hf_config, names, gguf_names, metadata, tensor_type, progress) -> None:
    """The GGUF at ``path``: header, metadata and tensor table first (from shapes alone), then each
    tensor as :func:`plain_tensors` streams it, encoded."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFWriter
    from tqdm.auto import tqdm

    qtypes = {name: stored_type(source.shape(name), tensor_type) for name in names}
    rotary_heads = {"attn_q": hf_config.num_attention_heads,
                    "attn_k": hf_config.num_key_value_heads or hf_config.num_attention_heads}
    writer = GGUFWriter(path, arch.gguf_architecture)
    try:
        for field in metadata:
            writer.add_key_value(*field)
        for name in names:
            shape, qtype = source.shape(name), qtypes[name]
            block, size = GGML_QUANT_SIZES[qtype]  # its bytes as stored
            writer.add_tensor_info(gguf_names[name], shape, np.dtype(np.float32),
                                   math.prod(shape[:-1]) * (shape[-1] // block) * size, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, tensor in tqdm(plain_tensors(source), total=len(names), desc="exporting", unit="tensor",
                                 disable=not progress):
            role = gguf_names[name].split(".")[-2]
            heads = rotary_heads.get(role) if arch.gguf["interleaved_rotary"] else None
            writer.write_tensor_data(encoded(tensor, qtypes[name], heads))
    finally:
        writer.close()


def encoded(tensor, qtype, rotary_heads: int | None):
    """A tensor's bytes as the GGUF stores them: float32 rows, interleaved per rotary head where
    ``rotary_heads`` is given, then cast or quantized (gguf-py's quantizer) to ``qtype``."""
    from gguf import quantize

    tensor = tensor.tensor if isinstance(tensor, StoredTensor) else tensor
    data = tensor.detach().float().contiguous().numpy()
    if rotary_heads:
        data = interleaved_rotary(data, rotary_heads)
    return quantize(data, qtype)


def interleaved_rotary(weights, heads: int):
    """q/k rows (or biases) of HF's rotary order ("neox": each head's first halves, then its second) in
    llama.cpp LLaMA's ("norm": the halves interleaved), as its converter permutes them; io/gguf.py undoes it."""
    shape = weights.shape
    return weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def check_read_back(path: Path, out, source) -> None:
    """Read the written file back as transformers reads a GGUF (its config, checked against the header
    as this package checks one, and its tokenizer) and warn where that fails or the tokenizer encodes
    :data:`SAMPLE_TEXT` otherwise than the source's: llama.cpp reads the metadata itself, so the file is
    kept, but transformers would not reproduce the source."""
    from transformers import AutoTokenizer

    from ..io.gguf import DIGIT_SPLIT_PRES, GGUFCheckpoint

    written = GGUFCheckpoint(path)
    try:
        written.config  # noqa: B018  (transformers' reading, checked against the header)
        ids = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)(SAMPLE_TEXT)["input_ids"]
    except MixLNError as e:
        warn(f"{out}: written, but transformers cannot read it back: {str(e).replace(f'{path}: ', '')}")
        return
    except Exception as e:  # noqa: BLE001  (transformers' tokenizer builders raise many types)
        warn(f"{out}: written, but transformers cannot read its tokenizer back ({first_line(e)})")
        return
    expected = source.tokenizer(SAMPLE_TEXT)["input_ids"]
    if ids != expected and written._pre in DIGIT_SPLIT_PRES and written.tokenizer(SAMPLE_TEXT)["input_ids"] == expected:
        warn(f"{out}: written with tokenizer.ggml.pre {written._pre!r}, which llama.cpp reads as the source's split "
             "(every digit on its own); transformers' own GGUF reader (gguf_file=) drops that split and encodes "
             "numbers otherwise, mixln-convert's reader keeps it")
    elif ids != expected:
        warn(f"{out}: written, but the tokenizer transformers reads from it encodes text otherwise than the source's "
             f"(on {SAMPLE_TEXT!r}); llama.cpp may too")


__all__ = ["TENSOR_TYPES", "check_gguf_destination", "write_gguf"]
