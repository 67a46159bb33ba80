"""The commands' settings, torch-free, each declared once (:func:`~mixln_convert.schema.setting`: kind,
default, help, flag): a typed dataclass of each command's options, checked when made (the CLI makes one
before torch is imported) and giving the CLI its options; the fixed choices and defaults; the one
evaluation definition."""

import dataclasses
from dataclasses import dataclass
from importlib import resources

import yaml

from .errors import MixLNError
from .export import DEFAULT_GGUF_TYPE, GGUF_TYPES
from .export import TARGETS as EXPORT_TARGETS
from .limits import MAX_ALPHAS, MAX_EXAMPLES, MAX_PROCESSES, MAX_SEEDS, MAX_TASKS, check_processes, parse_size
from .schema import (BATCH, FRACTION, NONNEGATIVE, OPEN_FRACTION, POSITIVE_NUMBER, SEED, TOKENS, TOKENS_OR_ZERO,
                     Choice, Count, Declared, Flag, Folder, Names, Number, Numbers, PathText, Size, SpikeFactor,
                     Text, Window, check_settings, check_windows, comma_list, declared, flag, flag_in, key_in, same_as,
                     setting)

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
# conversion/converter.py: Mix-LN (the first blocks Post-LN) or LayerNorm Scaling (architectures/__init__.py)
LAYOUTS = ("mixln", "lns")
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # conversion output dtypes
# workflows/train.py's training arms: the converted Mix-LN model, the Pre-LN control, the LNS retrofit
ARMS = ("mixln", "preln", "lns")
DEFAULT_ARMS = ("mixln", "preln")
METHODS = ("angular", "drop", "last")  # analysis/choice.py: how N blocks to remove are chosen
LOSSES = ("kl", "residual")  # healing/losses.py
HEAL_DTYPES = ("fp32", "bf16")  # healing/: of the frozen weights (the trained blocks stay float32)
# The window of every command that trains or measures (heal, eval, analyze, prune, a recipe) unless a flag or
# recipe key says otherwise: the paper's sequence length; short enough for 2 CPU cores
SEQ_LEN = 256
# The heal's peak learning rate: 1e-4 diverged on SmolLM2-135M's calibrated conversion (README).
HEAL_LR = 3e-5
HEAL_BETAS = (0.9, 0.999)  # healing/: AdamW's (torch's defaults); a training recipe has its own (optim.betas)
HEAL_BATCH_SIZE = 4  # healing/: a step of 4 windows of SEQ_LEN
HEAL_TOKENS = 65_536  # healing/: 64 steps
HEAL_CHECKPOINT_INTERVAL = 100  # healing/: steps; a checkpoint holds the Post-LN blocks and their AdamW state only
KL_CHUNK_TOKENS = 128  # healing/losses.py: positions whose logits a checkpointed kl heal holds at once
KL_BLOCK_ELEMENTS = 2**19  # healing/losses.py: logits the KL goes over at a time (2 MiB in float32: in cache)

ALPHA = 0.25  # conversion/layout.py: the share of leading blocks made Post-LN unless told otherwise
# conversion/converter.py's calibrated gains. Short windows fit better (docs/measurements.md): each
# window's first positions carry the massive activations, and short windows give the fit more of them.
CALIBRATION_TOKENS, CALIBRATION_SEQ_LEN = 8192, 128
PRUNE_TOKENS = 8 * SEQ_LEN  # surgery/prune.py: the windows --method angular/drop measure
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
PARALLELISMS = ("single", "ddp", "fsdp")  # training/memory.py: one process, replicated, sharded
DEVICES = ("gpu", "cpu")  # training/memory.py: what a recipe's hardware is

# The one evaluation definition: every perplexity the tool reports is measured on the first EVAL_TOKENS
# tokens of the held-out text in packed windows of SEQ_LEN unless a flag or recipe key says
# otherwise, and each result records the data, token count and window length it used.
EVAL_DATA = "embedded:validation"
EVAL_TOKENS = 8192  # 32 windows: enough for a bootstrap interval, and quick on CPU
STUDY_EVAL_TOKENS = 8 * SEQ_LEN  # study's analyses: one per arm, scheme and seed, so fewer tokens each

# The CPU recipe that demo, sweep and study train with (shipped; each overrides what it varies), its keys read
# once here for the demo's defaults and --help: the demo heals as it does, at its lr, counting in its steps
CPU_RECIPE = "smollm2-135m-cpu"
CPU_RECIPE_KEYS = yaml.safe_load((resources.files(__package__) / "recipes" / f"{CPU_RECIPE}.yaml").read_text())
CPU_STEP_TOKENS = CPU_RECIPE_KEYS["global_batch_size"] * SEQ_LEN


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


