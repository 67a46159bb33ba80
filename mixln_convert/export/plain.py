"""A checkpoint as the plain model of its family: the tensors and config.json of a transformers
``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` computing the same function.

A plain or Pre-LN (``post_ln_layers`` 0) checkpoint's tensors are already that model's. A LayerNorm
Scaling one multiplies the outputs of block l's two norms (``input_layernorm``, ``post_attention_layernorm``;
l = layer index + 1) by 1/sqrt(l); RMSNorm's output is gain * normalized x, so the factor folds into the
gains exactly (up to rounding). Qwen3's per-head q/k norms sit inside the attention, after the scaled
input norm's projections, and are not scaled: they are carried as they are.
"""

import json
from pathlib import Path

from ..architectures import LNS_NORM_ROLES, lns_gain
from ..errors import MixLNError
from ..io.atomic import atomic_output_dir
from ..io.lineage import EXPORT_FILE, RECORD_KEYS, Export, read_export, recorded
from ..io.validate import IGNORED_SUFFIXES
from ..io.writer import tool_stamp, write_checkpoint
from ..limits import parse_size
from ..options import MAX_SHARD_SIZE

# config.json keys of this package's layouts and records, which a plain model's config never holds
MIXLN_CONFIG_KEYS = (*RECORD_KEYS, "auto_map")


def plain_architecture(source):
    """The family whose plain model computes what ``source`` computes; a Mix-LN checkpoint with
    Post-LN blocks is refused, naming its config and the key."""
    post_ln_layers = source.config.get("post_ln_layers") or 0
    if source.is_mixln and post_ln_layers:
        raise MixLNError(f"{source.where}: post_ln_layers {post_ln_layers}: a Mix-LN checkpoint with Post-LN blocks "
                         "does not export, as no plain architecture computes Norm(x + F(x)); export its Pre-LN source, "
                         "or an LNS or post_ln_layers 0 checkpoint")
    return source.arch


def folds_lns(source) -> bool:
    """Whether ``source`` is a LayerNorm Scaling model, whose scaling the export folds into its gains (a
    plain model's config stating ``layernorm_scaling`` computes no scaling: nothing to fold)."""
    return source.is_mixln and bool(source.config.get("layernorm_scaling"))


def plain_names(source) -> list[str]:
    """The tensors of the plain model, in the source's order: all but the buffers a model recomputes and a
    tied head saved anyway (the embeddings are the head)."""
    tied = source.config.get("tie_word_embeddings", False)
    return [name for name in source.names()
            if not name.endswith(IGNORED_SUFFIXES) and not (tied and name == source.arch.lm_head)]


def plain_tensors(source):
    """(name, tensor) of each of :func:`plain_names`, streamed: the folded gains (an LNS model's 1/sqrt(l) folded
    away) computed in float64 and stored in the source's dtype, every other tensor as stored (copied file to file
    where it can be)."""
    arch, depth = source.arch, source.config["num_hidden_layers"]
    factors = ({arch.layer_tensor(i, role): 1 / lns_gain(i) for i in range(depth) for role in LNS_NORM_ROLES}
               if folds_lns(source) else {})
    for name in plain_names(source):
        if name in factors:
            gains = source.get(name)
            yield name, (gains.double() * factors[name]).to(gains.dtype)
        else:
            yield name, source.stored(name)


def plain_config(config: dict, arch) -> dict:
    """config.json of the plain model: the source's, with its family's own model type and class, and
    none of this package's keys (its layout is folded away, its records go to :data:`~..io.lineage.EXPORT_FILE`)."""
    plain = {key: value for key, value in config.items() if key not in MIXLN_CONFIG_KEYS}
    return {**plain, "model_type": arch.model_type, "architectures": [arch.name]}


def export_record(source, to: str, **details) -> Export:
    """What an export keeps of its source: the tool, the source, what was folded, and the records the
    source's config held (its Mix-LN provenance, a plain model's pruning)."""
    # an exported folder exported again: its own export's records too
    history = recorded(source.config, read_export(source.path) if source.path.is_dir() else None)
    return Export(**tool_stamp(exported_to=to, source=str(Path(source.path).absolute()),
                               source_model_type=source.config.get("model_type"),
                               folded_layernorm_scaling=folds_lns(source), **details,
                               source_config={key: history[key] for key in RECORD_KEYS if key in history}))


def write_plain(source, arch, dst, inputs: dict, *, force: bool, progress: bool) -> None:
    """The plain transformers folder ``dst`` of ``source`` (tokenizer and generation files carried over),
    written atomically; the export's record in :data:`~..io.lineage.EXPORT_FILE` (a file transformers never reads)."""
    names = plain_names(source)
    max_shard_bytes = min(parse_size(MAX_SHARD_SIZE, "MAX_SHARD_SIZE"), source.largest_shard_bytes())
    record = export_record(source, "llama", architecture=arch.name)
    with atomic_output_dir(dst, force=force, protect=inputs) as tmp:
        # the card tells the source's history (the record), not a bare plain model's
        write_checkpoint(tmp, plain_tensors(source), plain_config(source.config, arch), source, max_shard_bytes,
                         desc="exporting", total=len(names), progress=progress, exported=record)
        (tmp / EXPORT_FILE).write_text(json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")


__all__ = ["MIXLN_CONFIG_KEYS", "folds_lns", "plain_architecture", "plain_config", "plain_names",
           "plain_tensors", "write_plain"]
