"""Figures of a comparison: every model overlaid on one plot per metric (heatmaps side by side), each model in
one colour throughout; Agg-only object API, as the per-model plots of :mod:`mixln_convert.analysis.plots`."""

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

from ..analysis.plots import (ANGULAR_DISTANCE, LAYER_DROP, angular_grid, draw_angular_matrix, save,
                              scale_layer_drop_axis)
from ..evaluation.options import measured_on
from .inputs import Model


def _figure(title: str, xlabel: str, ylabel: str, measured: str = "", columns: int = 1):
    """A figure of ``columns`` panels; ``measured`` (what the figures were measured on) is a
    second title line. Returns the figure and its axes (one Axes when ``columns`` is 1)."""
    fig = Figure(figsize=(8 if columns == 1 else 6 * columns, 5.5), layout="constrained")
    axes = fig.subplots(1, columns, squeeze=False).ravel()
    for ax in axes:
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))  # blocks, tokens: whole
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}\n{measured}" if measured else title)
    return fig, axes[0] if columns == 1 else axes


def _analysed_on(models: list[Model]) -> str:
    return " / ".join(sorted({measured_on(m.analysis.evaluation()) for m in models if m.analysis}))


def _save(fig, path: Path) -> None:
    """Save with the legend under the plot, where it hides no curve however many models there are."""
    fig.legend(loc="outside lower center", fontsize="small")
    save(fig, path)


def _coloured(models: list[Model], has) -> list[tuple[Model, str]]:
    """The models for which ``has(model)``, each with the colour it has in every figure."""
    return [(m, f"C{i % 10}") for i, m in enumerate(models) if has(m)]


def _mark_post_ln(ax, plotted: list[tuple[Model, str]], legend: bool = True) -> None:
    """A dotted line where each Mix-LN model's Post-LN blocks end."""
    boundaries = [(m.post_ln_layers, color) for m, color in plotted if m.post_ln_layers]
    for i, (post_ln_layers, color) in enumerate(boundaries):
        ax.axvline(post_ln_layers - 0.5, color=color, linestyle=":",
                   label="end of the Post-LN blocks" if legend and not i else None)


def plot_training_curves(models: list[Model], path: Path) -> None:
    trained = _coloured(models, lambda m: m.arm)
    validations = {measured_on(m.summary.validation) for m, _ in trained if m.summary and m.summary.validation}
    fig, ax = _figure("Loss during training", "tokens trained", "loss (nats per token)",
                      "validation: " + " / ".join(sorted(validations)) if validations else "")
    for m, color in trained:
        tokens, losses = [r.tokens for r in m.metrics], [r.loss for r in m.metrics]
        # each logged step's own minibatch: a line once there are enough to show a trend, else markers
        ax.plot(tokens, losses, color=color, alpha=0.4, linewidth=0.8, marker="." if len(tokens) < 20 else None,
                label=f"{m.label} training loss (logged steps)")
        ax.plot(*m.val_curve(), color=color, marker="o", linestyle="none",
                label=f"{m.label} validation loss (each evaluation)")
    ax.xaxis.set_major_formatter(EngFormatter())  # 500k, 1M rather than an offset 1e6
    _save(fig, path)


def plot_layer_drop(models: list[Model], path: Path) -> None:
    # relative, so models whose full-model perplexities differ share one scale
    fig, ax = _figure("Perplexity increase when one block is skipped, relative to the full model",
                      "block (layer index)", LAYER_DROP, _analysed_on(models))
    analysed = _coloured(models, lambda m: m.layered)
    relative = {}
    for m, color in analysed:
        relative[m.label] = [100 * d / m.analysis.perplexity for d in m.analysis.layer_drop]
        ax.plot(relative[m.label], color=color, marker="o",
                label=f"{m.label}, {m.layout} (full model {m.analysis.perplexity:.2f})")
    _mark_post_ln(ax, analysed)
    scale_layer_drop_axis(ax, [v for curve in relative.values() for v in curve])
    _save(fig, path)


