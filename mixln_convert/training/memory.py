"""What a training recipe costs, known before any weight is loaded: the model is built from its
config alone on the meta device, and the parameter count, per-process memory and FLOPs per optimizer
step follow from its shapes, the recipe and the hardware.

Memory per process: fp32 master weights, gradients and AdamW's two moments, whole in every process
(single, DDP) or a 1/processes shard each (FSDP); DDP's gradient buckets (torch's default
``gradient_as_bucket_view=False`` copies each gradient into the bucket it all-reduces); without FSDP,
the bf16 copy of every matmul weight that autocast makes; with it, the parameters gathered for
compute (the root unit and two blocks: the one computing, the one prefetched) with their fp32
gradients; and the activations (:func:`block_bytes_per_token`, :func:`head_bytes_per_token`).

A run fits when this is at most ``USABLE`` of the device's memory; the rest is for what is not
counted: the CUDA context, NCCL buffers, the allocator's fragmentation, and AdamW's temporaries at
the optimizer step, taken after the activations are freed.

The heal of the Mix-LN arm runs before training and has a peak of its own (:func:`heal_estimate`):
the frozen teacher and student in the heal's dtype, sharing what the conversion left equal, and the
trained Post-LN blocks as fp32 masters with their gradients and AdamW's moments, nothing sharded
unless the kl heal runs under FSDP.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures import model_blocks
from ..conversion.layout import post_ln_count
from ..errors import MixLNError
from ..healing.options import KL_CHUNK_TOKENS
from ..io.records import read_json
from ..io.loader import open_checkpoint
from ..io.validate import check_config, check_config_loads
from ..limits import MAX_PROCESSES, MAX_SIZE, parse_size
from .options import EstimateOptions
from .recipe import Recipe, load_recipe, recipe_path

USABLE = 0.9
# bytes per token and vocabulary entry that the backward adds to the saved log-softmax: the fp32
# gradients of the loss w.r.t. log-softmax's output and input, both alive at the peak
LOSS_GRADIENTS = 8
# the heal's residual loss, per token: a few fp32 hidden-width tensors (the teacher's stream, the
# difference, its square; their gradients in the backward)
RESIDUAL_LOSS_STREAMS = 4
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
        raise MixLNError(f"{options.flag('parallelism')} single runs one process, not {processes} (ddp or fsdp for "
                         "several)")
    memory = stated.memory if options.memory is None else parse_size(options.memory, options.flag("memory"))
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


def block_bytes_per_token(s: Shapes, compute: int, frozen: bool = False) -> int:
    """Bytes a Pre-LN LLaMA block saves for its backward, per token (a Post-LN block as much); ``compute``:
    2 under bf16 autocast, 4 in fp32. Korthikanti et al. 2022's count (section 4.1) redone for RMSNorm,
    SwiGLU and SDPA/flash attention (no seq_len x seq_len scores); tests/test_memory.py checks it against
    autograd. ``frozen``: a block without trainable weights that the gradient still crosses: no weight
    needs its matmuls' inputs or its norms' outputs."""
    h, c = s.hidden, compute
    attention = c * (2 * s.q_dim + 2 * s.kv_dim) + 4 * s.heads  # q, output, k, v; fp32 logsumexp per head
    if frozen:  # the norms' fp32 inputs; gate, silu(gate) and up
        return 2 * 4 * h + attention + 3 * c * s.intermediate
    norms = 2 * (4 * h + 4 * h)  # each RMSNorm keeps its fp32 input and normalized output
    # the projections' inputs: in fp32 the norms' outputs (q/k/v share one, gate/up the other);
    # under autocast each of q, k, v, gate and up saves a bf16 cast of its own
    projection_inputs = 2 * 4 * h if c == 4 else 5 * 2 * h
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


def heal_activation_bytes(s: Shapes, trained: int, tokens: int, compute: int, kl: bool, checkpointing: bool,
                          chunked: bool = True) -> int:
    """A heal step's activation memory at its peak, ``trained`` the Post-LN blocks it trains.

    ``residual`` runs the student's prefix and the loss's few fp32 streams. ``kl`` runs the whole student
    (its frozen blocks keep less), and its peak is the loss: the final norm's fp32 input, both models'
    logits and five fp32 [tokens, vocab] tensors (both log-softmaxes; kl_div's exp(target), target - input
    and their product). With activation checkpointing each block keeps its fp32 input and the backward
    recomputes one block at a time; ChunkedKL holds those five tensors for KL_CHUNK_TOKENS positions only,
    unless not ``chunked`` (a sharded heal, whose models are entered through their roots only)."""
    h, block = s.hidden, block_bytes_per_token(s, compute)
    if not kl:
        blocks = trained * 4 * h + block if checkpointing else trained * block
        return tokens * (blocks + RESIDUAL_LOSS_STREAMS * 4 * h)
    frozen = block_bytes_per_token(s, compute, frozen=True)
    if not checkpointing:
        return tokens * (trained * block + (s.layers - trained) * frozen + 4 * h + (2 * compute + 20) * s.vocab)
    held = s.layers * 4 * h
    loss = (tokens * (held + 3 * 4 * h) + min(tokens, KL_CHUNK_TOKENS) * 20 * s.vocab if chunked
            else tokens * (held + 4 * h + (2 * compute + 20) * s.vocab))
    # the deepest frozen block, with every input held, or the last trained one, with its own and those
    # before it; beside it, its backward's gradients: the MLP's three intermediates' and the stream's
    recompute = tokens * (max(held + frozen, trained * 4 * h + block) + 3 * compute * s.intermediate + 2 * 4 * h)
    return max(loss, recompute)


@dataclass(frozen=True)
class Memory:
    """Bytes per process: ``state`` (row label -> bytes), ``activations`` (activation_checkpointing -> bytes)."""
    hardware: Hardware
    state: dict[str, int]
    activations: dict[bool, int]
    checkpointing: bool
    compute: int  # bytes of the compute dtype (and of a heal's frozen weights): 2 (bf16) or 4 (fp32)

    def total(self, checkpointing: bool) -> int:
        return sum(self.state.values()) + self.activations[checkpointing]

    def fits(self, checkpointing: bool) -> bool:
        return self.total(checkpointing) <= USABLE * self.hardware.memory


@dataclass(frozen=True)
class HealEstimate(Memory):
    """The heal of the recipe's Mix-LN arm, before it trains: its first ``blocks`` blocks distilled with ``loss``."""
    loss: str
    blocks: int
    windows: tuple[int, int]  # windows per step: (per process, all processes together)
    seq_len: int
    steps: int
    matmul_parameters: tuple[int, int]  # (N, N_k): in the matmuls a step runs through, in the trained blocks'

    @property
    def step_tokens(self) -> int:
        return self.windows[1] * self.seq_len

    @property
    def flops_per_token(self) -> int:
        """The teacher's forward 2N, the student's 2N, the backward's activation gradients through the student
        ~2N and the trained blocks' weight gradients 2N_k; with checkpointing one more forward of the student."""
        n, n_k = self.matmul_parameters
        return 2 * (3 + self.checkpointing) * n + 2 * n_k


