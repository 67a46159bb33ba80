"""Figures of a comparison: every model overlaid on one plot per metric (heatmaps side by side).

Each model keeps one colour in every figure. Same Agg-only object API as the per-model plots
of :mod:`mixln_convert.analysis.plots`, whose heatmap drawing is reused.
"""

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

from ..analysis.plots import ANGULAR_DISTANCE, draw_angular_matrix, scale_layer_drop_axis
from .inputs import Model


def _figure(title: str, xlabel: str, ylabel: str):
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))  # blocks, tokens: whole numbers
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> None:
    """Save with the legend under the plot, where it hides no curve however many models there are."""
    fig.legend(loc="outside lower center", fontsize="small")
    fig.savefig(path, dpi=120)


def _coloured(models: list[Model], has) -> list[tuple[Model, str]]:
    """The models for which ``has(model)``, each with the colour it has in every figure."""
    return [(m, f"C{i % 10}") for i, m in enumerate(models) if has(m)]


def _mark_post_ln(ax, plotted: list[tuple[Model, str]]) -> None:
    """A dotted line where each Mix-LN model's Post-LN blocks end."""
    boundaries = [(m.post_ln_layers, color) for m, color in plotted if m.post_ln_layers]
    for i, (n_post, color) in enumerate(boundaries):
        ax.axvline(n_post - 0.5, color=color, linestyle=":", label=None if i else "end of the Post-LN blocks")


def plot_training_curves(models: list[Model], path: Path) -> None:
    fig, ax = _figure("Loss during training", "tokens trained", "loss (nats per token)")
    for m, color in _coloured(models, lambda m: m.arm):
        ax.plot([r["tokens"] for r in m.metrics], [r["loss"] for r in m.metrics], color=color, alpha=0.4,
                linewidth=0.8, label=f"{m.label} training loss")
        ax.plot(*m.val_curve(), color=color, marker="o", label=f"{m.label} validation loss")
    ax.xaxis.set_major_formatter(EngFormatter())  # 500k, 1M rather than an offset 1e6
    _save(fig, path)


def plot_layer_drop(models: list[Model], path: Path) -> None:
    fig, ax = _figure("Perplexity increase when one block is skipped", "block (layer index)", "perplexity increase")
    analysed = _coloured(models, lambda m: m.analysis)
    for m, color in analysed:
        ax.plot(m.analysis["layer_drop"], color=color, marker="o",
                label=f"{m.label}, {m.layout} (full model {m.analysis['perplexity']:.2f})")
    _mark_post_ln(ax, analysed)
    scale_layer_drop_axis(ax, [d for m, _ in analysed for d in m.analysis["layer_drop"]])
    _save(fig, path)


def plot_angular_matrices(models: list[Model], path: Path) -> None:
    analysed = [m for m in models if m.analysis]
    columns = min(len(analysed), 3)
    rows = math.ceil(len(analysed) / columns)
    fig = Figure(figsize=(4.5 * columns + 1, 4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    values = np.concatenate([np.ravel(row) for m in analysed for row in m.analysis["angular_distance_matrix"]])
    for ax, m in zip(axes, analysed):  # one colour scale, so equal colours mean equal distances
        image = draw_angular_matrix(ax, m.analysis, vmin=values.min(), vmax=values.max())
        ax.set(title=f"{m.label}\n{m.layout}", xlabel="span n (blocks)", ylabel="first block l")
    for ax in axes[len(analysed):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes.tolist(), label=ANGULAR_DISTANCE)
    fig.suptitle("Angular distance between the inputs of blocks l and l+n")
    fig.savefig(path, dpi=120)


def plot_grad_norms(models: list[Model], path: Path) -> None:
    fig, ax = _figure("Gradient norm of each block's parameters", "block (layer index)", "gradient L2 norm")
    plotted = _coloured(models, lambda m: m.analysis or m.training_grad_norms())
    for m, color in plotted:
        if m.analysis:
            ax.plot(m.analysis["grad_norm_per_layer"], color=color, marker="o", label=f"{m.label} (analysis)")
        if norms := m.training_grad_norms():
            ax.plot(norms, color=color, marker="x", linestyle="--", label=f"{m.label} (last training step)")
    _mark_post_ln(ax, plotted)
    ax.set_yscale("log")
    _save(fig, path)


def plot_prune_curves(models: list[Model], path: Path) -> None:
    fig, ax = _figure("Perplexity after removing N blocks", "blocks removed N", "perplexity")
    for m, color in _coloured(models, lambda m: m.analysis and "prune_curve" in m.analysis):
        curve = m.analysis["prune_curve"]
        ax.plot([0, *curve["removed"]], [m.analysis["perplexity"], *curve["perplexity"]], color=color, marker="o",
                label=f"{m.label} (blocks chosen by '{curve['method']}')")
    ax.set_yscale("log")
    _save(fig, path)


def plot_report(models: list[Model], folder: Path) -> dict[str, str]:
    """Write every figure the models have data for into ``folder``; returns {file name: caption}."""
    trained = any(m.arm for m in models)
    analysed = any(m.analysis for m in models)
    figures = {
        "training_curves.png": (trained, plot_training_curves, "Training and validation loss of the trained arms"),
        "layer_drop.png": (analysed, plot_layer_drop, "Perplexity increase when one block is skipped"),
        "angular_distance.png": (analysed, plot_angular_matrices, "Angular distance between block inputs"),
        "grad_norm_per_layer.png": (analysed or any(m.training_grad_norms() for m in models), plot_grad_norms,
                                    "Gradient norm per block"),
        "prune_curves.png": (any(m.analysis and "prune_curve" in m.analysis for m in models), plot_prune_curves,
                             "Perplexity after removing N blocks"),
    }
    written = {}
    for name, (wanted, plot, caption) in figures.items():
        if wanted:
            plot(models, Path(folder) / name)
            written[name] = caption
    return written