DATA_FORMATS = (".txt, .jsonl/.json/.json.gz (field 'text'), .parquet, a folder, a glob, or a Hugging Face Hub "
                "dataset ORG/NAME[:CONFIG[:SPLIT]][@REVISION] (column 'text', split train unless named). Default: "
                "the embedded corpus (general English and Python's standard-library docstrings).")
TASKS_HELP = ("lm-evaluation-harness tasks (`pip install 'lm_eval>=0.4.13'`): the shipped offline "
              "mixln_langref_ppl and mixln_langref_next (they ship with the package), lm-eval's own "
              "(e.g. hellaswag,arc_easy, from your datasets cache) or yours in --include-path.")
METHODS_HELP = ("angular (the N consecutive blocks whose input and output are closest in angle, Gromov et al.), "
                "drop (the N whose single removal costs least), last (the N deepest).")


def text(help_text: str, default=None, **declared):
    """A text setting (--data and the like): a path, folder, glob or Hub dataset (DATA_FORMATS)."""
    return setting(default, Text(), f"{help_text} {DATA_FORMATS}", metavar="PATH", **declared)


def alpha(default=ALPHA, kind=FRACTION, **declared):
    """The share of leading blocks made Post-LN, wherever a command or recipe takes it."""
    return setting(default, kind, "Fraction of leading layers made Post-LN: floor(alpha * L).", **declared)


LIMIT = Count(1, MAX_EXAMPLES)  # examples of one lm-eval task (--limit)
ARM_NAMES = Names(ARMS, noun="arm")  # distinct arms, at least one (a string is one name, not a list of them)


class Options(Declared):
    """A command's typed options: the CLI's options are made from its declared settings, making one checks
    it (each error naming the flag: each setting's range, then :meth:`check_combination` for what settings say of
    each other), and the command's API function takes one or its fields as keyword arguments."""

    def __post_init__(self):
        check_settings(self)
        self.check_combination()

    def check_combination(self) -> None:
        """Checks across settings (each setting's own range is its kind's)."""

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


# The options several commands take, each declared once in a group that the commands compose (cli.py:
# @click_options(Output)); a command's own --out (a default, a metavar) is its group's same_as of Output's.
@dataclass(frozen=True, kw_only=True)
class Output(Declared):
    """Where a command writes: ``out`` (required unless a command's group declares a default) and ``force``."""
    out: str = setting(kind=PathText(), help="Output folder.", metavar="DIR")
    force: bool = setting(False, Flag(), "Replace a non-empty output folder or an existing output file (never an "
                          "input).")


@dataclass(frozen=True, kw_only=True)
class Resume(Declared):
    resume: bool = setting(False, Flag(), "Continue the interrupted run in --out, keeping what it finished; refused "
                           "if its inputs or settings changed.")


@dataclass(frozen=True, kw_only=True)
class Overrides(Declared):
    """A recipe's keys set on the command line (training/recipe.py's load_recipe reads them)."""
    overrides: tuple[str, ...] = setting((), Text(), "Override a recipe key, dotted for nested ones, e.g. --set "
                                         "optim.lr=3e-4 (repeatable).", flag="--set", metavar="KEY=VALUE",
                                         multiple=True)


# the shared flags as messages name them
OUT, FORCE, RESUME, SET = Output.flag("out"), Output.flag("force"), Resume.flag("resume"), Overrides.flag("overrides")


def check_force_or_resume(force: bool, resume: bool) -> None:
    if force and resume:
        raise MixLNError(f"{FORCE} and {RESUME}: give one ({FORCE} starts afresh, {RESUME} continues)")


@dataclass(frozen=True, kw_only=True)
class Printed(Declared):
    as_json: bool = setting(False, Flag(), "Print the result as JSON (after any other output).", flag="--json")


