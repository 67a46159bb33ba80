"""The report of ``mixln-convert sweep``: one row per Post-LN count, perplexity, layer-drop profiles and
gradient-norm spread against alpha, and the recommendation with its rule (with ``--lns``, the LNS retrofit too)."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..analysis.measures import verdict
from ..analysis.plots import scale_layer_drop_axis
from ..analysis.result import NUMBER_ROWS
from ..io.records import LAYER_COUNT, NUMBER, NUMBER_LIST, POST_LN_COUNT, SECONDS, STRINGS, Record, Result
from ..schema import (NONNEGATIVE, POSITIVE_NUMBER, SEED, TOKENS, TOKENS_OR_ZERO, ByName, Count, Kind, Nested, String,
                      setting)
from ..workflows.options import SweepOptions
from .render import MISSING, mean_and_range, write_report


@dataclass(frozen=True)
class Scores(Record):
    """A checkpoint's perplexity on the sweep's text, over its windows and per document."""
    perplexity: float = setting(kind=POSITIVE_NUMBER)
    per_document_perplexity: float = setting(kind=POSITIVE_NUMBER)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    seq_len: int = setting(kind=Count(2))
    data: str = setting(kind=String())


@dataclass(frozen=True)
class Profile(Record):
    """What the sweep keeps of a checkpoint's analysis: the layer-drop profile and gradient norms per batch."""
    perplexity: float = setting(kind=POSITIVE_NUMBER)
    layer_drop: list = setting(kind=NUMBER_LIST)
    angular_distance: list = setting(kind=Kind())  # null past the last block with span blocks ahead
    post_ln_layers: int = setting(kind=POST_LN_COUNT)
    grad_norm_batches: list = setting(kind=NUMBER_ROWS)


@dataclass(frozen=True)
class Original(Record):
    """The original model's stage: its scores and analysis, which every alpha is measured against."""
    scores: Scores = setting(kind=Nested(Scores, "a checkpoint's scores"))
    analysis: Profile = setting(kind=Nested(Profile, "a checkpoint's analysis"))


@dataclass(frozen=True)
class TrainedRun(Record):
    """One seed's training run (an alpha's arm, the Pre-LN control's or the LNS retrofit's)."""
    final_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    initial_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    seed: int = setting(kind=SEED)
    grad_norm_steps: list = setting(kind=NUMBER_ROWS)  # per-block norms of the first steps


TRAINED_RUNS = Nested(TrainedRun, "a training run", many=True)
# the row of no Post-LN block (the original's scores again) has its fields in this order in the file
ZERO_ROW_ORDER = ("post_ln_layers", "alphas", "converted", "healed", "trained", "analysis", "times", "gradients_from",
                  "grad_norm_cv", "post_pre_grad_ratio", "grad_steps")


# kw_only: the fields keep the file's order
@dataclass(frozen=True, kw_only=True)
class AlphaRow(Record):
    """One Post-LN block count of the sweep (the alphas giving it): each stage's scores and the gradient figures."""
    post_ln_layers: int = setting(kind=POST_LN_COUNT)
    alphas: list = setting(kind=NUMBER_LIST)
    converted: Scores = setting(kind=Nested(Scores, "a checkpoint's scores"))
    healed: Scores | None = setting(None, Nested(Scores, "a checkpoint's scores"))
    trained: list[TrainedRun] | None = setting(None, TRAINED_RUNS)
    analysis: Profile = setting(kind=Nested(Profile, "a checkpoint's analysis"))
    grad_norm_cv: float = setting(kind=NUMBER)
    post_pre_grad_ratio: float | None = setting(None, NUMBER)  # None without both kinds of block
    grad_steps: int = setting(kind=TOKENS_OR_ZERO)
    gradients_from: str = setting(kind=String())
    times: dict = setting(kind=SECONDS)

    def to_dict(self) -> dict:
        found = super().to_dict()
        return found if self.post_ln_layers else {key: found[key] for key in ZERO_ROW_ORDER}


