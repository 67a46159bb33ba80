"""The commands' options, torch-free: the fixed choices and defaults, the one evaluation definition,
and a typed dataclass of each command's options, checked when made (the CLI makes one before torch
is imported) and giving the CLI its defaults."""

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from .errors import MixLNError
from .limits import (MAX_PROCESSES, check_alpha_count, check_batch_size, check_choice, check_fraction, check_limit,
                     check_nonnegative, check_one_step, check_positive, check_positive_float, check_processes,
                     check_seed, check_seeds, check_spike_factor, check_task_count, check_tokens, is_number,
                     parse_size)

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
# conversion/converter.py: Mix-LN (the first blocks Post-LN) or LayerNorm Scaling (architectures/__init__.py)
LAYOUTS = ("mixln", "lns")
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # conversion output dtypes
# workflows/train.py's training arms: the converted Mix-LN model, the Pre-LN control, the LNS retrofit
ARMS = ("mixln", "preln", "lns")
DEFAULT_ARMS = ("mixln", "preln")


def arms_ok(arms) -> bool:
    """Distinct names of ARMS, at least one (a string is a name, not a list of them)."""
    return not isinstance(arms, str) and bool(arms) and set(arms) <= set(ARMS) and len(set(arms)) == len(arms)
METHODS = ("angular", "drop", "last")  # analysis/choice.py: how N blocks to remove are chosen
LOSSES = ("kl", "residual")  # healing/losses.py
HEAL_DTYPES = ("fp32", "bf16")  # healing/: of the frozen weights (the trained blocks stay float32)
# The heal's peak learning rate: 1e-4 diverged on SmolLM2-135M's calibrated conversion (README).
HEAL_LR = 3e-5
HEAL_SEQ_LEN, HEAL_BATCH_SIZE = 256, 4  # healing/: a step of 4 x 256 tokens
HEAL_TOKENS = 65_536  # healing/: 64 steps
HEAL_LOSS, HEAL_DTYPE = "kl", "fp32"  # healing/: the defaults of LOSSES and HEAL_DTYPES

ALPHA = 0.25  # conversion/layout.py: the share of leading blocks made Post-LN unless told otherwise
# conversion/converter.py's calibrated gains. Short windows fit better (docs/measurements.md): each
# window's first positions carry the massive activations, and short windows give the fit more of them.
CALIBRATION_TOKENS, CALIBRATION_SEQ_LEN = 8192, 128
PRUNE_SEQ_LEN, PRUNE_TOKENS = 256, 8 * 256  # surgery/prune.py: the windows --method angular/drop measure
BATCH_SIZE = 4  # windows per forward pass of a measurement (eval, analyze, prune)
MAX_SHARD_SIZE = "5GB"  # the largest output shard a heal or prune writes, and a conversion's cap
SHARD_TOKENS = 2**25  # data/tokenization.py: 32M tokens, 64 MiB of uint16 a shard
VALIDATION_FRACTION = 0.01  # data/tokenization.py: the documents held out, by content hash
# workflows/sweep.py: the Post-LN ratios tried, and the rule's limits on perplexity and gradient ratio
SWEEP_ALPHAS = (0.0, 0.0625, 0.125, 0.25, 0.5)
MAX_PPL_INCREASE, MAX_GRAD_RATIO = 0.10, 3.0
PRECISIONS = ("auto", "bf16", "fp32")  # training: auto is bf16 autocast on GPU, fp32 on CPU
# training: transformers' attention implementations; eager is the plain matmul-softmax one, the
# reference to rerun a non-finite bf16 step against (benchmarks/gpu_mission.py)
ATTENTIONS = ("sdpa", "eager")
TRAINING_STRATEGIES = ("single", "ddp", "fsdp")  # training/memory.py: one process, replicated, sharded
DEVICES = ("gpu", "cpu")  # training/memory.py: what a recipe's hardware is