@dataclass(kw_only=True)
class HealSettings:
    """The settings of a heal's training that a recipe's ``heal`` section holds too: healing/run.py's
    HealRun and training/recipe.py's Heal both extend this (spike_factor: as the recipe's guard)."""
    tokens: int = setting(HEAL_TOKENS, TOKENS, "Training tokens.")
    seq_len: int = setting(SEQ_LEN, Window(), "Tokens per training window.")
    batch_size: int = setting(HEAL_BATCH_SIZE, BATCH, "Windows per step.")
    lr: float = setting(HEAL_LR, POSITIVE_NUMBER, "Peak learning rate (warmup, then cosine).")
    loss: str = setting("kl", Choice(LOSSES),
                        "kl (KL divergence of the final logits; runs both whole models, ~3.5x the FLOPs of a residual "
                        "step, but recovers far more per token) or residual (relative error of the stream entering "
                        "the first Pre-LN block; runs the Post-LN blocks only).")
    activation_checkpointing: bool = setting(
        False, Flag(), "Keep only each block's input through a step and recompute the rest in the backward (with "
        "--loss kl the logits too, 128 tokens at a time): a step's activations stop growing with the depth, for one "
        "more forward per step. Pays when activations, not weights, set the peak (long --seq-len, large "
        "--batch-size).", flag="--activation-checkpointing/--no-activation-checkpointing")
    spike_factor: float = setting(
        0.0, SpikeFactor(), "Skip the update of a step whose loss exceeds X times the mean of the last 20 steps' "
        "(more than 5 in a row stop the heal); 0: no check. Non-finite losses and gradients always stop it.",
        metavar="X")
    checkpoint_interval: int = setting(
        HEAL_CHECKPOINT_INTERVAL, Count(0), "Save what --resume continues from (the Post-LN blocks, AdamW's "
        "state, the schedule) every N steps, beside --out; 0: never.", metavar="N")

    @staticmethod
    def budget(default: int = 0):
        """:attr:`tokens` as a conversion's heal budget (convert's, demo's and sweep's --heal-tokens, a recipe's
        heal.tokens): 0 is no heal, the default unless ``default``."""
        return same_as(HealSettings, "tokens", default=default, kind=TOKENS_OR_ZERO, metavar="N", help=(
            "Heal the conversion on N tokens: distil its Post-LN blocks from the source, as `mixln-convert heal` (its "
            f"defaults otherwise: {HEAL_BATCH_SIZE * SEQ_LEN:,} tokens a step; {HEAL_TOKENS:,} is heal's own default "
            "budget). 0: no heal."))

    def check_one_step(self, name=flag) -> None:
        """A heal budget (``tokens``, named by ``name(field)`` in the error) of at least one step, or 0 (none)."""
        step = self.batch_size * self.seq_len
        if 0 < self.tokens < step:
            raise MixLNError(f"{name(declared(HealSettings)['tokens'][0])}: {self.tokens} is less than one heal "
                             f"step ({self.batch_size} x {self.seq_len} = {step} tokens)")


@dataclass(kw_only=True)
class HealOptions(Options, HealSettings, ShardSized):
    """``mixln-convert heal``'s options (healing/run.py's HealRun adds the models and the output): ``data``
    a text path (the API also takes documents or tokens), measured on ``eval_tokens`` of ``eval_data``
    before, after and at each token count in ``eval_at`` (with ``perplexity`` the whole model's too)."""
    data: object = text("Training text (default split: train), best of the kind the model will be scored on: a "
                        "heal carries over to other kinds of text only in part. Or a `mixln-convert tokenize` "
                        "folder (its train split, memory-mapped: nothing is tokenized again).")
    dtype: str = setting("fp32", Choice(HEAL_DTYPES, "dtype"),
                         "Of the frozen weights (everything but the Post-LN blocks, which train in fp32); bf16 "
                         "halves them and computes under bf16 autocast.")
    warmup_ratio: float = setting(0.1, Number(0, 1, high_open=True))
    grad_clip: float = setting(1.0, NONNEGATIVE)
    eval_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens measured before and after.")
    eval_data: str | None = setting(None, Text(), "Held-out text measured before and after, packed and each "
                                    "document on its own: a file, folder or glob (default: embedded corpus, "
                                    "validation split), or a `mixln-convert tokenize` folder (its validation split).",
                                    metavar="PATH")
    perplexity: bool = setting(True, Flag(), "Also measure whole-model perplexity (the teacher's and CONVERTED's "
                               "whole models, over one copy of the layers they share).",
                               flag="--perplexity/--no-perplexity")
    fsdp: bool = setting(False, Flag(), "Shard the teacher and the student per block over the processes of a "
                         "launch (FSDP2), for a heal that does not fit one device; --loss kl only.",
                         flag="--fsdp/--no-fsdp")
    eval_at: tuple = setting((), TOKENS, multiple=True)  # the API's: validation once this many tokens are trained
    max_shard_size: str | int = setting(MAX_SHARD_SIZE, Size(), "Largest output shard, e.g. 5GB, 500MB.")
    seed: int = setting(0, SEED)

    def check_combination(self):
        self.check_one_step()


