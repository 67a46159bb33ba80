"""Range checks of the numbers a user gives (flags, recipe keys, API arguments), each error
naming the flag or key. No torch here: commands check their numbers before any work."""

import math
import os
import re

from .errors import MixLNError

SEED_LIMIT = 2**32  # numpy's and torch's seeds are 32-bit
MAX_PROCESSES = 65536  # training processes (GPUs) an estimate takes: beyond any cluster a recipe is sized for


def is_number(value) -> bool:
    """An int or a float, not a bool (Python counts True as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value) -> bool:
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:  # an int past float's range: no count or rate the tool takes
        return False


def _is_integral(value) -> bool:
    return is_finite_number(value) and value == int(value)


def check_choice(flag: str, value, choices) -> None:
    """``value`` one of ``choices`` (None among them where the option may be left out)."""
    if value not in choices:
        known = ", ".join(choice for choice in choices if choice is not None)
        raise MixLNError(f"{flag}: unknown {flag[2:]} {value!r} (choose from {known})")


def check_positive(flag: str, value) -> None:
    if not (_is_integral(value) and value >= 1):
        raise MixLNError(f"{flag}: must be a positive integer, got {value!r}")


def count_ok(value, low: int = 1) -> bool:
    """Whether ``value`` is a count of tokens, or of what a run has fewer of (steps, sequences): an
    integer from ``low`` to :data:`MAX_TOKENS`."""
    return _is_integral(value) and low <= value <= MAX_TOKENS


def count_interval(low: int = 1) -> str:
    return f"an integer in [{low}, 10^{round(math.log10(MAX_TOKENS))}]"


def check_tokens(flag: str, value, zero_ok: bool = False) -> None:
    """A token count (:func:`count_ok`), from 0 with ``zero_ok``."""
    low = 0 if zero_ok else 1
    if not count_ok(value, low):
        raise MixLNError(f"{flag}: must be {count_interval(low)}, got {value!r}")


def check_nonnegative(flag: str, value) -> None:
    if not (is_finite_number(value) and value >= 0):
        raise MixLNError(f"{flag}: must be a number >= 0, got {value!r}")


def check_positive_float(flag: str, value) -> None:
    if not (is_finite_number(value) and value > 0):
        raise MixLNError(f"{flag}: must be a finite number > 0, got {value!r}")


def check_fraction(flag: str, value, *, low_open: bool = False, high_open: bool = False) -> None:
    """``value`` in [0, 1], or with open ends."""
    ok = is_finite_number(value) and (0 < value if low_open else 0 <= value) and (
        value < 1 if high_open else value <= 1)
    if not ok:
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise MixLNError(f"{flag}: must be in {interval}, got {value!r}")


def below_one_step(tokens: int, batch_size: int, seq_len: int, factors: str | None, step: str) -> str | None:
    """Why a heal budget of ``tokens`` is short of one ``step`` of ``batch_size`` x ``seq_len`` tokens, else
    None; ``factors`` names the two sizes (the flags or keys that set them), None gives their values."""
    size = batch_size * seq_len
    shown = f"{factors} = {size}" if factors else f"{batch_size} x {seq_len} = {size} tokens"
    return f"{tokens} is less than {step} ({shown})" if tokens < size else None


def check_one_step(tokens: int, batch_size: int, seq_len: int, flag: str = "--tokens",
                   factors: str | None = "--batch-size x --seq-len", step: str = "one step") -> None:
    """A heal budget ``flag`` of at least one step (:func:`below_one_step`); the defaults are the heal command's."""
    if why := below_one_step(tokens, batch_size, seq_len, factors, step):
        raise MixLNError(f"{flag}: {why}")


def check_force_or_resume(force: bool, resume: bool) -> None:
    if force and resume:
        raise MixLNError("--force and --resume: give one (--force starts afresh, --resume continues)")


SPIKE_FACTORS = "0 (off) or in (1, 1000]"  # a loss spike guard's factor (training/loop.py)


def spike_factor_ok(value) -> bool:
    return is_number(value) and (value == 0 or 1 < value <= 1000)


def check_spike_factor(flag: str, value) -> None:
    if not spike_factor_ok(value):
        raise MixLNError(f"{flag}: must be {SPIKE_FACTORS}, got {value!r}")


