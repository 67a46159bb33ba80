"""What a training recipe costs, known before any weight is loaded: the model is built from its
config alone (a folder's config.json, a GGUF's metadata) on the meta device, and the parameter
count, per-process memory and FLOPs per optimizer step follow from its shapes, the recipe and the
hardware (processes, parallelism, memory per device).

Memory per process, in bytes:

- fp32 master weights (4), gradients (4) and AdamW's two moments (8) per parameter: held whole
  by every process (single, DDP), or a 1/processes shard each (FSDP);
- DDP: its gradient buckets, one more fp32 copy of the gradients (torch's default
  ``gradient_as_bucket_view=False`` copies each gradient into the bucket it all-reduces);
- bf16 autocast without FSDP: the bf16 copy of every matmul weight that autocast makes in the
  forward and the backward uses; FSDP instead gathers parameters for compute (bf16 under
  autocast): the root unit (embeddings, final norm, lm_head) and two blocks (the one computing,
  the one prefetched), with their fp32 gradients before the reduce-scatter;
- activations (:func:`block_bytes_per_token`, :func:`head_bytes_per_token`).

A run fits when this is at most ``USABLE`` of the device's memory; the rest is for what is not
counted: the CUDA context, NCCL buffers, the caching allocator's fragmentation, and AdamW's
temporaries at the optimizer step (none when fused; one shard-sized buffer under FSDP),
taken after the activations are freed.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures import model_blocks
from ..errors import MixLNError
from ..io.records import read_json
from ..io.loader import open_checkpoint
from ..io.validate import check_config, check_config_loads
from ..limits import MAX_PROCESSES, MAX_SIZE
from ..options import EstimateOptions
from .recipe import Recipe, load_recipe, recipe_path

USABLE = 0.9
# bytes per token and vocabulary entry that the backward adds to the saved log-softmax: the fp32
# gradients of the loss w.r.t. log-softmax's output and input, both alive at the peak
LOSS_GRADIENTS = 8
# "# Sized for: 8 x 80 GB GPUs, FSDP" in a recipe's leading comments: the hardware it is sized for
_SIZED_FOR = re.compile(r"^#\s*Sized for:\s*(\d+) x (\d+(?:\.\d+)?) ?GB (GPU|CPU)s?(?:, (DDP|FSDP))?", re.IGNORECASE)


@dataclass(frozen=True)
class Hardware:
    processes: int
    parallelism: str  # one of PARALLELISMS
    device: str  # one of DEVICES
    memory: int  # bytes per process: a GPU's memory, or the RAM one CPU process may use

    def __str__(self) -> str:
        return f"{self.processes} x {self.memory / 1e9:g} GB {self.device.upper()}, {self.parallelism}"


DEFAULT_HARDWARE = Hardware(1, "single", "gpu", 80 * 10**9)


def sized_for(recipe_file: Path) -> Hardware | None:
    """The hardware a recipe's leading comments say it is sized for (a "# Sized for: ..." line), or None."""
    for line in Path(recipe_file).read_text().splitlines():
        if not line.startswith("#"):
            return None
        if match := _SIZED_FOR.match(line):
            processes, memory = int(match.group(1)), int(float(match.group(2)) * 1e9)
            if not (1 <= processes <= MAX_PROCESSES and 1 <= memory <= MAX_SIZE):
                raise MixLNError(f"{recipe_file}: {line!r}: the processes must be in [1, {MAX_PROCESSES}] and the "
                                 "memory in (0, 1 PiB]")
            parallelism = (match.group(4) or ("single" if processes == 1 else "ddp")).lower()
            return Hardware(processes, parallelism, match.group(3).lower(), memory)
    return None


def choose_hardware(stated: Hardware | None, options: EstimateOptions | None = None, **settings) -> Hardware:
    """The hardware of an estimate: each of the ``options`` (an EstimateOptions, or its fields as
    ``settings``) given, else what the recipe states, else one 80 GB GPU."""
    options, stated = EstimateOptions.given(options, settings), stated or DEFAULT_HARDWARE
    processes = options.processes or stated.processes
    parallelism = options.parallelism
    if parallelism is None:  # a recipe sized for one GPU, estimated on several: replicated (DDP)
        parallelism = stated.parallelism if stated.parallelism != "single" or processes == 1 else "ddp"
    if parallelism == "single" and processes > 1:
        raise MixLNError(f"--parallelism single runs one process, not {processes} (ddp or fsdp for several)")
    memory = options.memory_bytes or stated.memory
    return Hardware(processes, parallelism, options.device or stated.device, memory)


@dataclass(frozen=True)
class Shapes:
    """What an estimate needs of a model, read from its modules on the meta device."""

    name: str  # the model class
    layers: int
    hidden: int
    q_dim: int  # heads x head_dim: the width of q and of the attention output
    kv_dim: int  # key/value heads x head_dim: the width of k and v
    heads: int
    intermediate: int
    vocab: int
    parameters: int
    block_parameters: int  # one decoder block: an FSDP unit
    matmul_parameters: int  # every Linear's weight: what bf16 autocast copies
    lookup_parameters: int  # an input embedding not tied to lm_head: a lookup, no multiply-adds


