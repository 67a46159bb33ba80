"""The downstream part of a comparison: lm-evaluation-harness task metrics (``analyze --task``) and per-document
perplexity (``analyze --per-document``) of each model, as numbers, tables and one task-drop figure per task."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..analysis.measures import deep_half
from ..analysis.options import AnalyzeOptions
from ..analysis.plots import save, scale_layer_drop_axis, task_drop_file
from ..io.records import NUMBER, Record
from ..schema import POSITIVE_NUMBER, TOKENS, TOKENS_OR_ZERO, Flag, String, setting
from .inputs import Model
from .render import MISSING


@dataclass(frozen=True, kw_only=True)
class DocumentFigures(Record):
    """What a comparison shows of an analysis's per-document scores."""
    documents: int = setting(kind=TOKENS)
    tokens: int = setting(kind=TOKENS)
    token_perplexity: float = setting(kind=POSITIVE_NUMBER)
    word_perplexity: float = setting(kind=POSITIVE_NUMBER)
    bits_per_byte: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class TaskNumbers(Record):
    """What a comparison shows of an analysis's task: its metric and the mean drop over the deeper half."""
    metric: str = setting(kind=String())
    value: float = setting(kind=NUMBER)
    higher_is_better: bool = setting(kind=Flag())
    samples: int = setting(kind=TOKENS_OR_ZERO)
    deep_layer_drop: float = setting(kind=NUMBER)


def downstream_numbers(model: Model) -> dict:
    """{"tasks": {task: metric, value, mean drop over the deeper half}, "per_document": ...}, the
    keys present only where the model's analysis has them."""
    analysis = model.analysis
    numbers = {}
    if analysis and analysis.task_drop is not None:
        deep = deep_half(analysis.num_layers)
        numbers.update(tasks={task: TaskNumbers(metric=drop.metric, value=drop.value,
                                                higher_is_better=drop.higher_is_better, samples=drop.samples,
                                                deep_layer_drop=float(np.mean(drop.layer_drop[deep])))
                              for task, drop in analysis.task_drop.items()})
    if analysis and analysis.per_document is not None:
        numbers.update(per_document=analysis.per_document)  # read as DocumentFigures by model_numbers
    return numbers


def downstream_blocks(numbers: dict) -> list:
    """Report blocks: a model x task table and a per-document perplexity table, each only when
    some model has its numbers (``numbers``: label -> compare's ModelNumbers)."""
    blocks = []
    if tasks := list(dict.fromkeys(task for f in numbers.values() for task in f.tasks or {})):
        metrics = {task: next(f.tasks[task] for f in numbers.values() if task in (f.tasks or {})) for task in tasks}
        header = ["model", "layout", *(f"{task} {m.metric} ({'higher' if m.higher_is_better else 'lower'} "
                                       "is better)" for task, m in metrics.items())]
        rows = [[f.label, f.layout, *(_task_cell(f.tasks.get(task)) for task in tasks)]
                for f in numbers.values() if f.tasks is not None]
        blocks += [("h2", "Downstream tasks"), ("table", header, rows),
                   ("p", f"lm-evaluation-harness metrics of `mixln-convert analyze {AnalyzeOptions.flag('tasks')}`; "
                         "in brackets the mean change of the metric when one block of the deeper half is skipped.")]
    if documents := [f for f in numbers.values() if f.per_document is not None]:
        rows = [[f.label, f.layout, f"{d.documents:,}", f"{d.tokens:,}", f"{d.token_perplexity:,.2f}",
                 f"{d.word_perplexity:,.2f}", f"{d.bits_per_byte:.4f}"]
                for f in documents for d in [f.per_document]]
        blocks += [("h2", "Per-document perplexity"),
                   ("table", ["model", "layout", "documents", "tokens", "token perplexity", "word perplexity",
                              "bits per byte"], rows),
                   ("p", "Each held-out document scored on its own from its first token (`analyze "
                         f"{AnalyzeOptions.flag('per_document')}`, lm-evaluation-harness's rolling loglikelihood).")]
    return blocks


def _task_cell(task: TaskNumbers | None) -> str:
    return MISSING if task is None else f"{task.value:.4g} ({task.deep_layer_drop:+.3g}; n={task.samples})"


def plot_task_drops(models: list[Model], folder: Path) -> dict[str, str]:
    """One figure per task, every model with that task overlaid; returns {file name: caption}."""
    tasks = list(dict.fromkeys(task for m in models if m.analysis for task in m.analysis.task_drop or {}))
    written = {}
    for task in tasks:
        fig = Figure(figsize=(8, 5.5), layout="constrained")
        ax = fig.add_subplot()
        values = []
        for i, m in enumerate(models):
            drop = ((m.analysis and m.analysis.task_drop) or {}).get(task)
            if drop:
                ax.plot(drop.layer_drop, color=f"C{i % 10}", marker="o",
                        label=f"{m.label}, {m.layout} (full model {drop.value:.4g})")
                values += drop.layer_drop
                metric = drop.metric
        title = f"Change of {task} {metric} when one block is skipped"
        ax.set(title=title, xlabel="block (layer index)", ylabel=f"{metric} change")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axhline(0, color="black", linewidth=0.8)
        ax.grid(alpha=0.3)
        scale_layer_drop_axis(ax, values)
        fig.legend(loc="outside lower center", fontsize="small")
        save(fig, Path(folder) / task_drop_file(task))
        written[task_drop_file(task)] = title
    return written


def beside_layer_drop(images: dict[str, str], task_images: dict[str, str]) -> dict[str, str]:
    """``images`` with ``task_images`` right after layer_drop.png (at the end if there is none)."""
    names = list(images)
    at = names.index("layer_drop.png") + 1 if "layer_drop.png" in names else len(names)
    return {**{n: images[n] for n in names[:at]}, **task_images, **{n: images[n] for n in names[at:]}}
