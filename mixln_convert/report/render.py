"""report.md and a self-contained report.html (figures embedded as base64) from one list of blocks.

A block is ("h1"|"h2"|"p", text), ("ul", [texts]), ("table", header, rows) or ("img", file, caption);
text may hold `code` spans.
"""

import base64
import html
import re
from pathlib import Path

from ..options import measured_on
from .downstream import downstream_blocks
from .inputs import PRUNE_FRACTIONS, Model

MISSING = "—"
PPL_NOTE = ("Validation perplexity is measured by the training run (summary.json, metrics.jsonl), analysis "
            "perplexity by `mixln-convert analyze` (analysis.json), each on the text, token count and block "
            "length in its 'measured on' column; at the defaults both score the same blocks and agree. Brackets: "
            "95% bootstrap interval over the evaluation blocks.")


def _ppl(value) -> str:
    return MISSING if value is None else f"{value:,.2f}"


def _duration(seconds) -> str:
    if seconds is None:
        return MISSING
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _ppl_interval(f: dict, name: str) -> str:
    value = f.get(name)
    if value is None:
        return MISSING
    if (interval := f["intervals"].get(name)) is None:
        return _ppl(value)
    return f"{_ppl(value)} [{interval[0]:,.2f}, {interval[1]:,.2f}]"


def _where(where: dict | None) -> str:
    return measured_on(where) if where else MISSING


def perplexity_rows(models: list[Model], numbers: dict) -> list[list[str]]:
    """One row per stage: each arm before and after training, each analysis-only model once."""
    rows = []
    for m in models:
        f = numbers[m.label]
        analysed = _ppl_interval(f, "perplexity")
        analysis_where = _where(f.get("evaluation"))
        if not m.arm:
            rows.append([m.label, m.layout, f"analysed: {Path(m.analysis['checkpoint']).name}", MISSING, MISSING,
                         analysed, analysis_where, MISSING, MISSING])
            continue
        start = "before training (original)" if m.arm == "preln" else "before training (converted)"
        validation_where = _where(f.get("validation"))
        rows.append([m.label, m.layout, start, _ppl(f["initial_val_ppl"]), validation_where, MISSING, MISSING, "0",
                     MISSING])
        rows.append([m.label, m.layout, "after training" if f["finished"] else "training (unfinished)",
                     _ppl_interval(f, "final_val_ppl"), validation_where, analysed,
                     analysis_where if m.analysis else MISSING, f"{f['tokens_trained']:,}",
                     _duration(f["wall_time_s"])])
    return rows


def prune_rows(numbers: dict) -> list[list[str]]:
    """Perplexity of each model with a pruning curve at N = L/8, L/4, L/2 removed blocks."""
    rows = []
    for f in numbers.values():
        if "prune" in f:
            cells = [MISSING if point is None else f"{point[1]:,.2f} (N={point[0]}, {point[1] / f['perplexity']:.2f}x)"
                     for point in f["prune"].values()]
            rows.append([f["label"], f["prune_method"], _ppl(f["perplexity"]), *cells])
    return rows


def continuation_rows(models: list[Model], shown: int = 3) -> list[list[str]]:
    """The first ``shown`` prompts, one row each, with every generating model's continuation."""
    writers = [m.analysis["generation"]["continuations"] for m in models if m.analysis and "generation" in m.analysis]
    if not writers:
        return []
    rows = []
    for i, first in enumerate(writers[0][:shown]):
        texts = [w[i]["text"] if i < len(w) and w[i]["prompt"] == first["prompt"] else MISSING for w in writers]
        rows.append([first["prompt"], *(" ".join(t.split())[:160] for t in texts)])
    return rows


def report_blocks(models: list[Model], numbers: dict, summary: list[str], notes: list[str], images: dict) -> list:
    """The report, in order: summary, tables, numbers, inputs, notes."""
    blocks = [("h1", "Mix-LN comparison"), ("h2", "Summary"), ("ul", summary),
              ("h2", "Perplexity"),
              ("table", ["model", "layout", "stage", "validation perplexity", "measured on", "analysis perplexity",
                         "measured on", "tokens trained", "this machine's wall time (not a speed comparison)"],
               perplexity_rows(models, numbers)),
              ("p", PPL_NOTE)]
    if rows := prune_rows(numbers):
        blocks += [("h2", "Pruning"),
                   ("table", ["model", "blocks chosen by", "full model", *(f"N = {n}" for n in PRUNE_FRACTIONS)], rows)]
    if rows := continuation_rows(models):
        writers = [m for m in models if m.analysis and "generation" in m.analysis]
        blocks += [("h2", "What the models write"),
                   ("p", "Greedy continuations of the first fixed prompts (`analyze --generate`; all of them in "
                         "analysis.json), cut at 160 characters."),
                   ("table", ["prompt", *(m.label for m in writers)], rows)]
    blocks += downstream_blocks(numbers)
    if images:
        blocks.append(("h2", "Figures"))
        blocks += [("img", name, caption) for name, caption in images.items()]
    blocks += [("h2", "Inputs"), ("ul", [f"{m.label}: `{m.source}`" for m in models])]
    if notes:
        blocks += [("h2", "Warnings"), ("ul", notes)]
    return blocks


def to_markdown(blocks: list) -> str:
    """GitHub-flavoured Markdown of ``blocks``; images are linked beside the file."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append(f"{'#' * int(kind[1])} {content[0]}")
        elif kind == "p":
            parts.append(content[0])
        elif kind == "ul":
            parts.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "table":
            header, rows = content
            lines = [header, ["---"] * len(header), *rows]
            cells = ([str(c).replace("|", "\\|") for c in line] for line in lines)  # a | in a label is no column
            parts.append("\n".join("| " + " | ".join(line) + " |" for line in cells))
        else:  # img
            name, caption = content
            parts.append(f"**{caption}**\n\n![{caption}]({name})")
    return "\n\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(str(text)))


def to_html(blocks: list, folder: Path) -> str:
    """HTML of ``blocks`` with the images of ``folder`` embedded, so the file stands alone."""
    body = []
    for kind, *content in blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{_inline_html(content[0])}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in content[0]) + "</ul>")
        elif kind == "table":
            header, rows = content
            head = "".join(f"<th>{_inline_html(c)}</th>" for c in header)
            cells = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
        else:  # img
            name, caption = content
            data = base64.b64encode((folder / name).read_bytes()).decode()
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
                        f"<figcaption>{_inline_html(caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
             "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
             "img{max-width:100%}figcaption{color:#555}code{background:#f3f3f3}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Mix-LN comparison</title>'
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(folder: Path, models: list[Model], numbers: dict, summary: list[str], notes: list[str],
                 images: dict) -> None:
    """Write ``folder``/report.md and report.html; ``images`` ({file: caption}) are already in ``folder``."""
    blocks = report_blocks(models, numbers, summary, notes, images)
    (folder / "report.md").write_text(to_markdown(blocks))
    (folder / "report.html").write_text(to_html(blocks, folder))
