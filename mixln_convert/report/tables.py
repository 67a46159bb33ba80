"""The compare report's tables and the order of its blocks (rendered by :mod:`.render`)."""

from ..analysis.options import AnalyzeOptions
from ..analysis.plots import checkpoint_name
from ..evaluation.options import Measured, measured_on
from ..workflows.options import DemoOptions
from .compare import ModelNumbers
from .downstream import downstream_blocks
from .inputs import PRUNE_FRACTIONS, Model
from .render import MISSING
from .uncertainty import VERDICT_NOTE

PPL_NOTE = ("Validation perplexity is measured by the training run (summary.json, metrics.jsonl), analysis "
            "perplexity by `mixln-convert analyze` (analysis.json), each on the text, token count and window "
            "length in its 'measured on' column; at the defaults both score the same windows and agree. A window "
            "of S tokens scores S - 1 next-token predictions (its first token has nothing before it): W windows "
            f"hold W x S tokens, the count `{DemoOptions.flag('eval_tokens')}` asks for and the demo's console "
            "prints, and score W x (S - 1), the count each perplexity rests on. Brackets: 95% bootstrap interval "
            "over the n evaluation windows.")


def _ppl(value) -> str:
    return MISSING if value is None else f"{value:,.2f}"


def _duration(seconds) -> str:
    if seconds is None:
        return MISSING
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _ppl_interval(f: ModelNumbers, name: str) -> str:
    value = getattr(f, name)
    if value is None or (interval := f.intervals.get(name)) is None:
        return _ppl(value)
    size = f"; {f.interval_n[name]}" if name in f.interval_n else ""
    return f"{_ppl(value)} [{interval[0]:,.2f}, {interval[1]:,.2f}{size}]"


def _where(where: Measured | None) -> str:
    return measured_on(where) if where else MISSING


def start_stage(m: Model) -> str:
    """What an arm's first validation perplexity measured: the original (Pre-LN), the converted model (LNS,
    Mix-LN without a heal) or the converted and healed one (Mix-LN trains from the healed model)."""
    if m.arm == "preln":
        return "before training (original)"
    heal_tokens = m.summary.heal_tokens if m.summary else None
    if m.arm == "mixln" and heal_tokens is None:  # summaries written before it was recorded, or none yet
        return "before training (converted, healed if the run healed: not recorded)"
    if heal_tokens:
        return f"before training (converted + healed on {heal_tokens:,} tokens)"
    return "before training (converted)"


def checkpoint_names(models: list[Model]) -> dict[str, str]:
    """{label: the name of its analysed checkpoint}: :func:`checkpoint_name`, or the whole path where two
    analysed checkpoints would share a name."""
    names = {m.label: checkpoint_name(m.analysis.checkpoint) for m in models if m.analysis}
    twice = {name for name in names.values() if list(names.values()).count(name) > 1}
    return {m.label: m.analysis.checkpoint if names[m.label] in twice else names[m.label]
            for m in models if m.analysis}


def perplexity_rows(models: list[Model], numbers: dict[str, ModelNumbers]) -> list[list[str]]:
    """One row per stage: each arm before and after training, each analysis-only model once."""
    rows, names = [], checkpoint_names(models)
    for m in models:
        f = numbers[m.label]
        analysed = _ppl_interval(f, "perplexity")
        analysis_where = _where(f.evaluation)
        if not m.arm:
            rows.append([m.label, m.layout, f"analysed: {names[m.label]}", MISSING, MISSING,
                         analysed, analysis_where, MISSING, MISSING])
            continue
        validation_where = _where(f.validation)
        rows.append([m.label, m.layout, start_stage(m), _ppl(f.initial_val_ppl), validation_where, MISSING,
                     MISSING, "0", MISSING])
        rows.append([m.label, m.layout, "after training" if f.finished else "training (unfinished)",
                     _ppl_interval(f, "final_val_ppl"), validation_where, analysed, analysis_where,
                     f"{f.tokens_trained:,}", _duration(f.wall_time_s)])
    return rows


def prune_rows(numbers: dict[str, ModelNumbers]) -> list[list[str]]:
    """Perplexity of each model with a pruning curve at N = L/8, L/4, L/2 removed blocks."""
    rows = []
    for f in numbers.values():
        if f.prune is not None:
            cells = [MISSING if point is None else f"{point[1]:,.2f} (N={point[0]}, {point[1] / f.perplexity:.2f}x)"
                     for point in f.prune.values()]
            rows.append([f.label, f.prune_method, _ppl(f.perplexity), *cells])
    return rows


def continuation_rows(models: list[Model], shown: int = 3) -> list[list[str]]:
    """The first ``shown`` prompts, one row each, with every generating model's continuation."""
    writers = [m.analysis.generation.continuations for m in models if m.analysis and m.analysis.generation]
    if not writers:
        return []
    rows = []
    for i, first in enumerate(writers[0][:shown]):
        texts = [w[i].text if i < len(w) and w[i].prompt == first.prompt else MISSING for w in writers]
        rows.append([first.prompt, *(" ".join(t.split())[:160] for t in texts)])
    return rows


def report_blocks(models: list[Model], numbers: dict[str, ModelNumbers], summary: list[str], notes: list[str],
                  images: dict) -> list:
    """The report, in order: summary, tables, numbers, inputs, notes."""
    blocks = [("h1", "Mix-LN comparison"), ("h2", "Summary"), ("ul", summary), ("p", VERDICT_NOTE),
              ("h2", "Perplexity"),
              ("table", ["model", "layout", "stage", "validation perplexity", "measured on", "analysis perplexity",
                         "measured on", "tokens trained", "this machine's wall time (not a speed comparison)"],
               perplexity_rows(models, numbers)),
              ("p", PPL_NOTE)]
    if rows := prune_rows(numbers):
        blocks += [("h2", "Pruning"),
                   ("table", ["model", "blocks chosen by", "full model", *(f"N = {n}" for n in PRUNE_FRACTIONS)], rows)]
    if rows := continuation_rows(models):
        writers = [m for m in models if m.analysis and m.analysis.generation]
        blocks += [("h2", "What the models write"),
                   ("p", "Greedy continuations of the first fixed prompts (`analyze "
                         f"{AnalyzeOptions.flag('generate')}`; all of them in analysis.json), cut at 160 characters."),
                   ("table", ["prompt", *(m.label for m in writers)], rows)]
    blocks += downstream_blocks(numbers)
    if images:
        blocks += [("h2", "Figures"), *(("img", name, caption) for name, caption in images.items())]
    blocks += [("h2", "Inputs"), ("ul", [f"{m.label}: `{m.source}`" for m in models])]
    if notes:
        blocks += [("h2", "Warnings"), ("ul", notes)]
    return blocks