@dataclass(frozen=True, kw_only=True)
class HealCommand(Output, Resume):
    """``mixln-convert heal``'s options beside HealOptions: the teacher, and the output (None: beside CONVERTED)."""
    teacher: str = setting(kind=Text(), help="The Pre-LN model CONVERTED was converted from (HF folder, .gguf or "
                           "Hub id).", metavar="ORIGINAL")
    out: str | None = same_as(Output, "out", default=None, default_help="CONVERTED-healed beside it; NAME-healed here "
                              "for a Hub model ORG/NAME")


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(Options, ShardSized):
    """``mixln-convert convert``'s options (conversion/converter.py). ``alpha`` None: ``post_ln_layers``,
    else ALPHA. The calibration options apply to the calibrated strategy of a Mix-LN layout only."""
    alpha: float | None = alpha(None, default_help=f"{ALPHA}")  # None: --post-ln-layers may be given
    post_ln_layers: int | None = setting(None, Count(0), "Exact number of leading Post-LN layers (instead of "
                                         "--alpha).")
    layout: str = setting("mixln", Choice(LAYOUTS),
                          "mixln: the first blocks Post-LN (--alpha); lns: LayerNorm Scaling (arXiv 2502.05795), "
                          "every block Pre-LN with its norm outputs scaled by 1/sqrt(l) in the forward and its norm "
                          "gains multiplied by sqrt(l): exactly the source's function (with --strategy scratch: fresh "
                          "weights).")
    strategy: str = setting("calibrated", Choice(STRATEGIES),
                            "calibrated (fold norms, calibrate gains: close to the original's perplexity at once; "
                            "heal before generating text), move (paper layout, weights carried over; needs "
                            "training), reinit-post (re-initialize the Post-LN layers; needs training), scratch "
                            "(fresh Mix-LN model).")
    scaled_init: bool = setting(True, Flag(), "o_proj/down_proj of initialized layers use std "
                                "initializer_range/sqrt(2L).", flag="--scaled-init/--no-scaled-init")
    calibration_data: str | None = setting(None, Text(), "Text for the calibration statistics (default: embedded "
                                           "corpus, calibration split).", metavar="PATH")
    calibration_tokens: int = setting(CALIBRATION_TOKENS, TOKENS, "Tokens the calibrated gains are fitted on.")
    calibration_seq_len: int = setting(CALIBRATION_SEQ_LEN, Window(), "Tokens per calibration window (short "
                                       "windows fit better; docs/measurements.md).")
    max_shard_size: str | int | None = setting(  # None: the source's largest shard, at most MAX_SHARD_SIZE
        None, Size(), "Largest output shard, e.g. 5GB, 500MB. Default: the source's largest shard, at most 5GB "
        "(memory use grows with it).")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"), "Output dtype; default: the source's.")
    seed: int = setting(0, SEED, "Seed of initialized weights.")

    def check_combination(self):
        if self.alpha is not None and self.post_ln_layers is not None:
            raise MixLNError(f"{self.flag('alpha')} and {self.flag('post_ln_layers')} are exclusive: give one")
        self.max_shard_bytes  # parsed: a bad size is refused when the options are made
        if self.lns:
            for name in ("alpha", "post_ln_layers"):
                if getattr(self, name) is not None:
                    raise MixLNError(f"{self.flag(name)}: {self.flag('layout')} lns makes no block Post-LN (it "
                                     "scales every Pre-LN block's norms); leave it out")
            if self.strategy not in ("calibrated", "scratch"):  # calibrated: the default, which is exact here
                raise MixLNError(f"{self.flag('strategy')} {self.strategy}: {self.flag('layout')} lns has no Post-LN "
                                 f"block for it to convert; leave {self.flag('strategy')} out (the conversion is "
                                 "exact) or give scratch")
        if self.strategy != "calibrated" or self.lns:  # a user who names a file or a number expects it used
            why = (f"{self.flag('layout')} lns has no Post-LN block to calibrate" if self.lns
                   else f"only {self.flag('strategy')} calibrated reads it, not {self.strategy}")
            for name in ("calibration_data", "calibration_tokens", "calibration_seq_len"):
                if getattr(self, name) != getattr(ConvertOptions, name):
                    raise MixLNError(f"{self.flag(name)}: {why}; this run would ignore it")

    @property
    def resolved_alpha(self) -> float | None:
        """The alpha the layout is derived from, recorded in the converted config: the one given, else ALPHA;
        None where --post-ln-layers gives the count instead."""
        if self.post_ln_layers is not None:
            return None
        return ALPHA if self.alpha is None else self.alpha

    @property
    def lns(self) -> bool:
        """Whether this is a LayerNorm Scaling conversion (architectures/__init__.py) rather than Mix-LN."""
        return self.layout == "lns"


class HealsConversion:
    """A command healing its conversion on ``heal_tokens`` (convert, sweep): its :attr:`heal`, checked where the budget
    enters and by :meth:`check_model` once the model is known; the heal itself checks neither again."""

    @property
    def heal(self) -> HealSettings:  # no checkpoints: a killed run converts again, so no resume could continue one
        return HealSettings(tokens=self.heal_tokens, checkpoint_interval=0)

    def check_combination(self):
        self.heal.check_one_step(flag_in("heal"))

    def check_model(self, config: dict) -> None:
        if self.heal_tokens:  # windows the command fixes: named as a recipe's heal section names them
            check_windows(self.heal, config, key_in("heal"))