@dataclass(frozen=True, kw_only=True)
class Recommendation(Record):
    """The row the rule recommends (None when none passes) and why each other row failed it."""
    rule: str = setting(kind=String())
    stage: str = setting(kind=String())  # the stage whose perplexity the rule reads: "healed" or "converted"
    max_ppl_increase: float = setting(kind=NONNEGATIVE)
    max_grad_ratio: float = setting(kind=POSITIVE_NUMBER)
    post_ln_layers: int | None = setting(None, POST_LN_COUNT)
    alphas: list | None = setting(None, NUMBER_LIST)
    failures: dict = setting(kind=ByName(STRINGS))  # a Post-LN count's (as a string) reasons


@dataclass(frozen=True, kw_only=True)
class SweepResult(Result):
    """``sweep.json``: the settings, the original's stage, the trained baselines, a row per Post-LN count and
    the recommendation."""
    FILE = "sweep.json"
    WHAT = "a sweep of `mixln-convert sweep`"

    source: str = setting(kind=String())
    num_layers: int = setting(kind=LAYER_COUNT)
    eval_tokens: int = setting(kind=TOKENS)
    heal_tokens: int = setting(kind=TOKENS_OR_ZERO)
    train_tokens: int = setting(kind=TOKENS_OR_ZERO)
    seeds: int = setting(kind=Count(1))
    data: str | None = setting(None, String())
    original: Original = setting(kind=Nested(Original, "the original's stage"))
    control: list[TrainedRun] = setting(kind=TRAINED_RUNS)  # Pre-LN, one per seed ([] without training)
    lns: list[TrainedRun] = setting(kind=TRAINED_RUNS)  # the LNS retrofit likewise ([] without --lns)
    rows: list[AlphaRow] = setting(kind=Nested(AlphaRow, "a sweep's row", many=True))
    recommendation: Recommendation = setting(kind=Nested(Recommendation, "a recommendation"))
    times: dict = setting(kind=Kind())  # stage -> seconds; an alpha's -> {its step: seconds}


def _ratio(value: float | None, original: float) -> str:
    return MISSING if value is None else f"{value:,.2f} ({value / original:.3f}x)"


def _ppls(runs: list[TrainedRun]) -> list[float]:
    return [run.final_val_ppl for run in runs]


def _trained(row: AlphaRow) -> float | None:
    return float(np.mean(_ppls(row.trained))) if row.trained else None


def table_rows(result: SweepResult) -> list[list[str]]:
    original = result.original.scores
    rows = []
    for row in result.rows:
        grad = row.post_pre_grad_ratio
        failures = result.recommendation.failures[str(row.post_ln_layers)]
        rows.append([", ".join(f"{a:g}" for a in row.alphas), f"{row.post_ln_layers} / {result.num_layers}",
                     *(_ratio(stage and getattr(stage, key), getattr(original, key))
                       for stage in (row.converted, row.healed) for key in ("perplexity", "per_document_perplexity")),
                     mean_and_range(_ppls(row.trained), "{:,.2f}") if row.trained else MISSING,
                     f"{row.grad_norm_cv:.3f}", MISSING if grad is None else f"{grad:.2f}",
                     "passes" if not failures else "; ".join(failures)])
    return rows


