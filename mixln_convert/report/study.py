"""The from-scratch study's report (:mod:`mixln_convert.workflows.study`): a table of every arm's figures over seeds,
each claim's verdict with its numbers, the validation curves and the layer-drop and gradient-norm profiles."""

import statistics
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from ..analysis.measures import Verdict
from ..analysis.plots import scale_layer_drop_axis
from ..errors import MixLNError, shown
from ..io.records import NUMBER, NUMBER_LIST, SECONDS, STRINGS, Record, Result
from ..schema import (NONNEGATIVE, POSITIVE_NUMBER, SEED, TOKENS, TOKENS_OR_ZERO, ByName, Count, Kind, Nested, Shaped,
                      String, setting)
from .render import mean_and_range, write_report

CLAIMS = {  # claim -> (figure, the direction the paper claims for Mix-LN against Pre-LN)
    "perplexity": ("final_val_ppl", "lower"),
    "deep blocks matter more": ("deep_layer_drop", "higher"),
    "more uniform gradient norms": ("grad_norm_cv", "lower"),
}
LNS_CLAIMS = ("perplexity", "deep blocks matter more")  # the LNS paper's, of CLAIMS, for LNS against Pre-LN
SCALED_INIT = "scaled init helps"  # the claim judged for each arm when both schemes ran: "scaled init helps Pre-LN"
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")
LINESTYLES = {"scaled": "-", "plain": "--"}
MARKERS = ("o", "s", "^", "D", "v")
FIGURES = {"final_val_ppl": ("final validation perplexity", "{:.2f}"),
           "deep_layer_drop": ("deep-half layer drop (relative)", "{:.2%}"),
           "grad_norm_cv": ("gradient-norm CV across blocks", "{:.3f}")}
CURVE = Shaped(lambda v: isinstance(v, list) and all(NUMBER_LIST.ok(point) and len(point) == 2 for point in v),
               "a list of [tokens, perplexity] points")


VERDICT = Nested(Verdict, "a verdict")
BY_CLAIM = ByName(VERDICT)
BY_SCHEME = ByName(BY_CLAIM)  # {scheme: {claim: Verdict}}


class Verdicts(Kind):
    """study.json's verdicts: :data:`BY_SCHEME`'s, and beside them a verdict by each ":data:`SCALED_INIT` ARM"."""

    def describe(self) -> str:
        return "an object of verdicts by claim, by scheme"

    def record(self, value, where: str, key: str):
        if not isinstance(value, dict):
            raise MixLNError(f"{where}: {key}: must be {self.describe()}, got {shown(repr(value))}")
        return {name: (VERDICT if name.startswith(SCALED_INIT) else BY_CLAIM).record(item, where, f"{key}.{name}")
                for name, item in value.items()}


VERDICTS = Verdicts()


# kw_only: the fields keep the file's order
@dataclass(frozen=True, kw_only=True)
class StudyRow(Record):
    """One run of the study (an arm of one scheme and seed): the figures the claims are judged on."""
    scheme: str = setting(kind=String())
    seed: int = setting(kind=SEED)
    arm: str = setting(kind=String())
    folder: str = setting(kind=String())
    final_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    wall_time_s: float = setting(kind=NONNEGATIVE)
    validation_curve: list = setting(kind=CURVE)
    last_interval_change: float | None = setting(None, NUMBER)  # None with fewer than two evaluations
    relative_layer_drop: list = setting(kind=NUMBER_LIST)
    deep_layer_drop: float = setting(kind=NUMBER)
    grad_norm_per_layer: list = setting(kind=NUMBER_LIST)
    grad_norm_cv: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class StudyResult(Result):
    """``study.json``: the study's settings, every run's figures and the claims' verdicts."""
    FILE = "study.json"
    WHAT = "a study of `mixln-convert study`"

    source: str = setting(kind=String())
    recipe: str = setting(kind=String())
    overrides: list[str] = setting(kind=STRINGS)
    alpha: float = setting(kind=NUMBER)
    seeds: int = setting(kind=Count(1))
    train_data: str = setting(kind=String())
    validation_data: str = setting(kind=String())
    analysis_data: str = setting(kind=String())
    schemes: list[str] = setting(kind=STRINGS)
    arms: list[str] = setting(kind=STRINGS)  # Pre-LN first, Mix-LN second (workflows.study.arms_for)
    eval_tokens: int = setting(kind=TOKENS)
    runs: list[StudyRow] = setting(kind=Nested(StudyRow, "a study's run", many=True))
    wall_time_s: float = setting(kind=NONNEGATIVE)
    times_s: dict = setting(kind=SECONDS)
    verdicts: dict = setting(kind=VERDICTS)  # {scheme: {claim: Verdict}} and {"scaled init helps ARM": Verdict}
    lns_verdicts: dict | None = setting(None, BY_SCHEME)  # with an LNS arm only
    SPARSE = True  # lns_verdicts, the one field that may be None, left out of the file without an LNS arm


def table_rows(result: StudyResult) -> list[list[str]]:
    rows = []
    for scheme in result.schemes:
        for arm in result.arms:
            runs = [r for r in result.runs if r.scheme == scheme and r.arm == arm]
            moved = [abs(r.last_interval_change) for r in runs if r.last_interval_change is not None]
            figures = (mean_and_range([getattr(r, key) for r in runs], form) for key, (_, form) in FIGURES.items())
            rows.append([scheme, arm, *figures,
                         f"{max(moved):.1%}" if moved else "-",
                         f"{statistics.mean(r.wall_time_s for r in runs) / 60:.1f} min"])
    return rows


