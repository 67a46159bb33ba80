"""The bounds of the numbers a user gives and the checks that are no single setting's kind (a setting's own
range is its kind's: schema.py), each error naming the flag or key. No torch here: commands check before any work."""

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


def is_integral(value) -> bool:
    return is_finite_number(value) and value == int(value)


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


def parse_size(text: str | int, flag: str) -> int:
    """'5GB' -> 5e9, '500MiB' -> 500 * 2**20, 1000 -> 1000 (transformers' conventions), at most 1 PiB;
    an error names ``flag``."""
    if is_integral(text):
        size = int(text)
    else:
        match = _SIZE.match(text) if isinstance(text, str) else None
        size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]) if match else 0
    if size < 1:
        raise MixLNError(f"{flag}: cannot read size {text!r} (a positive size, e.g. 5GB, 500MB, 2GiB)")
    if size > MAX_SIZE:
        raise MixLNError(f"{flag}: {text} is more than 1 PiB")
    return size