def verdict_sentences(result: SweepResult) -> list[str]:
    """The recommendation and, plainly, whether any alpha beats the control."""
    recommendation = result.recommendation
    original = result.original.scores.perplexity
    sentences = [f"Rule: {recommendation.rule} (`{SweepOptions.flag('max_ppl_increase')}`, "
                 f"`{SweepOptions.flag('max_grad_ratio')}`)."]
    if recommendation.post_ln_layers is None:
        sentences.append("No alpha passes the rule: on this model and budget, keep Pre-LN or give the conversion "
                         "more healing or training.")
    else:
        alphas = ", ".join(f"{a:g}" for a in recommendation.alphas)
        sentences.append(f"Recommended: alpha {alphas} ({recommendation.post_ln_layers} of {result.num_layers} "
                         "blocks Post-LN).")
        if recommendation.post_ln_layers == 0:
            sentences.append("That is no Post-LN block at all: no Mix-LN layout passed the rule.")
    trained = {row.post_ln_layers: _trained(row) for row in result.rows if row.trained}
    if result.control and trained:
        spread = _ppls(result.control)
        control = float(np.mean(spread))
        beating = {n: ppl for n, ppl in trained.items() if n > 0 and ppl < min(spread)}
        if beating:
            listed = ", ".join(f"{n} Post-LN blocks {ppl:.2f}" for n, ppl in sorted(beating.items()))
            sentences.append(f"After {result.train_tokens:,} training tokens, these beat the Pre-LN control "
                             f"({control:.2f}, every seed): {listed}.")
        else:
            sentences.append(f"No alpha beats the Pre-LN control after {result.train_tokens:,} training tokens "
                             f"(control {control:.2f}" + (f", seeds {min(spread):.2f}-{max(spread):.2f}"
                                                         if len(spread) > 1 else "") + ").")
        if result.lns:
            sentences.append(_lns_sentence(result))
    else:
        best = min(((row.healed or row.converted).perplexity for row in result.rows if row.post_ln_layers > 0),
                   default=None)
        if best is not None and best >= original:
            sentences.append(f"No Mix-LN layout beats the original Pre-LN model ({original:.2f}) without training: "
                             f"conversion and heal only limit the loss (`{SweepOptions.flag('train_tokens')}` compares "
                             "against a trained Pre-LN control).")
    return sentences


def _lns_sentence(result: SweepResult) -> str:
    """The LNS retrofit against the Pre-LN control: a difference is called only beyond the spread between seeds."""
    found = verdict(_ppls(result.lns), _ppls(result.control), "lower")
    outcome = {"reproduced": "LNS is lower", "not reproduced": "LNS is higher"}.get(found.outcome, found.outcome)
    return (f"The LNS retrofit (every block's norm gains x sqrt(l): the original's function until trained), "
            f"trained like the control: validation perplexity {found.tested:.2f} vs Pre-LN control "
            f"{found.baseline:.2f} ({len(result.lns)} seed(s)); {outcome} (gap {found.gap:+.2f}, spread "
            f"between seeds {found.spread:.2f}).")