def check_seed(value, flag: str = "--seed") -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < SEED_LIMIT):
        raise MixLNError(f"{flag}: must be an integer in [0, 2^32), got {value!r}")


def check_seq_len(flag: str, seq_len: int, config: dict, opt_in: str | None = None, allow_longer: bool = False) -> None:
    """A sequence length the model was trained for: at most its ``max_position_embeddings``
    (positions beyond it were never seen in pre-training), unless the user opts in with
    ``opt_in`` (the option's name, for the message; None where the command has none)."""
    check_positive(flag, seq_len)
    limit = config.get("max_position_embeddings")
    if limit and seq_len > limit and not allow_longer:
        hint = f" ({opt_in} to use it anyway)" if opt_in else ""
        raise MixLNError(f"{flag}: {seq_len} exceeds the model's max_position_embeddings {limit}{hint}")


# Upper bounds of the counts a user gives, checked where they enter: a count past its bound
# would run for days, hang building plans, or start processes until the system refuses.
MAX_SEEDS = 100  # seeds per arm: each trains every arm once more
MAX_ALPHAS = 100  # sweep alphas: they give at most L + 1 distinct block counts anyway
MAX_TASKS = 256  # downstream tasks: each is an lm-eval evaluation of its own
MAX_COMPARED = 100  # compare's inputs: a report's tables and plots past that are unreadable
MAX_TOKENS = 10**13  # a token count (heal, training, evaluation, calibration): past any run's budget
MAX_BATCH = 2**16  # sequences in one forward pass (--batch-size): past any accelerator's memory
MAX_EXAMPLES = 10**9  # examples of one lm-eval task (--limit): past any benchmark's size


def check_at_most(flag: str, value: int, limit: int, why: str, counted: str | None = None) -> None:
    """``value`` (a number given, or with ``counted`` the number of items given, e.g. "tasks")
    at most ``limit``; ``why`` says what a larger one would cost."""
    if value > limit:
        given = f"{value} {counted}, more than {limit}" if counted else f"{value} is more than {limit}"
        raise MixLNError(f"{flag}: {given} ({why})")


def check_batch_size(flag: str, value) -> None:
    check_positive(flag, value)
    check_at_most(flag, value, MAX_BATCH, "sequences in one forward pass: past any accelerator's memory")


def check_limit(flag: str, value) -> None:
    """lm-eval's --limit: None (every example) or a count of examples per task."""
    if value is not None:
        check_positive(flag, value)
        check_at_most(flag, value, MAX_EXAMPLES, "examples of one task: past any benchmark's size")


def check_seeds(flag: str, seeds: int) -> None:
    check_positive(flag, seeds)
    check_at_most(flag, seeds, MAX_SEEDS, "each seed trains every arm once more")


def check_alpha_count(flag: str, alphas: list) -> None:
    check_at_most(flag, len(alphas), MAX_ALPHAS, "they give at most one more block count than the model has "
                                                 "blocks", "values")


def check_task_count(flag: str, names: list) -> None:
    check_at_most(flag, len(names), MAX_TASKS, "each is an lm-eval evaluation of its own", "tasks")


def check_processes(flag: str, value: int) -> None:
    """Worker processes of a CPU-bound job: more than the available cores only add memory (each
    holds a tokenizer) and, past the system's process limit, fail to start. The cores are this
    process's affinity (e.g. a job's share), not the machine's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    check_at_most(flag, value, cores, "the cores available to this process; more workers only add memory")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
MAX_SIZE = 2**50  # 1 PiB: a size (shard, memory) past anything real, so a typo's extra zeros are refused


def parse_size(text: str | int, flag: str = "--max-shard-size") -> int:
    """'5GB' -> 5e9, '500MiB' -> 500 * 2**20, 1000 -> 1000 (transformers' conventions), at most 1 PiB;
    an error names ``flag``."""
    if _is_integral(text):
        size = int(text)
    else:
        match = _SIZE.match(text) if isinstance(text, str) else None
        size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]) if match else 0
    if size < 1:
        raise MixLNError(f"{flag}: cannot read size {text!r} (a positive size, e.g. 5GB, 500MB, 2GiB)")
    if size > MAX_SIZE:
        raise MixLNError(f"{flag}: {text} is more than 1 PiB")
    return size
