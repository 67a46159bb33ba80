"""Figures of an analysis, one PNG per metric; matplotlib's object API renders on the Agg canvas: no
pyplot state, no display needed."""

import re
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..evaluation.options import measured_on
from .result import Analysis

PRE_LN, POST_LN = "tab:blue", "tab:orange"
ANGULAR_DISTANCE = "angular distance arccos(cos) / pi"
LAYER_DROP = "perplexity increase (% of the full model's)"  # every layer-drop figure's unit


def checkpoint_name(checkpoint) -> str:
    """The name a figure gives a checkpoint: a Hub snapshot's repository (ORG/NAME), else its folder (or
    file) with the folder above it, so the trained arms read 'mixln/final' and 'preln/final', not 'final'."""
    path = Path(str(checkpoint))
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _fit(text, width: float, renderer) -> None:
    """Wrap ``text`` (a title) until it is no wider than ``width`` pixels."""
    while (wide := text.get_window_extent(renderer).width) > width:
        lines = text.get_text().split("\n")
        longest = max(len(line) for line in lines)
        if longest < 10:
            return
        chars = int(longest * min(0.95, width / wide))
        text.set_text("\n".join(part for line in lines for part in _wrap(line, chars)))


def _wrap(line: str, chars: int) -> list[str]:
    """``line`` in lines of at most ``chars`` characters, broken after ': ' or ', ' where a clause fits
    ("8 windows of 256 = 2,048 tokens" stays whole), else at spaces."""
    lines = [""]
    for clause in re.split(r"(?<=[:,]) ", line):
        joined = f"{lines[-1]} {clause}" if lines[-1] else clause
        if len(joined) <= chars:
            lines[-1] = joined
        elif len(clause) <= chars:
            lines.append(clause)
        else:
            lines.extend(textwrap.wrap(clause, chars, break_on_hyphens=False))
    return [part for part in lines if part] or [""]


def fit_titles(fig) -> None:
    """Wrap a figure's title, and each panel's, where a long checkpoint or data name makes it run past the
    figure's edges (clipped) or its panel's columns (over its neighbour's)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # lay out the figure as it is saved: a panel's title is centred on the panel
    edge = fig.bbox.width
    titled = [(fig._suptitle, edge)] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        if ax.get_title() and (spec := ax.get_subplotspec()) is not None:
            titled.append((ax.title, edge * len(spec.colspan) / spec.get_gridspec().ncols))
    for text, column in titled:
        box = text.get_window_extent(renderer)
        centre = (box.x0 + box.x1) / 2
        _fit(text, 0.97 * min(column, 2 * min(centre, edge - centre)), renderer)


def save(fig, path: Path, dpi: int = 120) -> None:
    """``fig`` as a PNG at ``path``, no title clipped."""
    fit_titles(fig)
    fig.savefig(path, dpi=dpi)


def _layer_figure(result: Analysis, title: str, ylabel: str, shade_post_ln: bool = False):
    """A figure over block index, the Post-LN blocks shaded if asked (bar plots colour them instead)."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    if shade_post_ln and result.post_ln_layers:
        ax.axvspan(-0.5, result.post_ln_layers - 0.5, color=POST_LN, alpha=0.12, label="Post-LN blocks")
    ax.set(title=f"{title}\n{checkpoint_name(result.checkpoint)}: {measured_on(result.evaluation())}",
           xlabel="block (layer index)", ylabel=ylabel, xlim=(-0.5, result.num_layers - 0.5))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    return fig, ax


def _bars(ax, values, layout) -> None:
    """One bar per block, coloured (and labelled once) by the block's kind."""
    for kind, color in (("Post-LN", POST_LN), ("Pre-LN", PRE_LN)):
        blocks = [i for i, k in enumerate(layout) if k == kind]
        if blocks:
            ax.bar(blocks, [values[i] for i in blocks], color=color, label=f"{kind} block")


def scale_layer_drop_axis(ax, values) -> None:
    """Symlog once the costs span decades (removing an early block can cost 1000x more than a late
    one); no empty negative half when no removal helped."""
    if max(abs(v) for v in values) > 100:
        ax.set_yscale("symlog", linthresh=1)
    if min(values) >= 0:
        ax.set_ylim(bottom=0)


def plot_layer_drop(result: Analysis, path: Path) -> None:
    # relative, as the compare report's layer-drop figure: one unit for both
    fig, ax = _layer_figure(result, f"Perplexity increase when one block is skipped (full model "
                                    f"{result.perplexity:.2f})", LAYER_DROP)
    relative = [100 * d / result.perplexity for d in result.layer_drop]
    _bars(ax, relative, result.layout)
    scale_layer_drop_axis(ax, relative)
    ax.legend()
    save(fig, path)