def plot_perplexity(result: SweepResult, path: Path) -> None:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    alphas = [row.post_ln_layers / result.num_layers for row in result.rows]
    stages = [("converted", [row.converted.perplexity for row in result.rows])]
    if result.heal_tokens:
        stages.append(("healed", [row.healed.perplexity for row in result.rows]))
    if result.train_tokens:
        stages.append((f"trained (validation, mean of {result.seeds} seed(s))", [_trained(row) for row in result.rows]))
    for name, values in stages:  # measured points: markers, no line between alphas
        ax.plot(alphas, values, marker="o", linestyle="none", label=name)
    scores = result.original.scores
    ax.axhline(scores.perplexity, color="grey", linestyle="--", label="original (Pre-LN)")
    for runs, color, style, name in ((result.control, "black", ":", "Pre-LN control"),
                                     (result.lns, "tab:green", "-.", "LNS retrofit")):
        if runs:
            ax.axhline(np.mean(_ppls(runs)), color=color, linestyle=style, label=f"{name}, trained (validation)")
    ax.set(title=f"Perplexity by Post-LN ratio\n{scores.data}, {scores.tokens:,} tokens in windows of "
                 f"{scores.seq_len}", xlabel="Post-LN blocks / L", ylabel="perplexity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def plot_layer_drop(result: SweepResult, path: Path) -> None:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    profiles = [("original", result.original.analysis)] + [
        (f"{row.post_ln_layers} Post-LN", row.analysis) for row in result.rows]
    percents = {name: [100 * d / analysis.perplexity for d in analysis.layer_drop] for name, analysis in profiles}
    for name, values in percents.items():
        ax.plot(values, marker=".", label=name)
    scale_layer_drop_axis(ax, [v for values in percents.values() for v in values])
    stage = "trained" if result.train_tokens else "healed" if result.heal_tokens else "converted"
    ax.set(title=f"Perplexity increase when one block is skipped ({stage} models)", xlabel="block (layer index)",
           ylabel="perplexity increase (%)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.savefig(path, dpi=120)


def plot_gradients(result: SweepResult, path: Path) -> None:
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    spread_ax, ratio_ax = fig.subplots(1, 2)
    alphas = [row.post_ln_layers / result.num_layers for row in result.rows]
    spread_ax.plot(alphas, [row.grad_norm_cv for row in result.rows], marker="o", linestyle="none")
    spread_ax.set(title="spread across blocks (std / mean)", xlabel="Post-LN blocks / L",
                  ylabel="coefficient of variation")
    ratios = [(a, row.post_pre_grad_ratio) for a, row in zip(alphas, result.rows)
              if row.post_pre_grad_ratio is not None]
    ratio_ax.plot([a for a, _ in ratios], [r for _, r in ratios], marker="o", linestyle="none")
    ratio_ax.axhline(result.recommendation.max_grad_ratio, color="grey", linestyle="--", label="rule's limit")
    ratio_ax.set(title="largest Post-LN block / Pre-LN mean", xlabel="Post-LN blocks / L", ylabel="ratio")
    ratio_ax.legend(fontsize="small")
    for ax in (spread_ax, ratio_ax):
        ax.grid(alpha=0.3)
    first = result.rows[0]  # a sweep has a row per distinct Post-LN count, at least one
    fig.suptitle(f"Gradient norms per block over the first {first.grad_steps} {first.gradients_from}")
    fig.savefig(path, dpi=120)


def time_rows(result: SweepResult) -> list[list[str]]:
    rows = [[f"{row.post_ln_layers} Post-LN: {key.removesuffix('_s')}", f"{seconds:.1f} s"]
            for row in result.rows for key, seconds in row.times.items()]
    if "calibration_s" in result.times:
        rows.insert(0, ["calibration (once, for every alpha)", f"{result.times['calibration_s']:.1f} s"])
    return rows


def write_sweep_report(folder: Path, result: SweepResult) -> None:
    """``folder``/report.md, report.html and the PNGs of a sweep ``result``."""
    original = result.original.scores
    images = {"sweep_perplexity.png": (plot_perplexity, "Perplexity by Post-LN ratio"),
              "sweep_layer_drop.png": (plot_layer_drop, "Layer-drop profiles"),
              "sweep_gradients.png": (plot_gradients, "Gradient-norm spread by Post-LN ratio")}
    for name, (plot, _) in images.items():
        plot(result, Path(folder) / name)
    budget = (f"heal {result.heal_tokens:,} tokens, train {result.train_tokens:,} tokens x {result.seeds} "
              f"seed(s); perplexities on {original.data}, {original.tokens:,} tokens in windows of "
              f"{original.seq_len} (per document: each document from its first token)")
    blocks = [
        ("h1", "Mix-LN alpha sweep"), ("p", f"`{result.source}`, {result.num_layers} blocks; {budget}."),
        ("h2", "Recommendation"), ("ul", verdict_sentences(result)),
        ("h2", "Per alpha"),
        ("p", f"Original: perplexity {original.perplexity:,.2f}, per document "
              f"{original.per_document_perplexity:,.2f}. Ratios are to the original."),
        ("table", ["alpha", "Post-LN blocks", "converted", "converted, per document", "healed", "healed, per document",
                   "trained (validation)", "gradient CV", "max Post/Pre gradient", "rule"], table_rows(result)),
        ("h2", "Figures"), *(("img", name, caption) for name, (_, caption) in images.items()),
        ("h2", "Time"), ("table", ["stage", "wall time on this machine"], time_rows(result)),
    ]
    write_report(folder, blocks)