# The one evaluation definition: every perplexity the tool reports is measured on the first EVAL_TOKENS
# tokens of the held-out text in packed windows of EVAL_SEQ_LEN unless a flag or recipe key says
# otherwise, and each result records the data, token count and window length it used.
EVAL_DATA = "embedded:validation"
EVAL_SEQ_LEN = 256  # the paper's sequence length; short enough for 2 CPU cores
EVAL_TOKENS = 8192  # 32 windows: enough for a bootstrap interval, and quick on CPU
STUDY_EVAL_TOKENS = 8 * EVAL_SEQ_LEN  # study's analyses: one per arm, scheme and seed, so fewer tokens each


def measured_on(where: dict) -> str:
    """What a figure was measured on, from a result's {data, tokens (scored), seq_len}, in one wording for the
    console, the report and the model cards: 'DATA, 8 windows of 256 = 2,048 tokens, 2,040 scored'. A window
    of S tokens scores S - 1 next-token predictions (its first token has nothing before it), so both counts
    are said; a count that is no whole number of windows reads 'DATA, N tokens scored in windows of S'."""
    seq_len, tokens = where.get("seq_len"), where.get("tokens")
    if not (isinstance(seq_len, int) and seq_len > 1 and isinstance(tokens, int) and tokens > 0
            and tokens % (seq_len - 1) == 0):
        return f"{where['data']}, {tokens:,} tokens scored in windows of {seq_len}"
    windows = tokens // (seq_len - 1)
    return (f"{where['data']}, {windows:,} window{'s' if windows > 1 else ''} of {seq_len} = {windows * seq_len:,} "
            f"tokens, {tokens:,} scored")


# The demo's budget (2 CPU cores, minutes): a heal of 16 steps (most of the gap closes by then; README),
# 8 optimizer steps of the CPU recipe per arm, every stage measured on the same 8 windows.
DEMO_HEAL_TOKENS = 16 * HEAL_BATCH_SIZE * HEAL_SEQ_LEN
DEMO_TRAIN_TOKENS = 8 * 4 * 256
DEMO_EVAL_TOKENS = 8 * EVAL_SEQ_LEN
# The demo trains at the heal's lr rather than the CPU recipe's: the higher the lr, the more the
# healed Mix-LN arm learns its way back into loops (benchmarks/demo_lr.py, README)
DEMO_LR = HEAL_LR


class Options:
    """A command's typed options: the CLI's defaults are its fields', making one checks it (each error
    naming the flag), and the command's API function takes one or its fields as keyword arguments."""

    @classmethod
    def given(cls, options=None, settings: dict | None = None):
        """``options`` (default: the defaults) with the fields in ``settings`` replaced, checked again."""
        if options is None:
            return cls(**(settings or {}))
        return dataclasses.replace(options, **settings) if settings else options


class ShardSized:
    """Options that write a checkpoint: ``max_shard_size`` ('5GB', or bytes) in bytes (None: the command's)."""

    @property
    def max_shard_bytes(self) -> int | None:
        return None if self.max_shard_size is None else parse_size(self.max_shard_size)


@dataclass(kw_only=True)
class HealSettings:
    """The settings of a heal's training that a recipe's ``heal`` section holds too: healing/run.py's
    HealRun and training/recipe.py's Heal both extend this (spike_factor: as the recipe's guard)."""
    tokens: int = HEAL_TOKENS
    seq_len: int = HEAL_SEQ_LEN
    batch_size: int = HEAL_BATCH_SIZE
    lr: float = HEAL_LR
    loss: str = HEAL_LOSS
    activation_checkpointing: bool = False
    spike_factor: float = 0.0