@dataclass(frozen=True)
class Estimate(Memory):
    shapes: Shapes
    micro_batch: tuple[int, int]  # (sequences, seq_len) per forward pass and process
    global_batch: int  # sequences per optimizer step, all processes together
    heal: HealEstimate | None = None  # None: the recipe heals nothing

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
    ``overrides`` ('key=value') costs on the hardware :func:`choose_hardware` picks."""
    recipe = load_recipe(recipe_file, overrides, reads_data=False)  # the model's shapes, no data
    hardware = choose_hardware(sized_for(recipe_path(recipe_file)), options, **settings)
    return estimate(recipe, hardware, model_shapes(recipe.source))


def estimate(recipe: Recipe, hardware: Hardware, shapes: Shapes) -> Estimate:
    """The memory per process and the compute per step of ``recipe`` (loaded by ``load_recipe``), and of its heal."""
    n, p = shapes.parameters, hardware.processes
    compute = _compute_bytes(recipe, hardware)
    sharded = p if hardware.parallelism == "fsdp" else 1
    share = "" if sharded == 1 else f", 1/{p} each"
    state = {f"weights (fp32 masters{share})": 4 * n // sharded,
             f"gradients (fp32{share})": 4 * n // sharded,
             f"AdamW moments (2 x fp32{share})": 8 * n // sharded}
    if hardware.parallelism == "ddp":
        state["DDP gradient buckets (fp32)"] = 4 * n
    if hardware.parallelism == "fsdp":
        gathered = n - (shapes.layers - 2) * shapes.block_parameters  # the root unit and two blocks
        state["FSDP gathered: root unit and 2 blocks, weights and fp32 gradients"] = (compute + 4) * gathered
    elif compute == 2:
        state["bf16 weight copies (autocast)"] = 2 * shapes.matmul_parameters
    tokens = recipe.micro_batch_size * recipe.seq_len
    return Estimate(hardware, state, {ac: activation_bytes(shapes, tokens, compute, ac) for ac in (False, True)},
                    recipe.activation_checkpointing, compute, shapes, (recipe.micro_batch_size, recipe.seq_len),
                    recipe.global_batch_size, heal_estimate(recipe, hardware, shapes))


def _compute_bytes(recipe: Recipe, hardware: Hardware) -> int:
    """2 for bf16 autocast, 4 for fp32: ``precision: auto`` is bf16 on a GPU, fp32 on CPU."""
    return 2 if recipe.precision == "bf16" or (recipe.precision == "auto" and hardware.device == "gpu") else 4


def heal_estimate(recipe: Recipe, hardware: Hardware, shapes: Shapes) -> HealEstimate | None:
    """The memory per process and the compute of the heal the Mix-LN arm runs before training (None:
    none). Each process runs its share of heal.batch_size windows a step over models of its own (the
    common tail held once), or under ``fsdp: true`` (kl loss) over its shards of both models."""
    heal, s = recipe.heal, shapes
    k = (read_json(Path(recipe.converted) / "config.json").get("post_ln_layers", 0) if recipe.converted
         else post_ln_count(s.layers, recipe.conversion.alpha))
    if not (heal.tokens and k and "mixln" in recipe.arms):
        return None
    compute, kl = _compute_bytes(recipe, hardware), heal.loss == "kl"
    trained = k * s.block_parameters  # their norms' few weights counted as matmul weights below
    embedding = s.vocab * s.hidden
    dtype, sharded = "bf16" if compute == 2 else "fp32", recipe.fsdp and kl  # the heal refuses fsdp otherwise
    p = hardware.processes if sharded else 1
    share = f", 1/{p} each" if sharded else ""
    if sharded:
        frozen = {f"frozen weights ({dtype}{share}): the student's and the whole teacher's":
                  compute * (2 * s.parameters - trained) // p}
    elif kl:  # the student's frozen weights and the teacher's own first k blocks (all of it after a
        # scratch conversion, which leaves nothing equal): what the two share is held once
        frozen = {f"frozen weights ({dtype}): teacher and student, whole, their common part once": compute * (
            s.parameters - trained + (s.parameters if recipe.conversion.strategy == "scratch" else trained))}
    else:  # the teacher's prefix; the student's embeddings stay fp32 (load_prefix's default)
        frozen = {f"frozen weights ({dtype}): teacher and student, embeddings and first blocks":
                  compute * (embedding + trained) + 4 * embedding}
    state = {**frozen,
             f"trained blocks ({k}): fp32 masters{share}": 4 * trained // p,
             f"gradients (fp32{share})": 4 * trained // p,
             f"AdamW moments (2 x fp32{share})": 8 * trained // p}
    if sharded:
        state["FSDP gathered: each model's root unit and 2 blocks, the student's with fp32 gradients"] = (
            (2 * compute + 4) * (s.parameters - (s.layers - 2) * s.block_parameters))
    elif compute == 2:
        state["bf16 copies of the trained blocks (autocast)"] = 2 * trained
    windows = -(-heal.batch_size // hardware.processes)  # a multiple of the processes, else train refuses it
    tokens = windows * heal.seq_len
    return HealEstimate(
        hardware, state, {ac: heal_activation_bytes(s, k, tokens, compute, kl, ac, chunked=not sharded)
                          for ac in (False, True)},
        heal.activation_checkpointing, compute, heal.loss, k, (windows, heal.batch_size), heal.seq_len,
        heal.tokens // (heal.batch_size * heal.seq_len),
        (s.parameters - s.lookup_parameters if kl else trained, trained))


def check_heal_fits(recipe: Recipe, processes: int, memory: int | None = None) -> HealEstimate | None:
    """Refuse, before any weight is loaded, a heal that would not fit ``processes`` processes on this machine:
    each the memory of the GPU it sees, else a share of the RAM (``memory``: bytes per process instead)."""
    gpu = torch.cuda.is_available()
    if memory is None:
        memory = (torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if gpu
                  else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // processes)
    parallelism = "fsdp" if recipe.fsdp else "ddp" if processes > 1 else "single"
    hardware = Hardware(processes, parallelism, "gpu" if gpu else "cpu", memory)
    heal = heal_estimate(recipe, hardware, model_shapes(recipe.source))
    if heal is None:
        return None
    if recipe.heal.batch_size % processes:
        raise MixLNError(f"heal.batch_size {recipe.heal.batch_size} is not a multiple of the {processes} processes: "
                         "each runs as many of a step's windows")
    if not heal.fits(heal.checkpointing):
        raise MixLNError(f"heal: does not fit: {_gb(heal.total(heal.checkpointing))} GB per process of "
                         f"{_usable(hardware)}, {_checkpointing(heal, 'heal.activation_checkpointing')} "
                         "(`mixln-convert estimate` has the figures; a smaller heal.batch_size needs less)")
    return heal


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f}"


def _usable(hw: Hardware) -> str:
    return f"{_gb(USABLE * hw.memory)} GB usable ({USABLE:.0%} of {hw.memory / 1e9:g} GB) per {hw.device.upper()}"


def _checkpointing(m: Memory, key: str) -> str:
    """The recipe's ``key`` (activation checkpointing), and whether turning it on alone makes ``m`` fit."""
    text = f"{key}: {str(m.checkpointing).lower()}"
    if not m.fits(m.checkpointing) and not m.checkpointing and m.fits(True):
        text += f"; with {key}: true it fits ({_gb(m.total(True))} GB)"
    return text


