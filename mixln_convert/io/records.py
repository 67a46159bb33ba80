"""What the commands leave in their folders, read and written here: metrics and analyses. Each reader
checks what its callers use; a failure is one line naming the file and key. (A trained arm's summary:
:mod:`mixln_convert.training.summary`; a run folder's claim, its record and its stages:
:mod:`mixln_convert.workflows.runs`.)
"""

import json
from pathlib import Path

from ..errors import MixLNError
from ..limits import is_finite_number
from .atomic import write_atomic

METRICS, ANALYSIS = "metrics.jsonl", "analysis.json"


def write_json(file: Path, value, indent: int = 2) -> None:
    """``value`` as indented JSON with a final newline, replacing ``file`` in one step."""
    write_atomic(file, json.dumps(value, indent=indent) + "\n")


def append_metrics(folder: Path, record: dict) -> None:
    """One training record, a line of ``folder``/metrics.jsonl."""
    with open(folder / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def cut_metrics(file: Path, step: int) -> None:
    """Keep the records of ``file`` (a metrics.jsonl) up to ``step``, where a resumed run continues; a
    last line cut short by a kill is dropped, a damaged line before it is an error naming the file."""
    lines = [line for line in file.read_text(errors="replace").splitlines() if line.strip()]
    kept = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError
        except ValueError:
            if n == len(lines):
                break  # written while the process was killed
            raise MixLNError(f"{file}: line {n} is damaged (not a training record); remove it to resume") from None
        if record["step"] <= step:
            kept.append(line)
    write_atomic(file, "".join(line + "\n" for line in kept))


def read_metrics(file: Path) -> list[dict]:
    """The records of ``file`` (a metrics.jsonl), each checked; blank lines are skipped."""
    metrics = _read_jsonl(file)
    for n, record in enumerate(metrics, 1):
        if not isinstance(record, dict):
            raise MixLNError(f"{file}: record {n} is not a JSON object")
        _check_fields(record, METRIC_FIELDS, f"{file}: record {n}", required=("step", "tokens"))
    return metrics


ANALYSIS_KEYS = ("checkpoint", "num_layers", "post_ln_layers", "perplexity")
# the layer sweep's results: all of them, or none in an analysis made without ``layer_sweep``
PER_LAYER_KEYS = ("layer_drop", "angular_distance_matrix", "grad_norm_per_layer")
def _numbers(value) -> bool:
    return isinstance(value, list) and all(is_finite_number(v) for v in value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


PER_DOCUMENT_KEYS = ("documents", "tokens", "token_perplexity", "word_perplexity", "bits_per_byte")


def _task_drop(value) -> bool:
    """One task of ``analyze --task``: its metric, direction, full-model value, examples and per-layer drop."""
    return (isinstance(value, dict) and isinstance(value.get("metric"), str)
            and isinstance(value.get("higher_is_better"), bool) and is_finite_number(value.get("value"))
            and _count(value.get("samples")) and _numbers(value.get("layer_drop")))


# what each field the report reads must hold, and how to say it
ANALYSIS_FIELDS = {
    "checkpoint": (lambda v: isinstance(v, str), "a string"),
    "num_layers": (lambda v: _count(v) and v > 0, "a positive integer"),
    "post_ln_layers": (_count, "an integer >= 0"),
    "layernorm_scaling": (lambda v: isinstance(v, bool), "true or false"),
    "perplexity": (lambda v: is_finite_number(v) and v > 0, "a positive number"),
    "layer_drop": (_numbers, "a list of numbers"),
    "angular_distance_matrix": (lambda v: isinstance(v, list) and all(_numbers(row) and row for row in v),
                                "a list of non-empty lists of numbers"),
    "grad_norm_per_layer": (_numbers, "a list of numbers"),
    "tokenizer_vocab_size": (lambda v: v is None or _count(v), "an integer"),
    "generation": (lambda v: isinstance(v, dict) and is_finite_number(v.get("repeated_4gram_share"))
                   and isinstance(v.get("continuations"), list)
                   and all(isinstance(c, dict) and isinstance(c.get("prompt"), str) and isinstance(c.get("text"), str)
                           for c in v["continuations"]),
                   "an object with repeated_4gram_share and continuations ({prompt, text})"),
    "prune_curve": (lambda v: isinstance(v, dict) and isinstance(v.get("method"), str) and _numbers(v.get("removed"))
                    and _numbers(v.get("perplexity")) and len(v["removed"]) == len(v["perplexity"]),
                    "an object with method, removed and perplexity lists of one length"),
    "task_drop": (lambda v: isinstance(v, dict) and all(_task_drop(d) for d in v.values()),
                  "an object of tasks, each with metric, higher_is_better, value, samples and a layer_drop list"),
    "per_document": (lambda v: isinstance(v, dict) and all(is_finite_number(v.get(k)) for k in PER_DOCUMENT_KEYS),
                     f"an object with numbers {', '.join(PER_DOCUMENT_KEYS)}"),
}
METRIC_FIELDS = {
    "step": (_count, "an integer >= 0"), "tokens": (_count, "an integer >= 0"),
    **{key: (is_finite_number, "a number") for key in ("loss", "val_loss", "val_ppl", "lr", "grad_norm")},
    "grad_norm_per_layer": (_numbers, "a list of numbers"),
}


PER_WINDOW_TABLES = ("loss_without_layer", "angular_distance", "grad_norm_per_layer")  # rows of one value per layer


def _check_fields(record: dict, fields: dict, where: str, required=()) -> None:
    for key in required:
        if key not in record:
            raise MixLNError(f"{where}: missing {key}")
    for key, (ok, kind) in fields.items():
        if key in record and not ok(record[key]):
            raise MixLNError(f"{where}: {key} must be {kind}, got {str(record[key])[:60]}")


def read_analysis(file: Path) -> dict:
    """``file`` (an analysis.json), checked for the keys, types and per-layer lengths the report uses."""
    analysis = read_json(file)
    if not isinstance(analysis, dict):
        raise MixLNError(f"{file}: not an analysis of `mixln-convert analyze` (not a JSON object)")
    missing = [key for key in ANALYSIS_KEYS if key not in analysis]
    if missing:
        raise MixLNError(f"{file}: not an analysis of `mixln-convert analyze` (missing {', '.join(missing)})")
    _check_fields(analysis, ANALYSIS_FIELDS, str(file))
    num_layers = analysis["num_layers"]
    if analysis["post_ln_layers"] > num_layers:
        raise MixLNError(f"{file}: post_ln_layers {analysis['post_ln_layers']} exceeds num_layers {num_layers}")
    layered = [key for key in PER_LAYER_KEYS if key in analysis]
    if layered and len(layered) < len(PER_LAYER_KEYS):
        missing = ", ".join(key for key in PER_LAYER_KEYS if key not in analysis)
        raise MixLNError(f"{file}: has {layered[0]} but not {missing} (a layer analysis has all of them)")
    for key in layered:
        if len(analysis[key]) != num_layers:
            raise MixLNError(f"{file}: {key} has {len(analysis[key])} entries for {num_layers} layers")
    if "per_window" in analysis:
        _check_per_window(analysis, file)
    for task, drop in analysis.get("task_drop", {}).items():
        if len(drop["layer_drop"]) != num_layers:
            raise MixLNError(f"{file}: task_drop.{task}.layer_drop has {len(drop['layer_drop'])} entries for "
                             f"{num_layers} layers")
    return analysis


def has_layer_metrics(analysis: dict | None) -> bool:
    """Whether ``analysis`` holds the layer sweep (layer drop, angular distances, gradient norms)."""
    return bool(analysis) and "layer_drop" in analysis


def _check_per_window(analysis: dict, file: Path) -> None:
    """The per-window values the report bootstraps from: one loss per evaluation window, and per
    window (or gradient batch) one value per layer; prune-curve losses per window likewise."""
    per_window, num_layers = analysis["per_window"], analysis["num_layers"]
    where = f"{file}: per_window"
    if not isinstance(per_window, dict) or not _numbers(per_window.get("loss")) or not per_window["loss"]:
        raise MixLNError(f"{where}: must be an object with loss, a non-empty list of numbers")
    windows = len(per_window["loss"])
    for key in PER_WINDOW_TABLES if has_layer_metrics(analysis) else ():
        table = per_window.get(key)
        if not (isinstance(table, list) and table and all(_numbers(row) and len(row) == num_layers for row in table)):
            raise MixLNError(f"{where}.{key}: must be a non-empty list of rows of {num_layers} numbers")
        if key != "grad_norm_per_layer" and len(table) != windows:
            raise MixLNError(f"{where}.{key}: {len(table)} rows for {windows} evaluation windows")
    losses = analysis.get("prune_curve", {}).get("window_losses")
    if losses is not None and not (isinstance(losses, list) and len(losses) == len(analysis["prune_curve"]["removed"])
                                   and all(_numbers(row) and len(row) == windows for row in losses)):
        raise MixLNError(f"{file}: prune_curve.window_losses: must hold one row of {windows} numbers per removal")


def read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MixLNError(f"{file}: cannot read JSON ({e})") from None


def _read_jsonl(file: Path) -> list[dict]:
    try:
        lines = file.read_text().splitlines()
    except OSError as e:
        raise MixLNError(f"{file}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise MixLNError(f"{file}: not UTF-8 text") from None
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise MixLNError(f"{file}: not one JSON object per line ({e})") from None
