"""The figures several reports compute from the per-block values of an analysis or a training
run, and the verdict on a difference between seeded runs, each defined once."""

import math
import statistics
from dataclasses import dataclass

import numpy as np

from ..io.records import FIGURE, Record
from ..schema import Choice, setting

OUTCOMES = ("reproduced", "not reproduced", "too close to call")


def deep_half(num_layers: int) -> slice:
    """The deeper half of ``num_layers`` blocks (with an odd count the middle block too): where the
    Mix-LN paper finds a Pre-LN model's blocks matter least."""
    return slice(num_layers // 2, None)


def coefficient_of_variation(values, axis: int = -1) -> np.ndarray:
    """std / mean along ``axis`` (of per-block gradient norms: 0 when every block gets the same)."""
    values = np.asarray(values, dtype=float)
    return values.std(axis=axis) / values.mean(axis=axis)


@dataclass(frozen=True, kw_only=True)
class Verdict(Record):
    """A claim's :func:`verdict`, with the gap and spread it was decided on and both means."""
    outcome: str = setting(kind=Choice(OUTCOMES, "outcome"))
    gap: float = setting(kind=FIGURE)
    spread: float = setting(kind=FIGURE)
    tested: float = setting(kind=FIGURE)
    baseline: float = setting(kind=FIGURE)
    direction: str = setting(kind=Choice(("lower", "higher"), "direction"))


def verdict(tested: list[float], baseline: list[float], direction: str) -> Verdict:
    """``tested``'s values against ``baseline``'s (one per seed). The gap (difference of the
    means) decides only when it exceeds the spread between seeds (the larger of the two ranges):
    then the claim is reproduced when the gap points the claimed ``direction``, else not
    reproduced; otherwise it is too close to call. One seed has no spread: too close to call."""
    gap = statistics.mean(tested) - statistics.mean(baseline)
    spread = max(max(tested) - min(tested), max(baseline) - min(baseline))
    if len(tested) < 2 or len(baseline) < 2 or not math.isfinite(gap) or abs(gap) <= spread:
        outcome = "too close to call"
    elif (gap < 0) == (direction == "lower"):
        outcome = "reproduced"
    else:
        outcome = "not reproduced"
    return Verdict(outcome=outcome, gap=gap, spread=spread, tested=statistics.mean(tested),
                   baseline=statistics.mean(baseline), direction=direction)