def _table(m: Memory, key: str) -> list[str]:
    ours = {ac: " (the recipe's)" if ac == m.checkpointing else "" for ac in (False, True)}
    return [f"| GB per process | {key}: false{ours[False]} | true{ours[True]} |",
            "|---|---:|---:|",
            *(f"| {label} | {_gb(size)} | {_gb(size)} |" for label, size in m.state.items()),
            f"| activations | {_gb(m.activations[False])} | {_gb(m.activations[True])} |",
            f"| **total** | **{_gb(m.total(False))}** | **{_gb(m.total(True))}** |"]


def _heal_lines(h: HealEstimate, s: Shapes) -> list[str]:
    windows, seq_len = h.windows[0], h.seq_len
    n, n_k = h.matmul_parameters
    flops = h.flops_per_token * h.step_tokens
    lines = [
        f"heal (the mixln arm's, before it trains): {h.loss} loss, the first {h.blocks} of {s.layers} blocks trained, "
        f"{'bf16 autocast over bf16 frozen weights' if h.compute == 2 else 'fp32'}, {windows} x {seq_len} = "
        f"{windows * seq_len:,} tokens per process and step",
        "",
        *_table(h, "heal.activation_checkpointing"),
        "",
        f"heal tokens: {h.steps * h.step_tokens:,} in {h.steps:,} steps of {h.step_tokens:,} ({h.windows[1]} windows x "
        f"{seq_len})",
        f"heal FLOPs per step: {flops:.3e}, {flops * h.steps:.3e} in all ({'8N' if h.checkpointing else '6N'} + "
        f"2N_k per token, N = {n:,} parameters in the matmuls of "
        f"{'the whole model' if h.loss == 'kl' else 'the trained blocks'}, N_k = {n_k:,} in the trained blocks')",
    ]
    if h.windows[1] % h.hardware.processes:
        lines.append(f"heal.batch_size {h.windows[1]} is not a multiple of the {h.hardware.processes} processes: "
                     "train refuses it")
    return lines