@dataclass(kw_only=True)
class HealOptions(Options, HealSettings, ShardSized):
    """``mixln-convert heal``'s options (healing/run.py's HealRun adds the models and the output): ``data``
    a text path (the API also takes documents or tokens), measured on ``eval_tokens`` of ``eval_data``
    before, after and at each token count in ``eval_at`` (with ``perplexity`` the whole model's too)."""
    data: object = None
    dtype: str = HEAL_DTYPE
    warmup_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_tokens: int = EVAL_TOKENS
    eval_data: str | None = None
    perplexity: bool = True
    eval_at: tuple = ()
    max_shard_size: str | int = MAX_SHARD_SIZE
    seed: int = 0

    def __post_init__(self):
        check_choice("--loss", self.loss, LOSSES)
        check_choice("--dtype", self.dtype, HEAL_DTYPES)
        check_positive("--seq-len", self.seq_len)
        check_batch_size("--batch-size", self.batch_size)
        check_tokens("--tokens", self.tokens)
        check_tokens("--eval-tokens", self.eval_tokens)
        for tokens in self.eval_at:  # the API's: validation once this many tokens are trained
            check_tokens("eval_at", tokens)
        check_positive_float("--lr", self.lr)
        check_fraction("warmup_ratio", self.warmup_ratio, high_open=True)
        check_nonnegative("grad_clip", self.grad_clip)
        check_spike_factor("--spike-factor", self.spike_factor)
        check_seed(self.seed)
        check_one_step(self.tokens, self.batch_size, self.seq_len)
        parse_size(self.max_shard_size)  # refused now, not at the writer (None too: only convert has a default)


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(Options, ShardSized):
    """``mixln-convert convert``'s options (conversion/converter.py). ``alpha`` None: ``post_ln_layers``,
    else ALPHA. The calibration options apply to the calibrated strategy of a Mix-LN layout only."""
    alpha: float | None = None
    post_ln_layers: int | None = None
    layout: str = "mixln"
    strategy: str = "calibrated"
    scaled_init: bool = True
    calibration_data: str | None = None
    calibration_tokens: int = CALIBRATION_TOKENS
    calibration_seq_len: int = CALIBRATION_SEQ_LEN
    max_shard_size: str | int | None = None  # None: the source's largest shard, at most MAX_SHARD_SIZE
    dtype: str | None = None  # one of DTYPES; None: the source's
    seed: int = 0

    def __post_init__(self):
        check_choice("--layout", self.layout, LAYOUTS)
        check_choice("--strategy", self.strategy, STRATEGIES)
        check_choice("--dtype", self.dtype, (None, *DTYPES))
        if self.alpha is not None and self.post_ln_layers is not None:
            raise MixLNError("--alpha and --post-ln-layers are exclusive: give one")
        if self.alpha is not None and not (is_number(self.alpha) and 0.0 <= self.alpha <= 1.0):
            raise MixLNError(f"--alpha: {self.alpha} is outside [0, 1]")
        if self.post_ln_layers is not None:
            check_tokens("--post-ln-layers", self.post_ln_layers, zero_ok=True)
        check_positive("--calibration-seq-len", self.calibration_seq_len)
        check_tokens("--calibration-tokens", self.calibration_tokens)
        check_seed(self.seed)
        self.max_shard_bytes  # parsed: a bad size is refused when the options are made
        if self.lns:
            for flag, value in (("--alpha", self.alpha), ("--post-ln-layers", self.post_ln_layers)):
                if value is not None:
                    raise MixLNError(f"{flag}: --layout lns makes no block Post-LN (it scales every Pre-LN block's "
                                     "norms); leave it out")
            if self.strategy not in ("calibrated", "scratch"):  # calibrated: the default, which is exact here
                raise MixLNError(f"--strategy {self.strategy}: --layout lns has no Post-LN block for it to convert; "
                                 "leave --strategy out (the conversion is exact) or give scratch")
        if self.strategy != "calibrated" or self.lns:  # a user who names a file or a number expects it used
            why = ("--layout lns has no Post-LN block to calibrate" if self.lns
                   else f"only --strategy calibrated reads it, not {self.strategy}")
            for name in ("calibration_data", "calibration_tokens", "calibration_seq_len"):
                if getattr(self, name) != getattr(ConvertOptions, name):
                    raise MixLNError(f"--{name.replace('_', '-')}: {why}; this run would ignore it")

    @property
    def lns(self) -> bool:
        """Whether this is a LayerNorm Scaling conversion (architectures/__init__.py) rather than Mix-LN."""
        return self.layout == "lns"