def plot_angular_matrices(models: list[Model], path: Path) -> None:
    """Each model's heatmap on one colour scale; beside each after the first, its difference from
    the first model (same block count), where maps that look alike differ."""
    analysed = [m for m in models if m.layered]
    reference = analysed[0]
    differences = [m for m in analysed[1:] if m.analysis.num_layers == reference.analysis.num_layers]
    columns = 2 if differences else 1
    fig = Figure(figsize=(5 * columns + 1.5, 4 * len(analysed) + 0.8), layout="constrained")
    axes = fig.subplots(len(analysed), columns, squeeze=False)
    values = np.concatenate([np.ravel(row) for m in analysed for row in m.analysis.angular_distance_matrix])
    for row, m in zip(axes, analysed):  # one colour scale, so equal colours mean equal distances
        image = draw_angular_matrix(row[0], m.analysis, vmin=values.min(), vmax=values.max())
        row[0].set(title=f"{m.label}\n{m.layout}", xlabel="span n (blocks)", ylabel="first block l")
    fig.colorbar(image, ax=axes[:, 0].tolist(), label=ANGULAR_DISTANCE)
    if differences:
        grids = {m.label: angular_grid(m.analysis) - angular_grid(reference.analysis) for m in differences}
        limit = max(np.nanmax(np.abs(g)) for g in grids.values()) or 1.0
        axes[0, 1].set_axis_off()
        axes[0, 1].text(0.5, 0.5, f"differences from\n{reference.label}", ha="center", va="center",
                        transform=axes[0, 1].transAxes)
        for row, m in zip(axes[1:], analysed[1:]):
            if m.label not in grids:  # another block count: nothing to subtract
                row[1].set_axis_off()
                continue
            n = m.analysis.num_layers
            shown = row[1].imshow(grids[m.label], origin="lower", cmap="RdBu_r", aspect="auto", vmin=-limit,
                                  vmax=limit, extent=(0.5, n + 0.5, -0.5, n - 0.5))
            row[1].set(title=f"{m.label} minus {reference.label}", xlabel="span n (blocks)", ylabel="first block l")
        fig.colorbar(shown, ax=axes[:, 1].tolist(), label="difference of angular distance")
    fig.suptitle(f"Angular distance between the inputs of blocks l and l+n\n{_analysed_on(models)}")
    save(fig, path)


def plot_grad_norms(models: list[Model], path: Path) -> None:
    """Two panels, since they measure different things: the analysis's gradient (held-out windows,
    mean over its batches, the spread across batches as bars) and the last logged training step's."""
    fig, (analysis_ax, training_ax) = _figure("Gradient norm of each block's parameters", "block (layer index)",
                                              "gradient L2 norm", columns=2)
    analysed = _coloured(models, lambda m: m.layered)
    for m, color in analysed:
        norms = np.asarray(m.analysis.grad_norm_per_layer)
        batches = np.asarray(m.analysis.per_window.grad_norm_per_layer if m.analysis.per_window else [norms])
        spread = np.clip([norms - batches.min(axis=0), batches.max(axis=0) - norms], 0, None)  # a hand-edited file
        spread_of = f"mean of {len(batches)} batches, bars min-max" if m.analysis.per_window else "one gradient"
        analysis_ax.errorbar(range(len(norms)), norms, yerr=spread, color=color, marker="o", capsize=2,
                             label=f"{m.label} (analysis, {spread_of})")
    analysis_ax.set_title(f"analysis: LM loss on held-out text\n{_analysed_on(models)}", fontsize="medium")
    _mark_post_ln(analysis_ax, analysed)
    trained = _coloured(models, lambda m: m.last_norms())
    for m, color in trained:
        training_ax.plot(m.last_norms().grad_norm_per_layer, color=color, marker="x", linestyle="--",
                         label=f"{m.label} (training step {m.last_norms().step})")
    training_ax.set_title("training: the last logged step's minibatch" if trained else "training: none logged",
                          fontsize="medium")
    _mark_post_ln(training_ax, trained, legend=not analysed)
    for ax, plotted in ((analysis_ax, analysed), (training_ax, trained)):
        if plotted:
            ax.set_yscale("log")
    _save(fig, path)


def plot_prune_curves(models: list[Model], path: Path) -> None:
    fig, ax = _figure("Perplexity after removing N blocks", "blocks removed N", "perplexity", _analysed_on(models))
    for m, color in _coloured(models, lambda m: m.analysis and m.analysis.prune_curve is not None):
        curve = m.analysis.prune_curve
        ax.plot([0, *curve.removed], [m.analysis.perplexity, *curve.perplexity], color=color, marker="o",
                label=f"{m.label} (blocks chosen by '{curve.method}')")
    ax.set_yscale("log")
    _save(fig, path)


def plot_report(models: list[Model], folder: Path) -> dict[str, str]:
    """Write every figure the models have data for into ``folder``; returns {file name: caption}."""
    trained = any(m.arm for m in models)
    analysed = any(m.layered for m in models)
    figures = {
        "training_curves.png": (trained, plot_training_curves, "Training and validation loss of the trained arms"),
        "layer_drop.png": (analysed, plot_layer_drop, "Perplexity increase when one block is skipped"),
        "angular_distance.png": (analysed, plot_angular_matrices, "Angular distance between block inputs"),
        "grad_norm_per_layer.png": (analysed or any(m.last_norms() for m in models), plot_grad_norms,
                                    "Gradient norm per block"),
        "prune_curves.png": (any(m.analysis and m.analysis.prune_curve is not None for m in models), plot_prune_curves,
                             "Perplexity after removing N blocks"),
    }
    written = {}
    for name, (wanted, plot, caption) in figures.items():
        if wanted:
            plot(models, Path(folder) / name)
            written[name] = caption
    return written