def model_config(source: str) -> dict:
    """The config of a checkpoint folder (its config.json alone) or a .gguf (its metadata and
    tensor table, no tensor data), checked as a conversion checks it."""
    path = Path(source)
    if path.suffix == ".gguf":
        return open_checkpoint(path).config
    where = str(path / "config.json")
    config = read_json(path / "config.json")
    check_config(config, where)
    check_config_loads(config, where)
    return config


def model_shapes(source: str) -> Shapes:
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..model import register  # noqa: F401  (a Mix-LN source builds through this package's classes)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**model_config(source)))
    block = model_blocks(model)[-1]  # a Pre-LN block (a Mix-LN model's Post-LN blocks have the same shapes)
    attention, mlp = block.self_attn, block.mlp
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    return Shapes(
        name=type(model).__name__, layers=len(model_blocks(model)), hidden=attention.q_proj.in_features,
        q_dim=attention.q_proj.out_features, kv_dim=attention.k_proj.out_features,
        heads=attention.q_proj.out_features // attention.head_dim, intermediate=mlp.gate_proj.out_features,
        vocab=embedding.shape[0], parameters=sum(p.numel() for p in model.parameters()),
        block_parameters=sum(p.numel() for p in block.parameters()),
        matmul_parameters=sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)),
        lookup_parameters=0 if tied else embedding.numel())


def block_bytes_per_token(s: Shapes, compute: int) -> int:
    """Bytes a Pre-LN LLaMA block saves for its backward, per token (a Post-LN block saves a few
    hidden widths less); ``compute``: 2 under bf16 autocast, 4 in fp32. The Megatron-style count
    (Korthikanti et al. 2022, section 4.1: each tensor autograd keeps, by its width and bytes) redone
    for this block as transformers runs it: RMSNorm, SwiGLU MLP, SDPA/flash attention (which keeps
    no seq_len x seq_len scores) and no dropout; tests/test_memory.py checks it against autograd."""
    h, c = s.hidden, compute
    norms = 2 * (4 * h + 4 * h)  # each RMSNorm keeps its fp32 input and normalized output
    # the projections' inputs: in fp32 the norms' outputs (q/k/v share one, gate/up the other);
    # under autocast each of q, k, v, gate and up saves a bf16 cast of its own
    projection_inputs = 2 * 4 * h if c == 4 else 5 * 2 * h
    attention = c * (2 * s.q_dim + 2 * s.kv_dim) + 4 * s.heads  # q, output, k, v; fp32 logsumexp per head
    mlp = 4 * c * s.intermediate  # gate, silu(gate), up and their product (down_proj's input)
    return norms + projection_inputs + attention + mlp


def head_bytes_per_token(s: Shapes, compute: int) -> int:
    """Bytes saved per token after the blocks: the final norm's fp32 input and output, lm_head's
    input (a bf16 cast of its own under autocast) and the loss's fp32 log-softmax over the vocabulary."""
    h = s.hidden
    return 8 * h + (4 * h if compute == 4 else 2 * h) + 4 * s.vocab


def saved_bytes(s: Shapes, tokens: int, compute: int) -> int:
    """What the forward of ``tokens`` tokens saves for the backward (no activation checkpointing)."""
    return tokens * (s.layers * block_bytes_per_token(s, compute) + head_bytes_per_token(s, compute))


def activation_bytes(s: Shapes, tokens: int, compute: int, checkpointing: bool) -> int:
    """Activation memory at its peak, the start of the backward: what the forward saved and the
    loss's gradients over the vocabulary. With activation checkpointing a block keeps only its fp32
    input, and the backward recomputes one block's activations at a time."""
    blocks = (s.layers * 4 * s.hidden + block_bytes_per_token(s, compute) if checkpointing
              else s.layers * block_bytes_per_token(s, compute))
    return tokens * (blocks + head_bytes_per_token(s, compute) + LOSS_GRADIENTS * s.vocab)


@dataclass(frozen=True)
class Estimate:
    shapes: Shapes
    hardware: Hardware
    compute: int  # bytes of the compute dtype: 2 (bf16 autocast) or 4 (fp32)
    micro_batch: tuple[int, int]  # (sequences, seq_len) per forward pass and process
    global_batch: int  # sequences per optimizer step, all processes together
    state: dict[str, int]  # row label -> bytes per process that do not depend on the batch
    activations: dict[bool, int]  # activation_checkpointing -> activation bytes per process
    checkpointing: bool  # the recipe's activation_checkpointing

    def total(self, checkpointing: bool) -> int:
        return sum(self.state.values()) + self.activations[checkpointing]

    def fits(self, checkpointing: bool) -> bool:
        return self.total(checkpointing) <= USABLE * self.hardware.memory

    @property
    def step_tokens(self) -> int:
        return self.global_batch * self.micro_batch[1]

    @property
    def flops(self) -> int:
        """6N per token (forward 2N, backward 4N), N the parameters that multiply (no lookup table)."""
        return 6 * (self.shapes.parameters - self.shapes.lookup_parameters) * self.step_tokens

    @property
    def attention_flops(self) -> int:
        """The attention's own FLOPs per step: 12 x layers x (heads x head_dim) x seq_len per token
        (QK^T and AV, forward and backward, the causal half not subtracted: PaLM's convention)."""
        return 12 * self.shapes.layers * self.shapes.q_dim * self.micro_batch[1] * self.step_tokens