@dataclass(frozen=True, kw_only=True)
class Measurement(Options):
    """Text a model is measured on: ``max_tokens`` tokens of ``data`` (a path; None: the command's
    embedded split) in packed windows of ``seq_len``, ``batch_size`` windows a forward pass."""
    data: str | None = None
    seq_len: int = EVAL_SEQ_LEN
    max_tokens: int = EVAL_TOKENS
    batch_size: int = BATCH_SIZE

    def __post_init__(self):
        check_positive("--seq-len", self.seq_len)
        check_tokens("--max-tokens", self.max_tokens)
        check_batch_size("--batch-size", self.batch_size)


@dataclass(frozen=True, kw_only=True)
class EvalOptions(Measurement):
    """``mixln-convert eval``'s options (evaluation/perplexity.py): the packed perplexity, or with ``tasks``
    lm-eval tasks instead (at most ``limit`` examples each; ``include_path``: a folder of task YAML files)."""
    TASKS_FLAG: ClassVar[str] = "--tasks"
    allow_longer: bool = False
    per_document: bool = False
    generate: bool = False
    tasks: tuple[str, ...] = ()
    include_path: str | None = None
    limit: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.tasks is None or isinstance(self.tasks, str):  # an API caller's None or "a,b": as the CLI reads it
            object.__setattr__(self, "tasks", parse_tasks(self.tasks) if self.tasks is not None else ())
        if not all(isinstance(name, str) and name.strip() for name in self.tasks):
            raise MixLNError(f"{self.TASKS_FLAG}: {','.join(map(str, self.tasks))!r} holds an empty task name "
                             "(give NAME[,NAME...])")
        check_task_count(self.TASKS_FLAG, self.tasks)
        check_limit("--limit", self.limit)
        if not self.tasks and (self.include_path is not None or self.limit is not None):
            raise MixLNError(f"--include-path and --limit go with {self.TASKS_FLAG}")


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(EvalOptions):
    """``mixln-convert analyze``'s options (analysis/analyze.py): EvalOptions' (``tasks``: the layer drop
    on each task's metric), with ``layer_sweep`` the per-block measures, with ``prune_curve`` the
    perplexity with N = 1..L/2 blocks removed by ``method``."""
    TASKS_FLAG: ClassVar[str] = "--task"
    span: int = 1
    layer_sweep: bool = True
    prune_curve: bool = False
    method: str = "angular"

    def __post_init__(self):
        super().__post_init__()
        check_positive("--span", self.span)
        check_choice("--method", self.method, METHODS)
        if not self.layer_sweep and (self.prune_curve or self.tasks):
            raise MixLNError(f"{'--prune-curve' if self.prune_curve else '--task'} ranks or drops blocks by the layer "
                             "sweep, which --no-layer-sweep skips")


@dataclass(frozen=True, kw_only=True)
class PruneOptions(Measurement, ShardSized):
    """``mixln-convert prune``'s options (surgery/prune.py): either ``layers`` names the blocks to
    remove ('20-23,27'), or ``remove`` blocks are chosen by ``method`` (angular and drop measure the
    model on the Measurement's text, default the embedded calibration split)."""
    seq_len: int = PRUNE_SEQ_LEN
    max_tokens: int = PRUNE_TOKENS
    layers: str | None = None
    remove: int | None = None
    method: str = "angular"
    max_shard_size: str | int = MAX_SHARD_SIZE

    def __post_init__(self):
        super().__post_init__()
        if (self.layers is None) == (self.remove is None):
            raise MixLNError("--layers and --remove: give exactly one of them")
        if self.remove is not None:
            check_positive("--remove", self.remove)
        check_choice("--method", self.method, METHODS)
        parse_size(self.max_shard_size)  # refused now, not at the writer (None too: only convert has a default)


