"""report.md and a self-contained report.html (figures embedded as base64) from one list of blocks.

A block is ("h1"|"h2"|"p", text), ("ul", [texts]), ("table", header, rows) or ("img", file, caption);
text may hold `code` spans.
"""

import base64
import html
import re
from pathlib import Path

from .downstream import downstream_blocks
from .inputs import PRUNE_FRACTIONS, Model

MISSING = "—"
PPL_NOTE = ("Validation perplexity is measured by the training run on its validation text (summary.json, "
            "metrics.jsonl); analysis perplexity by `mixln-convert analyze` on its own text (analysis.json). "
            "Compare within a column, not across.")


def _ppl(value) -> str:
    return MISSING if value is None else f"{value:,.2f}"


def _duration(seconds) -> str:
    if seconds is None:
        return MISSING
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def perplexity_rows(models: list[Model], numbers: dict) -> list[list[str]]:
    """One row per stage: each arm before and after training, each analysis-only model once."""
    rows = []
    for m in models:
        f = numbers[m.label]
        analysed = _ppl(f.get("perplexity"))
        if not m.arm:
            rows.append([m.label, m.layout, f"analysed: {Path(m.analysis['checkpoint']).name}", MISSING, analysed,
                         MISSING, MISSING])
            continue
        start = "before training (original)" if m.arm == "preln" else "before training (converted)"
        rows.append([m.label, m.layout, start, _ppl(f["initial_val_ppl"]), MISSING, "0", MISSING])
        rows.append([m.label, m.layout, "after training" if f["finished"] else "training (unfinished)",
                     _ppl(f["final_val_ppl"]), analysed, f"{f['tokens_trained']:,}", _duration(f["wall_time_s"])])
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


def report_blocks(models: list[Model], numbers: dict, summary: list[str], notes: list[str], images: dict) -> list:
    """The report, in order: summary, tables, numbers, inputs, notes."""
    blocks = [("h1", "Mix-LN comparison"), ("h2", "Summary"), ("ul", summary),
              ("h2", "Perplexity"),
              ("table", ["model", "layout", "stage", "validation perplexity", "analysis perplexity", "tokens trained",
                         "this machine's wall time (not a speed comparison)"], perplexity_rows(models, numbers)),
              ("p", PPL_NOTE)]
    if rows := prune_rows(numbers):
        blocks += [("h2", "Pruning"),
                   ("table", ["model", "blocks chosen by", "full model", *(f"N = {n}" for n in PRUNE_FRACTIONS)], rows)]
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
