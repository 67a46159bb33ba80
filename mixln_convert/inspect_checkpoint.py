"""``mixln-convert inspect``: what a checkpoint holds, read tensor by tensor (norm gains only)."""

import math
from dataclasses import dataclass
from pathlib import Path

from .io.loader import open_checkpoint
from .io.paths import checkpoint_path
from .io.records import Record

NORM_ROLES = ("input_norm", "post_attention_norm", "post_feedforward_norm")
CELL = 30  # width of a "mean ±std [min,max]" gain cell; wider values widen their row rather than being cut


@dataclass(frozen=True)
class Gain(Record):
    """A norm's gain over its channels."""
    mean: float
    std: float
    min: float
    max: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} ±{self.std:.3f} [{self.min:.2f},{self.max:.2f}]"


@dataclass(frozen=True)
class Block(Record):
    index: int
    kind: str  # Post-LN, Pre-LN or LNS
    norms: dict  # role -> Gain, for the roles the layout has


@dataclass(frozen=True)
class Description(Record):
    """What ``inspect`` prints (``--json``: as :meth:`to_dict` says)."""
    checkpoint: str
    model_type: str | None
    num_layers: int
    post_ln_layers: int
    layernorm_scaling: bool
    alpha: float | None
    parameters: int
    dtype: str
    stored_as: list | None  # a GGUF's own encodings, dequantized to dtype
    tied_embeddings: bool
    layers: list  # of Block
    provenance: dict | None  # printed as recorded, whatever it holds


def describe(ckpt) -> Description:
    source = open_checkpoint(checkpoint_path(ckpt, "CKPT"))
    config, arch = source.config, source.arch
    names = set(source.names())
    post_ln_layers = config.get("post_ln_layers", 0)
    pre_ln = "LNS" if config.get("layernorm_scaling") else "Pre-LN"  # an LNS block is Pre-LN, its norms scaled
    layers = []
    for i in range(config["num_hidden_layers"]):
        norms = {}
        for role in NORM_ROLES:
            name = arch.layer_tensor(i, role)
            if name in names:
                gain = source.get(name).float()
                norms[role] = Gain(*(getattr(gain, stat)().item() for stat in ("mean", "std", "min", "max")))
        layers.append(Block(i, "Post-LN" if i < post_ln_layers else pre_ln, norms))
    return Description(
        checkpoint=str(Path(ckpt)), model_type=config.get("model_type"), num_layers=config["num_hidden_layers"],
        post_ln_layers=post_ln_layers, layernorm_scaling=bool(config.get("layernorm_scaling", False)),
        alpha=config.get("alpha"), parameters=sum(math.prod(source.shape(name)) for name in names),
        dtype=str(source.dtype()).removeprefix("torch."), stored_as=getattr(source, "stored_types", None),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), layers=layers,
        provenance=config.get("mixln_provenance"))


def format_description(d: Description) -> str:
    pruned = ", then pruned" if (d.provenance or {}).get("pruned") else ""
    head = [
        f"checkpoint   {d.checkpoint}",
        f"model type   {d.model_type}   layers {d.num_layers}   Post-LN {d.post_ln_layers}"
        + (f" (converted at alpha {d.alpha}{pruned})" if d.alpha is not None else "")
        + ("   LayerNorm Scaling (block l's norm outputs x 1/sqrt(l), l from 1)" if d.layernorm_scaling else ""),
        f"parameters   {d.parameters:,}   dtype {d.dtype}"
        + (f" (dequantized from GGUF {'/'.join(d.stored_as)})" if d.stored_as else "")
        + f"   tied embeddings {d.tied_embeddings}",
        "",
        "norm gains per block: mean ±std [min,max] over the channels; - where the layout has no such norm",
        f"{'layer':>5}  {'kind':7}  " + "  ".join(f"{r:>{CELL}}" for r in NORM_ROLES),
    ]
    rows = []
    for layer in d.layers:
        cells = [str(layer.norms.get(role, "-")) for role in NORM_ROLES]
        rows.append(f"{layer.index:>5}  {layer.kind:7}  " + "  ".join(f"{c:>{CELL}}" for c in cells))
    prov = d.provenance
    tail = []
    if prov:
        tail = ["", "provenance"] + [f"  {k}: {v}" for k, v in prov.items() if k != "calibration"]
        if cal := prov.get("calibration"):
            tail.append(f"  calibration: {cal.get('tokens')} tokens of {cal.get('data')}"
                        + (f" in windows of {cal['seq_len']}" if "seq_len" in cal else ""))
            # One line per per-layer statistic, whatever the calibration recorded.
            tail += [f"    {key}: " + ", ".join(f"{x:.3g}" for x in values)
                     for key, values in cal.items() if isinstance(values, list)]
    return "\n".join(head + rows + tail)