@dataclass(frozen=True, kw_only=True)
class TokenizeOptions(Options):
    """``mixln-convert tokenize``'s options (data/tokenization.py): ``num_proc`` 0 is one process per core
    for text over 16 MiB; shards of ``shard_tokens`` cut to whole windows of ``seq_len`` (None: any)."""
    validation: str | None = None
    validation_fraction: float = VALIDATION_FRACTION
    num_proc: int = 0
    seq_len: int | None = None
    shard_tokens: int = SHARD_TOKENS

    def __post_init__(self):
        check_fraction("--validation-fraction", self.validation_fraction, low_open=True, high_open=True)
        check_tokens("--num-proc", self.num_proc, zero_ok=True)
        if self.num_proc:
            check_processes("--num-proc", self.num_proc)
        check_tokens("--shard-tokens", self.shard_tokens)
        if self.seq_len is not None:
            check_positive("--seq-len", self.seq_len)
            if self.seq_len > self.shard_tokens:
                raise MixLNError(f"--seq-len {self.seq_len} is more than --shard-tokens {self.shard_tokens}")


@dataclass(frozen=True, kw_only=True)
class EstimateOptions(Options):
    """The hardware ``mixln-convert estimate`` sizes a recipe for (training/memory.py), each None where
    the recipe's "Sized for" comment (else one 80 GB GPU) decides; ``memory`` of each process."""
    processes: int | None = None
    strategy: str | None = None
    device: str | None = None
    memory: str | None = None

    def __post_init__(self):
        if self.processes is not None and not (type(self.processes) is int and 1 <= self.processes <= MAX_PROCESSES):
            raise MixLNError(f"--processes: must be an integer in [1, {MAX_PROCESSES}], got {self.processes!r}")
        check_choice("--strategy", self.strategy, (None, *TRAINING_STRATEGIES))
        check_choice("--device", self.device, (None, *DEVICES))
        self.memory_bytes  # parsed: a bad size is refused when the options are made

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_size(self.memory, "--memory")


@dataclass(frozen=True, kw_only=True)
class CompareOptions(Options):
    """``mixln-convert compare``'s options (report/compare.py): a name for each input in order (default:
    folder names), and whether analyses with different tokenizers are compared (warning) or refused."""
    labels: tuple[str, ...] = ()  # checked against the inputs, one per input (report/inputs.py)
    allow_mismatch: bool = False


@dataclass(frozen=True, kw_only=True)
class SweepOptions(Options):
    """What ``mixln-convert sweep`` measures (workflows/sweep.py): per alpha a calibrated conversion, a heal and a
    training (``heal_tokens``, ``train_tokens`` 0: none); ``lns``: the LNS retrofit trained like the control."""
    alphas: tuple[float, ...] = SWEEP_ALPHAS
    heal_tokens: int = 0
    train_tokens: int = 0
    data: str | None = None
    seeds: int = 1
    eval_tokens: int = EVAL_TOKENS
    max_ppl_increase: float = MAX_PPL_INCREASE
    max_grad_ratio: float = MAX_GRAD_RATIO
    lns: bool = False

    def __post_init__(self):
        if not self.alphas:
            raise MixLNError("--alphas: give at least one alpha")
        check_alpha_count("--alphas", self.alphas)
        for alpha in self.alphas:
            check_fraction("--alphas", alpha)
        check_seeds("--seeds", self.seeds)
        check_tokens("--eval-tokens", self.eval_tokens)
        check_tokens("--heal-tokens", self.heal_tokens, zero_ok=True)
        check_tokens("--train-tokens", self.train_tokens, zero_ok=True)
        check_nonnegative("--max-ppl-increase", self.max_ppl_increase)
        check_nonnegative("--max-grad-ratio", self.max_grad_ratio)
        if self.max_grad_ratio < 1:
            raise MixLNError(f"--max-grad-ratio: must be at least 1, got {self.max_grad_ratio!r}")
        if self.lns and not self.train_tokens:
            raise MixLNError("--lns: the LNS retrofit computes the original's function, so only training tells them "
                             "apart; add --train-tokens N")
        if self.heal_tokens:
            check_one_step(self.heal_tokens, HEAL_BATCH_SIZE, HEAL_SEQ_LEN, "--heal-tokens", None, "one heal step")