@dataclass(frozen=True, kw_only=True)
class ConvertHealOptions(HealsConversion, Options):
    """``convert --heal-tokens``: the conversion healed in the same run (workflows/train.py's convert_and_heal)."""
    heal_tokens: int = HealSettings.budget()
    heal_data: str | None = setting(None, Text(), "Text for --heal-tokens, best of the kind the model will be "
                                    "scored on (default: embedded corpus, train split).", metavar="PATH")

    def check_combination(self):
        if self.heal_data is not None and not self.heal_tokens:
            raise MixLNError(f"{self.flag('heal_data')}: only a heal in the same run reads it "
                             f"({self.flag('heal_tokens')} N); this run would ignore it")
        super().check_combination()


@dataclass(frozen=True, kw_only=True)
class Measurement(Options):
    """Text a model is measured on: ``max_tokens`` tokens of ``data`` (a path; None: the command's
    embedded split) in packed windows of ``seq_len``, ``batch_size`` windows a forward pass."""
    data: str | None = text("Held-out text.")
    seq_len: int = setting(SEQ_LEN, Window(opt_in="allow_longer"), "Tokens per evaluated window (at most the "
                           "model's max_position_embeddings).")
    max_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens scored (whole windows of --seq-len).")
    batch_size: int = setting(BATCH_SIZE, BATCH, "Windows per forward pass.")


@dataclass(frozen=True, kw_only=True)
class EvalOptions(Measurement):
    """``mixln-convert eval``'s options (evaluation/perplexity.py): the packed perplexity, or with ``tasks``
    lm-eval tasks instead (at most ``limit`` examples each; ``include_path``: a folder of task YAML files)."""
    allow_longer: bool = setting(False, Flag(), "Allow a --seq-len beyond the model's max_position_embeddings.")
    per_document: bool = setting(False, Flag(), "Also score each document on its own from its first token "
                                 "(lm-evaluation-harness's rolling loglikelihood: token and word perplexity, bits "
                                 "per byte), windows of --seq-len.")
    generate: bool = setting(False, Flag(), "Also write greedy continuations (64 tokens) of 24 fixed prompts and the "
                             "share of their 4-grams that repeat earlier ones: what a looping model shows and "
                             "perplexity hides.")
    tasks: tuple[str, ...] = setting((), Names(low=0, high=MAX_TASKS), TASKS_HELP + " Instead of the packed "
                                     "perplexity.", metavar="T1,T2")
    batch_size: int = setting(BATCH_SIZE, BATCH, "Windows (with tasks: lm-eval requests) per forward pass.")
    include_path: str | None = setting(None, Folder(), "A folder of your own lm-eval task YAML files.", metavar="DIR")
    limit: int | None = setting(None, LIMIT, "At most N examples of each task (lm-eval's --limit).",
                                metavar="N", default_help="all")

    def __post_init__(self):
        if self.tasks is None or isinstance(self.tasks, str):  # an API caller's None or "a,b": as the CLI reads it
            object.__setattr__(self, "tasks", comma_list(self.tasks) if self.tasks else ())
        super().__post_init__()

    def check_combination(self):
        if not self.tasks and (self.include_path is not None or self.limit is not None):
            raise MixLNError(f"{self.flag('include_path')} and {self.flag('limit')} go with {self.flag('tasks')}")


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(EvalOptions):
    """``mixln-convert analyze``'s options (analysis/analyze.py): EvalOptions' (``tasks``: the layer drop
    on each task's metric), with ``layer_sweep`` the per-block measures, with ``prune_curve`` the
    perplexity with N = 1..L/2 blocks removed by ``method``."""
    tasks: tuple[str, ...] = setting((), Names(low=0, high=MAX_TASKS), "Also the layer drop on each task's metric "
                                     "(the first its YAML lists): the metric with block l skipped minus the full "
                                     "model's, in memory. " + TASKS_HELP, flag="--task", metavar="T1,T2")
    span: int = setting(1, Count(1), "n of the per-layer angular distance, between the inputs of blocks l and l+n.")
    layer_sweep: bool = setting(True, Flag(), "The per-block measures (skipping each block, angular distances, "
                                "gradient norms: L forwards and a backward pass); without it, perplexity and what "
                                "--generate and --per-document add.", flag="--layer-sweep/--no-layer-sweep")
    prune_curve: bool = setting(False, Flag(), "Also the perplexity with N = 1..L/2 blocks removed by --method.")
    method: str = setting("angular", Choice(METHODS), "How --prune-curve chooses the N blocks it removes: "
                          + METHODS_HELP)

    def check_combination(self):
        super().check_combination()
        if not self.layer_sweep and (self.prune_curve or self.tasks):
            given = self.flag("prune_curve" if self.prune_curve else "tasks")
            raise MixLNError(f"{given} ranks or drops blocks by the layer sweep, which --no-layer-sweep skips")


