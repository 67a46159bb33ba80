"""``prune()``: remove decoder blocks from a checkpoint, named or chosen by a rule of
:mod:`..analysis.choice`. The pruned checkpoint is of the same kind as its source, tensors
streamed one at a time.
"""

import re
import time
from pathlib import Path

from ..architectures import LNS_NORM_ROLES, lns_gain
from ..analysis.choice import check_count, choose_layers, layer_scores, span_distances
from ..errors import MixLNError
from ..io.lineage import history, read_export, with_record
from ..io.loader import open_checkpoint
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..io.atomic import atomic_output_dir
from ..io.writer import tool_stamp, write_checkpoint
from ..runtime import map_large_allocations
from ..schema import check_windows
from .options import PruneOptions

_LAYER_RANGE = re.compile(r"([0-9]+)\s*(?:-\s*([0-9]+))?")  # ASCII digits only: '²'.isdigit() is True


def parse_layers(text: str, num_layers: int) -> list[int]:
    """'20-23,27' -> [20, 21, 22, 23, 27], checked against a ``num_layers``-deep model."""
    layers, flag = set(), PruneOptions.flag("layers")
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _LAYER_RANGE.fullmatch(part)
        if not match:
            raise MixLNError(f"{flag}: {part!r} is not a layer index or range (example: 20-23,27)")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if first > last:
            raise MixLNError(f"{flag}: range {part!r} is empty (write low-high)")
        if last >= num_layers:
            raise MixLNError(f"{flag}: layer {last} is outside [0, {num_layers - 1}] for this "
                             f"{num_layers}-layer model")
        layers.update(range(first, last + 1))
    if not layers:
        raise MixLNError(f"{flag}: {text!r} selects no layer")
    if len(layers) == num_layers:
        raise MixLNError(f"{flag}: {text!r} removes all {num_layers} layers; at least one must remain")
    return sorted(layers)


def prune(src, dst, options: PruneOptions | None = None, *, force: bool = False, progress: bool = True,
          **settings) -> Path:
    """Write ``src`` to ``dst`` without the decoder blocks that its :class:`~mixln_convert.surgery.options.PruneOptions`
    name or choose; returns ``dst``. The remaining blocks are renumbered; a Mix-LN model left with
    no Post-LN block stays a Mix-LN checkpoint with ``post_ln_layers`` 0 (numerically a LLaMA). What was
    removed, and why, is appended to ``mixln_provenance["pruned"]`` (Mix-LN) or to the top-level
    ``pruned`` list (plain LLaMA) of config.json.
    """
    map_large_allocations()
    options = PruneOptions.given(options, settings)
    src = checkpoint_path(src, "CKPT")
    check_readable(options.data, options.flag("data"))
    inputs = {"CKPT": src, options.flag("data"): options.data}
    check_destination(dst, inputs, force, flag="OUT")
    source = open_checkpoint(src)
    # an exported folder: its history is in its mixln_export.json, which the pruned one keeps in its record
    exported = read_export(src) if Path(src).is_dir() else None
    history(source.config, exported, source.where)  # a damaged record is refused before the work
    num_layers = source.config["num_hidden_layers"]
    if options.layers is not None:
        parse_layers(options.layers, num_layers)
    else:
        check_count(options.remove, num_layers)
        if options.method != "last":
            check_windows(options, source.config)
    with atomic_output_dir(dst, force=force, protect=inputs) as tmp:
        started = time.time()
        removed, reason = select_layers(source, num_layers, options, progress)
        record = tool_stamp(source=str(Path(src).absolute()), num_layers_before=num_layers, removed_layers=removed,
                            **reason, seconds=round(time.time() - started, 2),
                            **({"exported": exported.to_dict()} if exported else {}))
        write_checkpoint(tmp, kept_tensors(source, source.arch, removed),
                         pruned_config(source.config, source.is_mixln, removed, record), source,
                         options.max_shard_bytes, desc="pruning", total=len(source.names()), progress=progress)
    return Path(dst)


def select_layers(source, num_layers: int, options: PruneOptions, progress: bool) -> tuple[list[int], dict]:
    """The blocks to remove from ``source`` and why: the method and the scores it ranked by."""
    layers, remove, method, data = options.layers, options.remove, options.method, options.data
    if layers is not None:
        return parse_layers(layers, num_layers), {"method": "explicit"}
    if method == "last":
        return choose_layers(method, remove, num_layers), {"method": method}
    import torch

    from ..data import read_texts, token_windows

    windows = token_windows(source.tokenizer, read_texts(data, split="calibration"), options.seq_len,
                            options.max_tokens, source=data or "embedded:calibration")
    scores = layer_scores(source.model(dtype=torch.float32), windows, method, options.batch_size, progress)
    reason = {"method": method, "data": str(data) if data else "embedded:calibration", "tokens": windows.numel()}
    if method == "angular":
        reason["angular_distance_by_start"] = span_distances(scores["angular_distance_matrix"], remove)
    else:
        reason["layer_drop"] = scores["layer_drop"]
    return choose_layers(method, remove, num_layers, scores), reason


def kept_tensors(source, arch, removed: list[int]):
    """Every tensor but those of the ``removed`` blocks, the kept blocks renumbered. In a LayerNorm
    Scaling model a block's norm outputs are scaled by its depth, which renumbering changes: its
    gains are rescaled so that each kept block computes what it did (as ``analyze`` skips blocks)."""
    kept = [i for i in range(source.config["num_hidden_layers"]) if i not in removed]
    new_index = {old: new for new, old in enumerate(kept)}
    tied = source.config.get("tie_word_embeddings", False)
    scaled_norms = {arch.layer[role] for role in LNS_NORM_ROLES} if source.config.get("layernorm_scaling") else set()
    for name in source.names():
        i = arch.layer_of(name)
        if i in removed or (tied and name == arch.lm_head):  # a tied head is the embeddings: not saved twice
            continue
        new_name, tensor = name, source.stored(name)  # unchanged: copied file to file
        if i is not None:
            prefix = arch.layer_prefix.format(i=i)
            new_name = arch.layer_prefix.format(i=new_index[i]) + name.removeprefix(prefix)
            if name.removeprefix(prefix) in scaled_norms and new_index[i] != i:
                gains = tensor.tensor
                tensor = (gains.double() * (lns_gain(new_index[i]) / lns_gain(i))).to(gains.dtype)
        yield new_name, tensor


def pruned_config(config: dict, mixln: bool, removed: list[int], record: dict) -> dict:
    """config.json of the pruned model: depth, Mix-LN layout, and ``record`` in its provenance."""
    config = dict(config)
    config["num_hidden_layers"] -= len(removed)
    if config.get("layer_types"):  # the attention kind of each block (Qwen's): the kept blocks' only
        config["layer_types"] = [kind for i, kind in enumerate(config["layer_types"]) if i not in removed]
    if mixln:
        post_ln_layers = config["post_ln_layers"]
        # Post-LN blocks are the leading ones, so the kept ones still are: the layout stays one count.
        config["post_ln_layers"] = post_ln_layers - sum(i < post_ln_layers for i in removed)
        record = {**record, "post_ln_layers_before": post_ln_layers}
    return with_record(config, "pruned", record)