def report(e: Estimate) -> str:
    """The estimate as Markdown tables (GB per process), training's then the heal's, and a last line
    that starts with the verdict, "fits" or "does not fit" (both must fit)."""
    s, hw, h = e.shapes, e.hardware, e.heal
    sequences, seq_len = e.micro_batch
    lines = [
        f"model: {s.name}, {s.parameters:,} parameters, {s.layers} blocks, hidden {s.hidden}, "
        f"intermediate {s.intermediate}, vocabulary {s.vocab}",
        f"hardware: {hw}; {'bf16 autocast' if e.compute == 2 else 'fp32'}, micro-batch {sequences} x {seq_len} = "
        f"{sequences * seq_len:,} tokens per process",
        "",
        *_table(e, "activation_checkpointing"),
        "",
        f"tokens per optimizer step: {e.step_tokens:,} ({e.global_batch} sequences x {seq_len})",
        f"FLOPs per optimizer step: {e.flops:.3e} (6N per token, N = {s.parameters - s.lookup_parameters:,} "
        f"parameters in matmuls); {e.flops + e.attention_flops:.3e} with attention "
        f"(+ 12 x {s.layers} layers x {s.q_dim} x {seq_len} per token)",
        *(["", *_heal_lines(h, s)] if h else []),
    ]
    fits = e.fits(e.checkpointing) and (h is None or h.fits(h.checkpointing))
    verdict = (f"{'fits' if fits else 'does not fit'}: {_gb(e.total(e.checkpointing))} GB per process of "
               f"{_usable(hw)}, {_checkpointing(e, 'activation_checkpointing')}")
    if h:
        verdict += (f"; the heal {'fits' if h.fits(h.checkpointing) else 'does not fit'}: "
                    f"{_gb(h.total(h.checkpointing))} GB, {_checkpointing(h, 'heal.activation_checkpointing')}")
    return "\n".join([*lines, verdict])