@dataclass(frozen=True, kw_only=True)
class PruneOptions(Measurement, ShardSized):
    """``mixln-convert prune``'s options (surgery/prune.py): either ``layers`` names the blocks to
    remove ('20-23,27'), or ``remove`` blocks are chosen by ``method`` (angular and drop measure the
    model on the Measurement's text, default the embedded calibration split)."""
    data: str | None = text("Calibration text for --method angular/drop (default split: calibration).")
    seq_len: int = setting(SEQ_LEN, Window(), "Tokens per measured window.")
    max_tokens: int = setting(PRUNE_TOKENS, TOKENS, "Tokens measured for --method angular/drop.")
    layers: str | None = setting(None, Text(), "Blocks to remove (0-based), e.g. 20-23,27.", metavar="LIST")
    remove: int | None = setting(None, Count(1), "Number of blocks to remove, chosen by --method.", metavar="N")
    method: str = setting("angular", Choice(METHODS), "How --remove chooses its N blocks: " + METHODS_HELP)
    max_shard_size: str | int = setting(MAX_SHARD_SIZE, Size(), "Largest output shard, e.g. 5GB, 500MB.")

    def check_combination(self):
        if (self.layers is None) == (self.remove is None):
            raise MixLNError(f"{self.flag('layers')} and {self.flag('remove')}: give exactly one of them")


@dataclass(frozen=True, kw_only=True)
class TokenizeOptions(Options):
    """``mixln-convert tokenize``'s options (data/tokenization.py): ``num_proc`` 0 is one process per core
    for text over 16 MiB; shards of ``shard_tokens`` cut to whole windows of ``seq_len`` (None: any)."""
    validation: str | None = setting(None, Text(), "Validation text (file, folder or glob); its documents are never "
                                     "trained on.", metavar="PATH", default_help="--validation-fraction of DATA's "
                                     "documents")
    validation_fraction: float = setting(VALIDATION_FRACTION, OPEN_FRACTION, "Share of DATA's documents held out for "
                                         "validation, by content hash.")
    num_proc: int = setting(0, Count(0), "Tokenizing processes; 0: one per available core (none apart for text "
                            "under 16 MiB).")
    seq_len: int | None = setting(None, Count(1), "Training window length: shards are cut to whole windows of it "
                                  "(any window length still reads).")
    shard_tokens: int = setting(SHARD_TOKENS, TOKENS, "Tokens per shard.")

    def check_combination(self):
        if self.num_proc:
            check_processes(self.flag("num_proc"), self.num_proc)
        if self.seq_len is not None and self.seq_len > self.shard_tokens:
            raise MixLNError(f"{self.flag('seq_len')} {self.seq_len} is more than {self.flag('shard_tokens')} "
                             f"{self.shard_tokens}")


@dataclass(frozen=True, kw_only=True)
class EstimateOptions(Options):
    """The hardware ``mixln-convert estimate`` sizes a recipe for (training/memory.py), each None where
    the recipe's "Sized for" comment (else one 80 GB GPU) decides; ``memory`` of each process."""
    processes: int | None = setting(None, Count(1, MAX_PROCESSES), "Processes, one per GPU.", metavar="N",
                                    default_help="the recipe's 'Sized for' comment, else 1")
    parallelism: str | None = setting(None, Choice(PARALLELISMS),
                                   "single: one process; ddp: every process holds the whole training state; fsdp: "
                                   "weights, gradients and AdamW state sharded over the processes.",
                                   default_help="the recipe's, else single for one process, ddp for several")
    device: str | None = setting(None, Choice(DEVICES), "gpu: precision auto is bf16 autocast; cpu: fp32.",
                                 default_help="the recipe's, else gpu")
    memory: str | None = setting(None, Size(), "Memory of each GPU (or the RAM of one CPU process), e.g. 80GB, "
                                 "141GB, 24GiB.", metavar="SIZE", default_help="the recipe's, else 80GB")

    def check_combination(self):
        self.memory_bytes  # parsed: a bad size is refused when the options are made, naming --memory

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_size(self.memory, self.flag("memory"))


@dataclass(frozen=True, kw_only=True)
class CompareOptions(Options):
    """``mixln-convert compare``'s options (report/compare.py): a name for each input in order (default:
    folder names), and whether analyses with different tokenizers are compared (warning) or refused."""
    labels: tuple[str, ...] = setting(  # checked against the inputs, one per input (report/inputs.py)
        (), Text(), "Name of each input in tables and legends, one per input in order (repeatable); a train folder's "
        "arms become NAME/mixln, NAME/preln (and NAME/lns).", flag="--label", metavar="NAME", multiple=True,
        default_help="folder names")
    allow_mismatch: bool = setting(False, Flag(), "Compare analyses made with different tokenizers (with a warning) "
                                   "instead of refusing.")


