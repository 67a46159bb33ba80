"""Bootstrap intervals over evaluation windows: how far a figure could move on other held-out text of the
same kind, and so which differences between models the report may call.

Each figure is a statistic of per-window (or per-batch) values, resampled with replacement ``DRAWS`` times.
Figures measured on the same windows resample the same rows (the generator is seeded by what was measured),
so the draws of two models are paired and their difference keeps only the models' own disagreement.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from ..analysis.measures import coefficient_of_variation

DRAWS = 2000
LEVEL = 0.95  # two-sided
# An interval resampled from fewer rows decides nothing: 2 rows have 3 distinct resamples, 5 rows 126
# (the analysis's gradient norms rest on a few batches)
MIN_ROWS = 5
# The smallest difference the report calls, a judgement: 1% of perplexity (for perplexities and the figures
# measured relative to a model's perplexity), or 1% of the larger value (angular distance, gradient-norm
# variation). Below it two models are "the same within 1%" however sure the interval is of the sign.
PRACTICAL = 0.01
# what the summary calls and why, as the report states it (once, beside the thresholds it quotes)
VERDICT_NOTE = (f"The summary calls a difference (a model wins, a figure is highest or lowest) only where it is "
                f"larger than {PRACTICAL:.0%} (the report's practical threshold: {PRACTICAL:.0%} of perplexity for "
                f"perplexities and the figures relative to a model's perplexity, {PRACTICAL:.0%} of the larger value "
                f"for angular distances and gradient-norm variation) and its {LEVEL:.0%} bootstrap interval excludes "
                f"0; models whose difference is within {PRACTICAL:.0%}, its interval too, are the same within "
                f"{PRACTICAL:.0%}; anything else is too close to call. Each interval says how many evaluation "
                f"windows (or gradient batches) n it resamples; one on fewer than {MIN_ROWS} decides nothing.")


@dataclass
class Bootstrap:
    """A figure and its bootstrap draws."""

    value: float
    draws: np.ndarray  # the statistic on each of DRAWS resamples
    n: int  # the rows (windows or batches) resampled
    rows: str = "windows"  # what they are

    @property
    def decides(self) -> bool:
        """Whether enough rows were resampled for the interval to decide anything."""
        return self.n >= MIN_ROWS

    @property
    def size(self) -> str:
        """'n=8 windows': what the interval rests on."""
        return f"n={self.n} {self.rows}"

    @property
    def interval(self) -> tuple[float, float]:
        return interval(self.draws)


def interval(draws) -> tuple[float, float]:
    """The two-sided LEVEL interval of bootstrap ``draws``."""
    low, high = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def bootstrap(statistic, samples, measured_on: str, rows: str = "windows") -> Bootstrap:
    """``statistic`` of ``samples`` ([n, ...], one row per evaluation window or batch: ``rows`` says
    which) and of its bootstrap resamples. ``statistic`` maps an array [draws, n, ...] to [draws].
    ``measured_on`` names the windows (data, window length, count): equal names give equal resamples."""
    samples = np.asarray(samples, dtype=float)
    seed = int.from_bytes(hashlib.sha256(f"{measured_on}|{len(samples)}".encode()).digest()[:8], "big")
    resampled = np.random.default_rng(seed).integers(0, len(samples), (DRAWS, len(samples)))
    return Bootstrap(float(statistic(samples[None])[0]), statistic(samples[resampled]), len(samples), rows)


def call(difference: float, draws=None) -> str:
    """What the report may say of ``difference`` (in the units PRACTICAL is of), given bootstrap ``draws``
    of it (None where there is no interval that decides): 'differs' only where it is larger than PRACTICAL
    and the LEVEL interval excludes 0; 'same' where it is within PRACTICAL (and so is all of its interval,
    where it has one); else 'open' (too close to call)."""
    if draws is None:
        return "same" if abs(difference) <= PRACTICAL else "open"
    low, high = interval(draws)
    if abs(difference) > PRACTICAL and (low > 0 or high < 0):
        return "differs"
    if -PRACTICAL <= low and high <= PRACTICAL:
        return "same"
    return "open"


def perplexity(losses) -> np.ndarray:
    """exp of the mean window loss, per draw ([draws, n] -> [draws])."""
    return np.exp(losses.mean(axis=1))


def relative_increase(losses) -> np.ndarray:
    """The mean relative perplexity increase of the variants in columns 1.. over the model in column 0
    ([draws, n, 1 + k] -> [draws])."""
    means = losses.mean(axis=1)
    return (np.exp(means[:, 1:] - means[:, :1]) - 1).mean(axis=1)


def mean_value(values) -> np.ndarray:
    """Mean over windows and columns ([draws, n, k] -> [draws])."""
    return values.mean(axis=(1, 2))


def variation_of_mean(norms) -> np.ndarray:
    """Coefficient of variation (std / mean) across the columns of the mean over rows
    ([draws, n, L] -> [draws]): of per-layer gradient norms averaged over batches."""
    return coefficient_of_variation(norms.mean(axis=1), axis=1)