def _claim_sentences(result: StudyResult, found_by_scheme: dict, tested: str, paper: str) -> list[str]:
    """One sentence per scheme and claim of ``found_by_scheme`` for the arm kind ``tested`` against Pre-LN."""
    sentences = []
    for scheme in result.schemes:
        for claim, found in found_by_scheme[scheme].items():
            form = FIGURES[CLAIMS[claim][0]][1]
            sentences.append(
                f"**{claim}** ({tested}, {scheme} init): {found.outcome}. {tested} {form.format(found.tested)} "
                f"vs Pre-LN {form.format(found.baseline)} ({paper}: {found.direction} for {tested}); gap "
                f"{form.format(found.gap)}, spread between seeds {form.format(found.spread)}.")
    return sentences


def verdict_sentences(result: StudyResult) -> list[str]:
    sentences = _claim_sentences(result, result.verdicts, "Mix-LN", "the paper")
    if result.lns_verdicts is not None:
        sentences += _claim_sentences(result, result.lns_verdicts, "LNS", "the LNS paper")
    for key, found in result.verdicts.items():
        if key.startswith(SCALED_INIT):
            sentences.append(f"**{key}**: {found.outcome}. Final validation perplexity {found.tested:.2f} "
                             f"scaled vs {found.baseline:.2f} plain; gap {found.gap:.2f}, spread between "
                             f"seeds {found.spread:.2f}.")
    return sentences


def _style(result: StudyResult, scheme: str, arm: str, seed: int) -> dict:
    return {"color": COLORS[result.arms.index(arm) % len(COLORS)], "linestyle": LINESTYLES.get(scheme, ":"),
            "marker": MARKERS[seed % len(MARKERS)]}


def plot_curves(result: StudyResult, path: Path) -> None:
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for run in result.runs:  # measured evaluations as markers, joined to show each run's course
        tokens, ppl = zip(*run.validation_curve)
        ax.plot(tokens, ppl, markersize=4, linewidth=1, label=f"{run.arm}, {run.scheme} init, seed {run.seed}",
                **_style(result, run.scheme, run.arm, run.seed))
    ax.set(title="Validation perplexity of every run", xlabel="training tokens",
           ylabel="validation perplexity", yscale="log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small", ncol=2)
    fig.savefig(path, dpi=120)


def plot_profiles(result: StudyResult, path: Path) -> None:
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    drop_ax, grad_ax = fig.subplots(1, 2)
    for run in result.runs:
        style = _style(result, run.scheme, run.arm, run.seed)
        blocks = range(len(run.relative_layer_drop))
        drop_ax.plot(blocks, [100 * d for d in run.relative_layer_drop], markersize=3, linewidth=1, **style,
                     label=f"{run.arm}, {run.scheme}, seed {run.seed}")
        grad_ax.plot(blocks, run.grad_norm_per_layer, markersize=3, linewidth=1, **style)
    drop_ax.set(title="Perplexity increase when one block is removed", xlabel="block", ylabel="% of perplexity")
    scale_layer_drop_axis(drop_ax, [100 * d for run in result.runs for d in run.relative_layer_drop])
    grad_ax.set(title="Gradient norm per block (analysis batches)", xlabel="block", ylabel="gradient norm",
                yscale="log")
    for ax in (drop_ax, grad_ax):
        ax.grid(alpha=0.3)
    drop_ax.legend(fontsize="x-small", ncol=2)
    fig.savefig(path, dpi=120)


def write_study_report(folder: Path, result: StudyResult) -> None:
    """``folder``/report.md, report.html and the PNGs of a study ``result``."""
    images = {"study_curves.png": (plot_curves, "Validation curves, all runs"),
              "study_profiles.png": (plot_profiles, "Layer drop and gradient norms per block")}
    for name, (plot, _) in images.items():
        plot(result, Path(folder) / name)
    budget = (f"{result.runs[0].tokens:,} training tokens per run, {result.seeds} seed(s) per arm and scheme, recipe "
              f"`{result.recipe}` with {' '.join(result.overrides) or 'no overrides'}; trained on "
              f"{result.train_data}, validation curves on {result.validation_data}, analyses on "
              f"{result.eval_tokens:,} tokens of {result.analysis_data}")
    blocks = [
        ("h1", "Mix-LN from scratch: a like-for-like study"),
        ("p", f"Shape and tokenizer of `{result.source}`; every arm initialized by the same seeded plan "
              f"(`conversion.strategy=scratch`), scaled init on (\"scaled\") or off (\"plain\") for all arms alike; "
              f"{budget}. Wall time {result.wall_time_s / 60:.1f} min."
              + (" The LNS arm (LayerNorm Scaling, arXiv 2502.05795: every block Pre-LN, the norm outputs of "
                 "block l scaled by 1/sqrt(l)) has the same initialization, its norm gains 1 as in its paper."
                 if result.lns_verdicts is not None else "")),
        ("h2", "Verdicts"),
        ("p", "A claim is decided only when the gap between the arms' means exceeds the spread between seeds "
              "(the larger range of the two arms); otherwise it is too close to call."),
        ("ul", verdict_sentences(result)),
        ("h2", "Per arm (mean over seeds, range in brackets)"),
        ("table", ["init", "arm", *(title for title, _ in FIGURES.values()), "last eval interval moved ppl by",
                   "training time"], table_rows(result)),
        ("h2", "Figures"), *(("img", name, caption) for name, (_, caption) in images.items()),
    ]
    write_report(folder, blocks)
