"""``convert()``: a Pre-LN LLaMA checkpoint in, a Mix-LN (or LayerNorm Scaling) checkpoint folder out."""

import time
from pathlib import Path

import torch

from ..architectures import architecture_for
from ..errors import MixLNError, warn
from ..io.atomic import atomic_output_dir
from ..io.loader import open_checkpoint
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..io.writer import tool_stamp, write_checkpoint
from ..limits import parse_size
from ..options import MAX_SHARD_SIZE
from ..runtime import map_large_allocations
from ..schema import check_windows
from .layout import post_ln_count
from .options import ConvertOptions
from .plan import ConversionPlan


TORCH_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}  # conversion/options.py DTYPES, as torch's


def convert(src, dst, options: ConvertOptions | None = None, *, force: bool = False, progress: bool = True,
            statistics: dict | None = None, **settings) -> Path:
    """Convert the Pre-LN checkpoint ``src`` (HF folder or .gguf) into a Mix-LN folder ``dst``; returns ``dst``.

    ``options``: a :class:`~mixln_convert.conversion.options.ConvertOptions`, or its fields as ``settings``
    (with ``options`` too: those fields replaced). The first ``floor(alpha * L)`` blocks (or ``post_ln_layers``;
    default alpha 0.25) become Post-LN; ``strategy`` says what their weights become (see :mod:`.plan`).
    ``layout="lns"`` makes a LayerNorm Scaling model instead: every block's norm outputs scaled by
    1/sqrt(l), its gains by sqrt(l) so that it computes the source's function (``strategy="scratch"``:
    fresh, gains 1, as in the LNS paper). ``src`` is never written; ``dst`` appears only when the whole
    conversion succeeded. Memory stays within one output shard (default the source's largest, at most 5GB).

    ``statistics``: the :func:`calibration_statistics` of this source for at least as many blocks,
    reused instead of calibrating again (block i's depend only on blocks before it, so one pass up to
    the largest count serves every smaller one; ``mixln-convert sweep``).
    """
    map_large_allocations()
    options = ConvertOptions.given(options, settings)
    src = checkpoint_path(src, "SRC")
    max_shard_bytes = options.max_shard_bytes
    calibration_data, strategy = options.calibration_data, options.strategy
    inputs = {"SRC": src, options.flag("calibration_data"): calibration_data}
    check_readable(calibration_data, options.flag("calibration_data"))
    check_destination(dst, inputs, force)
    source = open_checkpoint(src)
    arch = architecture_for(source.config, source.where)
    config = dict(source.config)
    post_ln_layers = 0 if options.lns else post_ln_count(config["num_hidden_layers"], options.resolved_alpha,
                                                         options.post_ln_layers)
    if not options.lns and post_ln_layers == 0 and options.post_ln_layers is None:
        alpha = options.flag("alpha")
        warn(f"{alpha} {options.resolved_alpha:g}: floor({options.resolved_alpha:g} x {config['num_hidden_layers']}) "
             "= 0 Post-LN blocks: DST is the source's Pre-LN model in the Mix-LN format (its card says so); a larger "
             f"{alpha} or {options.flag('post_ln_layers')} makes Post-LN blocks")
    if strategy == "calibrated" and post_ln_layers > 0:
        check_windows(options, config)
    if max_shard_bytes is None:  # the writer buffers one output shard of computed tensors
        max_shard_bytes = min(parse_size(MAX_SHARD_SIZE, "MAX_SHARD_SIZE"), source.largest_shard_bytes())
    out_dtype = TORCH_DTYPES.get(options.dtype) or source.dtype()

    with atomic_output_dir(dst, force=force, protect=inputs) as tmp:
        started = time.time()
        stats = None
        if strategy == "calibrated" and post_ln_layers > 0:
            stats = first_blocks(statistics, post_ln_layers) if statistics else calibration_statistics(
                source, arch, post_ln_layers, calibration_data, options.calibration_tokens, options.calibration_seq_len,
                progress)
        plan = ConversionPlan(arch, config, post_ln_layers, strategy, options.scaled_init, options.seed, stats,
                              out_dtype, lns_gains=options.lns and strategy != "scratch")
        # the fitted gain vectors are in the weights, their means here
        calibration = None if stats is None else {k: [v.mean().item() for v in vs] if k.endswith("_gain") else vs
                                                  for k, vs in stats.items()}
        # an LNS retrofit calibrates nothing: "exact" says what it is
        scaled_init = {"scaled_init": options.scaled_init} if strategy in ("reinit-post", "scratch") else {}
        provenance = tool_stamp(source=str(Path(src).absolute()), strategy="exact" if plan.lns_gains else strategy,
                                seed=options.seed, calibration=calibration, **scaled_init)

        def finished_config() -> dict:
            """config.json of the converted model: the source's, with the Mix-LN model type and layout."""
            return {
                **config,
                "model_type": arch.converted["model_type"],
                "architectures": [arch.converted["architecture"]],
                "auto_map": arch.converted["auto_map"],
                "post_ln_layers": post_ln_layers,
                "layernorm_scaling": options.lns,
                "alpha": None if options.lns else options.resolved_alpha,
                "dtype": str(out_dtype).removeprefix("torch."),
                "mixln_provenance": {**provenance, "seconds": round(time.time() - started, 2)},
            }

        write_checkpoint(tmp, plan.tensors(source), finished_config, source, max_shard_bytes, desc="converting",
                         total=len(source.names()), progress=progress)
    return Path(dst)


def calibration_statistics(source, arch, post_ln_layers, data, tokens, seq_len, progress) -> dict:
    from ..data import read_texts, token_windows
    from ..surgery.prefix import load_prefix
    from .calibrate import calibrate

    windows = token_windows(source.tokenizer, read_texts(data, split="calibration"), seq_len, tokens,
                            flag=ConvertOptions.flag("calibration_seq_len"), source=data or "embedded:calibration")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a few blocks: the GPU makes calibration instant
    stats = calibrate(load_prefix(source, arch, post_ln_layers, device=device), windows, progress=progress)
    stats = {k: [v.cpu() if torch.is_tensor(v) else v for v in vs] for k, vs in stats.items()}
    for key, values in stats.items():
        for i, value in enumerate(values):
            if not torch.isfinite(torch.as_tensor(value)).all():
                raise MixLNError(f"{ConvertOptions.flag('calibration_data')} {data or 'embedded:calibration'}: "
                                 f"calibration gave a non-finite {key} in block {i}; the source's activations "
                                 "overflow on this text")
    return {**stats, "data": str(data) if data else "embedded:calibration", "tokens": windows.numel(),
            "seq_len": windows.shape[1]}


def first_blocks(stats: dict, post_ln_layers: int) -> dict:
    """Calibration statistics of the first ``post_ln_layers`` blocks, from those of at least ``post_ln_layers``."""
    if len(stats["input_scale"]) < post_ln_layers:
        raise MixLNError(f"calibration statistics of {len(stats['input_scale'])} blocks cannot convert "
                         f"{post_ln_layers}")
    return {key: value[:post_ln_layers] if isinstance(value, list) else value for key, value in stats.items()}