def estimate_recipe(recipe_file, overrides=(), options: EstimateOptions | None = None, **settings) -> Estimate:
    """``mixln-convert estimate``: what the recipe (a file, or a shipped recipe's name) with its
    ``overrides`` ('key=value') costs on the hardware :func:`choose_hardware` picks from ``options``
    (an EstimateOptions, or its fields as ``settings``)."""
    recipe = load_recipe(recipe_file, overrides, reads_data=False)  # the model's shapes, no data
    hardware = choose_hardware(sized_for(recipe_path(recipe_file)), options, **settings)
    return estimate(recipe, hardware, model_shapes(recipe.source))


def estimate(recipe: Recipe, hardware: Hardware, shapes: Shapes) -> Estimate:
    """The memory per process and the compute per step of ``recipe`` (loaded by ``load_recipe``)."""
    n, p = shapes.parameters, hardware.processes
    # 2 for bf16 autocast, 4 for fp32: a recipe's ``precision: auto`` is bf16 on a GPU, fp32 on CPU
    compute = 2 if recipe.precision == "bf16" or (recipe.precision == "auto" and hardware.device == "gpu") else 4
    sharded = p if hardware.parallelism == "fsdp" else 1
    share = "" if sharded == 1 else f", 1/{p} each"
    state = {f"weights (fp32 masters{share})": 4 * n // sharded,
             f"gradients (fp32{share})": 4 * n // sharded,
             f"AdamW moments (2 x fp32{share})": 8 * n // sharded}
    if hardware.parallelism == "ddp":
        state["DDP gradient buckets (fp32)"] = 4 * n
    if hardware.parallelism == "fsdp":
        gathered = n - shapes.layers * shapes.block_parameters + 2 * shapes.block_parameters
        state["FSDP gathered: root unit and 2 blocks, weights and fp32 gradients"] = (compute + 4) * gathered
    elif compute == 2:
        state["bf16 weight copies (autocast)"] = 2 * shapes.matmul_parameters
    tokens = recipe.micro_batch_size * recipe.seq_len
    return Estimate(shapes, hardware, compute, (recipe.micro_batch_size, recipe.seq_len),
                    recipe.global_batch_size, state,
                    {ac: activation_bytes(shapes, tokens, compute, ac) for ac in (False, True)},
                    recipe.activation_checkpointing)


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f}"


def report(e: Estimate) -> str:
    """The estimate as a Markdown table (GB = 10^9 bytes, per process) and a last line that starts
    with the verdict, "fits" or "does not fit", for the recipe's activation_checkpointing."""
    s, hw = e.shapes, e.hardware
    sequences, seq_len = e.micro_batch
    ours = {ac: " (the recipe's)" if ac == e.checkpointing else "" for ac in (False, True)}
    lines = [
        f"model: {s.name}, {s.parameters:,} parameters, {s.layers} blocks, hidden {s.hidden}, "
        f"intermediate {s.intermediate}, vocabulary {s.vocab}",
        f"hardware: {hw}; {'bf16 autocast' if e.compute == 2 else 'fp32'}, micro-batch {sequences} x {seq_len} = "
        f"{sequences * seq_len:,} tokens per process",
        "",
        f"| GB per process | activation_checkpointing: false{ours[False]} | true{ours[True]} |",
        "|---|---:|---:|",
        *(f"| {label} | {_gb(size)} | {_gb(size)} |" for label, size in e.state.items()),
        f"| activations | {_gb(e.activations[False])} | {_gb(e.activations[True])} |",
        f"| **total** | **{_gb(e.total(False))}** | **{_gb(e.total(True))}** |",
        "",
        f"tokens per optimizer step: {e.step_tokens:,} ({e.global_batch} sequences x {seq_len})",
        f"FLOPs per optimizer step: {e.flops:.3e} (6N per token, N = {s.parameters - s.lookup_parameters:,} "
        f"parameters in matmuls); {e.flops + e.attention_flops:.3e} with attention "
        f"(+ 12 x {s.layers} layers x {s.q_dim} x {seq_len} per token)",
    ]
    usable = f"{_gb(USABLE * hw.memory)} GB usable ({USABLE:.0%} of {hw.memory / 1e9:g} GB) per {hw.device.upper()}"
    verdict = (f"{'fits' if e.fits(e.checkpointing) else 'does not fit'}: {_gb(e.total(e.checkpointing))} GB per "
               f"process of {usable}, activation_checkpointing: {str(e.checkpointing).lower()}")
    if not e.fits(e.checkpointing) and not e.checkpointing and e.fits(True):
        verdict += f"; with activation_checkpointing: true it fits ({_gb(e.total(True))} GB)"
    return "\n".join([*lines, verdict])