SEEDS = Count(1, MAX_SEEDS)  # seeds per arm: each trains every arm once more


@dataclass(frozen=True, kw_only=True)
class SweepOptions(HealsConversion, Options):
    """What ``mixln-convert sweep`` measures (workflows/sweep.py): per alpha a calibrated conversion, a heal and a
    training (``heal_tokens``, ``train_tokens`` 0: none); ``lns``: the LNS retrofit trained like the control."""
    alphas: tuple[float, ...] = setting(SWEEP_ALPHAS, Numbers(FRACTION, 1, MAX_ALPHAS), "Post-LN ratios to try, "
                                        "comma-separated (alphas giving the same block count run once).",
                                        metavar="LIST")
    heal_tokens: int = HealSettings.budget()
    train_tokens: int = setting(0, TOKENS_OR_ZERO, "Train each Mix-LN model, and a Pre-LN control once per seed, on "
                                f"N tokens (the {CPU_RECIPE} recipe's steps, same data and order). 0: no training.",
                                metavar="N")
    data: str | None = text("Heal and training text (default: the embedded corpus's train split).")
    seeds: int = setting(1, SEEDS, "Training seeds per arm (with --train-tokens).")
    eval_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens each stage is scored and analyzed on (windows "
                               "of 256).", metavar="N")
    max_ppl_increase: float = setting(MAX_PPL_INCREASE, NONNEGATIVE, "Rule: the healed (else converted) perplexity "
                                      "at most X above the original's (0.10 = 10%).", metavar="X")
    max_grad_ratio: float = setting(MAX_GRAD_RATIO, Number(1), "Rule: the largest Post-LN block gradient norm at "
                                    "most Y times the Pre-LN blocks' mean.", metavar="Y")
    lns: bool = setting(False, Flag(), "With --train-tokens, also train the LayerNorm Scaling retrofit of SRC "
                        "(exact: every block's norm gains x sqrt(l), its norm outputs x 1/sqrt(l)) like the control, "
                        "and compare them.")

    def check_combination(self):
        if self.lns and not self.train_tokens:
            raise MixLNError(f"{self.flag('lns')}: the LNS retrofit computes the original's function, so only "
                             f"training tells them apart; add {self.flag('train_tokens')} N")
        super().check_combination()


STUDY_SCHEMES = {"scaled": True, "plain": False}  # a study's initialization scheme -> conversion.scaled_init


@dataclass(frozen=True, kw_only=True)
class StudyOptions(Options):
    """What ``mixln-convert study`` trains (workflows/study.py): ``recipe`` with the ``overrides`` (``--set`` items),
    ``seeds`` seeds of each scheme in ``schemes``, the Mix-LN arm at ``alpha`` beside Pre-LN (with
    ``post_ln`` and ``lns`` those arms too), each final model analyzed on ``eval_tokens``."""
    recipe: str = setting(CPU_RECIPE, Text(), "Training recipe of every run (a shipped name or a YAML file).",
                          metavar="RECIPE")
    overrides: tuple[str, ...] = same_as(Overrides, "overrides")
    # the Mix-LN arm needs Post-LN and Pre-LN blocks
    alpha: float = alpha(kind=OPEN_FRACTION)
    seeds: int = setting(2, SEEDS, "Seeds per arm and scheme (initialization and data order); verdicts need 2 or "
                         "more.")
    schemes: tuple[str, ...] = setting(tuple(STUDY_SCHEMES), Names(tuple(STUDY_SCHEMES), noun="scheme"),
                                       "Initialization schemes, each applied to every arm: scaled (o_proj/down_proj "
                                       "std / sqrt(2L)), plain (LLaMA's).", flag="--init", metavar="LIST")
    post_ln: bool = setting(True, Flag(), "Train a Post-LN arm (alpha 1) too.", flag="--post-ln/--no-post-ln")
    lns: bool = setting(False, Flag(), "Train a LayerNorm Scaling arm too (arXiv 2502.05795: every block Pre-LN, the "
                        "norm outputs of block l scaled by 1/sqrt(l); the same initialization, norm gains 1 as in its "
                        "paper).", flag="--lns/--no-lns")
    eval_tokens: int = setting(STUDY_EVAL_TOKENS, TOKENS, "Held-out tokens each final model is analyzed on (layer "
                               "drop, gradient norms).", metavar="N")