def parse_alphas(text: str) -> tuple[float, ...]:
    """'0,0.0625,0.25' -> (0.0, 0.0625, 0.25), each a finite number in [0, 1]."""
    alphas = []
    for item in text.split(","):
        try:
            alpha = float(item)
        except ValueError:
            alpha = math.nan
        if not 0 <= alpha <= 1:  # nan fails too
            raise MixLNError(f"--alphas: {item.strip()!r} is not a number in [0, 1]")
        alphas.append(alpha)
    return tuple(alphas)


def parse_tasks(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'); a name given twice runs once (EvalOptions refuses an empty one)."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",")))


STUDY_RECIPE = "smollm2-135m-cpu"  # shipped; a study overrides source, conversion and seed
STUDY_SCHEMES = {"scaled": True, "plain": False}  # a study's initialization scheme -> conversion.scaled_init


@dataclass(frozen=True, kw_only=True)
class StudyOptions(Options):
    """What ``mixln-convert study`` trains (workflows/study.py): ``recipe`` with the ``overrides`` (``--set`` items),
    ``seeds`` seeds of each scheme in ``schemes``, the Mix-LN arm at ``alpha`` beside Pre-LN (with
    ``post_ln`` and ``lns`` those arms too), each final model analyzed on ``eval_tokens``."""
    recipe: str = STUDY_RECIPE
    overrides: tuple[str, ...] = ()
    alpha: float = ALPHA
    seeds: int = 2
    schemes: tuple[str, ...] = tuple(STUDY_SCHEMES)
    post_ln: bool = True
    lns: bool = False
    eval_tokens: int = STUDY_EVAL_TOKENS

    def __post_init__(self):
        check_seeds("--seeds", self.seeds)
        check_tokens("--eval-tokens", self.eval_tokens)
        if not (is_number(self.alpha) and 0 < self.alpha < 1):
            raise MixLNError(f"--alpha: {self.alpha} is not in (0, 1): the Mix-LN arm needs Post-LN and Pre-LN "
                             "blocks")
        unknown = [s for s in self.schemes if s not in STUDY_SCHEMES]
        if unknown or not self.schemes:
            raise MixLNError(f"--init: unknown scheme {unknown[0] if unknown else '(none)'!r} (choose from "
                             f"{', '.join(STUDY_SCHEMES)})")
        twice = [s for i, s in enumerate(self.schemes) if s in self.schemes[:i]]
        if twice:  # its runs would share one folder
            raise MixLNError(f"--init: {twice[0]!r} is given twice")


@dataclass(frozen=True, kw_only=True)
class DemoOptions(Options):
    """What ``mixln-convert demo`` runs (workflows/demo.py): ``source`` (None: SmolLM2-135M) converted at ``alpha``,
    healed on ``heal_tokens`` (0: no heal), both arms trained on ``train_tokens``."""
    source: str | None = None
    alpha: float = ALPHA
    heal_tokens: int = DEMO_HEAL_TOKENS
    train_tokens: int = DEMO_TRAIN_TOKENS
    eval_tokens: int = DEMO_EVAL_TOKENS
    prune_curve: bool = True

    def __post_init__(self):
        check_fraction("--alpha", self.alpha)
        check_tokens("--heal-tokens", self.heal_tokens, zero_ok=True)
        if self.heal_tokens:
            check_one_step(self.heal_tokens, HEAL_BATCH_SIZE, HEAL_SEQ_LEN, "--heal-tokens", None, "one heal step")
        check_tokens("--train-tokens", self.train_tokens)
        check_tokens("--eval-tokens", self.eval_tokens)