def plot_representation_change(result: Analysis, path: Path) -> None:
    fig, ax = _layer_figure(result, "How much each block changes the residual stream", "distance",
                            shade_post_ln=True)
    distances = np.array(result.angular_distance, dtype=float)  # None (no span from the last blocks): nan
    ax.plot(distances, marker="o", label=f"angular distance, inputs of blocks l and l+{result.span}")
    ax.plot(result.block_influence, marker="s", label="block influence, 1 - cos(input, output)")
    ax.set_ylim(bottom=0)
    ax.legend()
    save(fig, path)


def angular_grid(result: Analysis) -> np.ndarray:
    """The angular distance matrix as a square array, NaN where l + n runs past the last block."""
    grid = np.full((result.num_layers, result.num_layers), np.nan)
    for l, row in enumerate(result.angular_distance_matrix):
        grid[l, :len(row)] = row
    return grid


def draw_angular_matrix(ax, result: Analysis, vmin=None, vmax=None):
    """Heatmap of ``angular_distance_matrix`` (first block l by span n) on ``ax``; returns the image.
    ``vmin``/``vmax`` give several models one colour scale."""
    num_layers = result.num_layers
    for axis in (ax.xaxis, ax.yaxis):  # block indices and spans: no 0.5 ticks on small models
        axis.set_major_locator(MaxNLocator(integer=True))
    return ax.imshow(angular_grid(result), origin="lower", cmap="viridis", aspect="auto", vmin=vmin, vmax=vmax,
                     extent=(0.5, num_layers + 0.5, -0.5, num_layers - 0.5))


def plot_angular_matrix(result: Analysis, path: Path) -> None:
    fig = Figure(figsize=(7, 6), layout="constrained")
    ax = fig.add_subplot()
    image = draw_angular_matrix(ax, result)
    fig.colorbar(image, ax=ax, label=ANGULAR_DISTANCE)
    ax.set(title=f"Angular distance between the inputs of blocks l and l+n\n{checkpoint_name(result.checkpoint)}: "
                 f"{measured_on(result.evaluation())}",
           xlabel="span n (blocks)", ylabel="first block l")
    save(fig, path)


def plot_grad_norms(result: Analysis, path: Path) -> None:
    batches = len(result.per_window.grad_norm_per_layer)
    fig, ax = _layer_figure(result, f"Gradient norm of each block's parameters (LM loss), mean over {batches} batches",
                            "gradient L2 norm")
    _bars(ax, result.grad_norm_per_layer, result.layout)
    ax.set_yscale("log")
    ax.legend()
    save(fig, path)


def plot_prune_curve(result: Analysis, path: Path) -> None:
    curve = result.prune_curve
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    perplexity = [result.perplexity, *curve.perplexity]
    ax.plot([0, *curve.removed], perplexity, marker="o", label=f"blocks chosen by '{curve.method}'")
    ax.set(title=f"Perplexity after removing N blocks\n{checkpoint_name(result.checkpoint)}: "
                 f"{measured_on(result.evaluation())}",
           xlabel="blocks removed N", ylabel="perplexity",
           yscale="log" if max(perplexity) > 10 * min(perplexity) else "linear")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def task_drop_file(task: str) -> str:
    """The PNG of ``task``'s layer drop; a task name may hold characters a file name should not."""
    return "task_drop_" + re.sub(r"[^\w.-]", "_", task) + ".png"


def plot_task_drop(result: Analysis, task: str, path: Path) -> None:
    drop = result.task_drop[task]
    better = "higher" if drop.higher_is_better else "lower"
    fig, ax = _layer_figure(result, f"Change of {task} {drop.metric} when one block is skipped",
                            f"{drop.metric} change (full model {drop.value:.4g}; {better} is better)")
    _bars(ax, drop.layer_drop, result.layout)
    scale_layer_drop_axis(ax, drop.layer_drop)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.legend()
    save(fig, path)


PLOTS = {
    "layer_drop.png": plot_layer_drop,
    "representation_change.png": plot_representation_change,
    "angular_distance_matrix.png": plot_angular_matrix,
    "grad_norm_per_layer.png": plot_grad_norms,
}


def plot_analysis(result: Analysis, folder: Path) -> None:
    """Write every figure ``result`` has data for into ``folder``."""
    plots = {**(PLOTS if result.layered else {}),
             **({"prune_curve.png": plot_prune_curve} if result.prune_curve is not None else {})}
    for name, plot in plots.items():
        plot(result, Path(folder) / name)
    for task in result.task_drop or {}:
        plot_task_drop(result, task, Path(folder) / task_drop_file(task))