@dataclass(frozen=True, kw_only=True)
class DemoOptions(Options):
    """What ``mixln-convert demo`` runs (workflows/demo.py): ``source`` (None: SmolLM2-135M) converted at ``alpha``,
    healed on ``heal_tokens`` (0: no heal), both arms trained on ``train_tokens``."""
    alpha: float = alpha()
    heal_tokens: int = HealSettings.budget(CPU_RECIPE_KEYS["heal"]["tokens"])
    # the demo's budget (2 CPU cores, minutes): 8 steps per arm, every stage measured on the same 8 windows
    train_tokens: int = setting(8 * CPU_STEP_TOKENS, TOKENS, f"Training tokens per arm (the {CPU_RECIPE} recipe, "
                                f"{CPU_STEP_TOKENS:,} tokens a step, at lr {CPU_RECIPE_KEYS['optim']['lr']:g}); more "
                                "for a real recovery.", metavar="N")
    eval_tokens: int = setting(8 * SEQ_LEN, TOKENS, "Held-out tokens every stage is measured on, by training "
                               "validation and analysis alike.", metavar="N")
    prune_curve: bool = setting(True, Flag(), "Also the perplexity with 1..L/2 blocks removed, for the original and "
                                "both trained arms.", flag="--prune-curve/--no-prune-curve")
    source: str | None = setting(None, Text(), "Your own Pre-LN checkpoint (HF folder, .gguf or Hub id) instead of "
                                 "SmolLM2-135M.", metavar="MODEL")


@dataclass(frozen=True, kw_only=True)
class DemoOutput(Output, Resume):
    out: str = same_as(Output, "out", default="mixln-demo", metavar=None)


@dataclass(frozen=True, kw_only=True)
class AnalyzeOutput(Output):
    out: str | None = same_as(Output, "out", default=None, default_help="analysis-<CKPT name>")


@dataclass(frozen=True, kw_only=True)
class TokenizeCommand(Output):
    """``mixln-convert tokenize``'s options beside TokenizeOptions: the tokenizer's checkpoint and TOKENS."""
    out: str = same_as(Output, "out", metavar="TOKENS")
    tokenizer_ckpt: str = setting(kind=Text(), help="The checkpoint (HF folder, .gguf or Hub id) whose tokenizer to "
                                  "use: the model you will train.", flag="--tokenizer", metavar="CKPT")


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """``mixln-convert export``'s options (export/__init__.py): the target, and a GGUF's matrix type."""
    to: str = setting(kind=Choice(EXPORT_TARGETS), help="llama: a plain transformers folder (LlamaForCausalLM, "
                      "Qwen2ForCausalLM or Qwen3ForCausalLM: no remote code, no Mix-LN config keys; tokenizer files "
                      "carried over). gguf: one llama.cpp file OUT.gguf (LLaMA/Qwen2/Qwen3 tensor names and metadata, "
                      "tokenizer included).")
    tensor_type: str | None = setting(None, Choice(GGUF_TYPES), "With --to gguf: the matrices' type (norm gains and "
                                      "biases stay f32; a q8_0 matrix whose rows are no multiple of 32 is f16).",
                                      flag="--type", default_help=DEFAULT_GGUF_TYPE)


@dataclass(frozen=True, kw_only=True)
class TrainOptions(Options):
    """``mixln-convert train``'s options beside its RECIPE (workflows/train.py): ``overrides`` of its keys, the
    arms to train, the output folder (None: out/<recipe name>), ``resume``; ``list_recipes``: list them instead."""
    overrides: tuple[str, ...] = same_as(Overrides, "overrides")
    arm_names: tuple[str, ...] = setting(
        (), Choice((*ARMS, "both"), "arm"), "An arm to train (repeatable; one after the other, on the same data, "
        "order and budget): mixln (the source converted to Mix-LN), preln (the source itself: the control), lns (the "
        "source retrofitted to LayerNorm Scaling, exactly); both: mixln and preln.", flag="--arm", multiple=True,
        default_help="the recipe's arms key, mixln and preln unless it says otherwise")
    out: str | None = same_as(Output, "out", default=None, default_help="out/<recipe name>")
    resume: bool = same_as(Resume, "resume")
    list_recipes: bool = setting(False, Flag(), "List the shipped recipes and exit.", flag="--list")

    @property
    def arms(self) -> list[str] | None:
        """The arms named, each once ("both": mixln and preln); None: the recipe's."""
        named = (arm for name in self.arm_names for arm in (DEFAULT_ARMS if name == "both" else (name,)))
        return list(dict.fromkeys(named)) or None


@dataclass(frozen=True, kw_only=True)
class RecipesOptions(Options):
    path: str | None = setting(None, Text(), "Print the installed path of the shipped recipe or accelerate config "
                               "NAME.", metavar="NAME")
