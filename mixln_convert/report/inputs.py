"""What ``mixln-convert compare`` reads: analysis folders (``analysis.json`` of ``mixln-convert
analyze``) and train output folders (``recipe.yaml`` and one folder per arm, ``mixln-convert train``).
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MixLNError

ARM_KINDS = {"mixln": "Mix-LN", "preln": "Pre-LN", "lns": "LNS"}  # the train command's arm folders
ANALYSIS_KEYS = ("checkpoint", "num_layers", "post_ln_layers", "perplexity", "layer_drop",
                 "angular_distance_matrix", "grad_norm_per_layer")
PER_LAYER_KEYS = ("layer_drop", "angular_distance_matrix", "grad_norm_per_layer")
PRUNE_FRACTIONS = {"L/8": 8, "L/4": 4, "L/2": 2}  # removed blocks N = L // d in the pruning table


@dataclass
class Model:
    """One model of the comparison: an analysis, a trained arm, or a trained arm with its analysis."""

    label: str
    source: Path  # the argument it was read from
    analysis: dict | None = None
    arm: str | None = None  # "mixln", "preln" or "lns" when ``source`` is a train output folder
    summary: dict = field(default_factory=dict)  # the arm's summary.json; {} while the run is unfinished
    metrics: list[dict] = field(default_factory=list)  # the arm's metrics.jsonl records

    @property
    def post_ln_layers(self) -> int | None:
        """Leading Post-LN blocks; None when only an unfinished arm's name tells the kind."""
        return (self.analysis or self.summary).get("post_ln_layers")

    @property
    def kind(self) -> str:
        """'Pre-LN', 'Mix-LN', 'Post-LN' or 'LNS' (LayerNorm Scaling), from the block layout."""
        if self.post_ln_layers is None:
            return ARM_KINDS[self.arm]
        if (self.analysis or self.summary).get("layernorm_scaling"):
            return "LNS"
        num_layers = (self.analysis or self.summary)["num_layers"]
        return "Pre-LN" if self.post_ln_layers == 0 else "Post-LN" if self.post_ln_layers == num_layers else "Mix-LN"

    @property
    def layout(self) -> str:
        """The kind with its Post-LN block count, e.g. 'Mix-LN (3 of 12 blocks Post-LN)', or the scaling of LNS."""
        if self.kind == "LNS":
            return "LNS (Pre-LN, block l's norm outputs x 1/sqrt(l))"
        if self.kind != "Mix-LN" or self.post_ln_layers is None:
            return self.kind
        return f"Mix-LN ({self.post_ln_layers} of {(self.analysis or self.summary)['num_layers']} blocks Post-LN)"

    def tokens_trained(self) -> int | None:
        return self.summary.get("tokens", self.metrics[-1]["tokens"]) if self.arm else None

    def val_ppl(self, when: str) -> float | None:
        """The arm's validation perplexity ``when`` 'initial' or 'final' (the last evaluation so far)."""
        if when == "final" and "final_val_ppl" not in self.summary:
            return next((r["val_ppl"] for r in reversed(self.metrics) if "val_ppl" in r), None)
        return self.summary.get(f"{when}_val_ppl")

    def val_curve(self) -> tuple[list[int], list[float]]:
        """Tokens trained and validation loss at each evaluation, from 0 tokens where the summary has it."""
        points = [(r["tokens"], r["val_loss"]) for r in self.metrics if "val_loss" in r]
        if "initial_val_loss" in self.summary:
            points.insert(0, (0, self.summary["initial_val_loss"]))
        return [t for t, _ in points], [v for _, v in points]

    def training_grad_norms(self) -> list[float] | None:
        """The last ``grad_norm_per_layer`` logged during training."""
        return next((r["grad_norm_per_layer"] for r in reversed(self.metrics) if "grad_norm_per_layer" in r), None)


def analysis_evaluation(analysis: dict) -> dict:
    """The data, tokens and block length of an analysis (seq_len absent from older analyses)."""
    return {"data": analysis.get("data", "unknown data"), "tokens": analysis.get("tokens", 0),
            "seq_len": analysis.get("seq_len", "unknown length")}


def load_inputs(paths, labels=()) -> list[Model]:
    """The models of ``paths`` (analysis folders or files, train output folders), labelled by
    ``labels`` (one per path) or by their folder names; a train folder gives one model per arm."""
    if labels and len(labels) != len(paths):
        raise MixLNError(f"--label: {len(labels)} labels for {len(paths)} inputs; give one per input or none")
    models = []
    for path, label in zip(map(Path, paths), labels or [None] * len(paths)):
        models += _load(path, label)
    seen = {}
    for model in models:  # two folders of the same name stay apart in legends and tables
        seen[model.label] = seen.get(model.label, 0) + 1
        if seen[model.label] > 1:
            model.label += f" #{seen[model.label]}"
    return models


def _load(path: Path, label: str | None) -> list[Model]:
    name = label or path.absolute().name
    if (path.is_file() and path.suffix == ".json") or (path / "analysis.json").is_file():
        file = path if path.is_file() else path / "analysis.json"
        return [Model(label or file.absolute().parent.name, path, analysis=read_analysis(file))]
    if (path / "recipe.yaml").is_file():
        arms = [arm for arm in ARM_KINDS if (path / arm).is_dir()]
        if not arms:
            raise MixLNError(f"{path}: train output folder without an arm folder ({' or '.join(ARM_KINDS)})")
        return [_load_arm(path, arm, f"{name}/{arm}") for arm in arms]
    if not path.exists():
        raise MixLNError(f"{path}: no such file or folder")
    is_checkpoint = (path / "config.json").is_file() or path.suffix == ".gguf"
    hint = f"; run `mixln-convert analyze {path}` and compare its output" if is_checkpoint else ""
    raise MixLNError(f"{path}: neither an analysis (no analysis.json) nor a train output folder (no recipe.yaml){hint}")


def _load_arm(run: Path, arm: str, label: str) -> Model:
    folder = run / arm
    file = folder / "metrics.jsonl"
    metrics = [record for record in _read_jsonl(file) if record] if file.is_file() else []
    if not metrics:
        raise MixLNError(f"{file}: no training metrics (has the {arm} arm started training?)")
    for n, record in enumerate(metrics, 1):
        if not isinstance(record, dict):
            raise MixLNError(f"{file}: record {n} is not a JSON object")
        _check_fields(record, METRIC_FIELDS, f"{file}: record {n}", required=("step", "tokens"))
    summary = read_summary(folder / "summary.json", required=()) if (folder / "summary.json").is_file() else {}
    analysis_file = folder / "analysis" / "analysis.json"
    analysis = read_analysis(analysis_file) if analysis_file.is_file() else None
    return Model(label, run, analysis=analysis, arm=arm, summary=summary, metrics=metrics)


# what a finished arm's summary gives every caller (train's printout, demo, sweep, study)
FINISHED = ("arm", "steps", "tokens", "wall_time_s", "initial_val_ppl", "final_val_ppl")


def read_summary(file: Path, required=FINISHED) -> dict:
    """A training arm's summary.json, its fields checked: one line naming the file and key if not."""
    summary = _read_json(file)
    if not isinstance(summary, dict):
        raise MixLNError(f"{file}: not a JSON object")
    _check_fields(summary, {**SUMMARY_FIELDS, "arm": (lambda v: isinstance(v, str), "a string")}, str(file),
                  required)
    return summary


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(value) -> bool:
    return isinstance(value, list) and all(_number(v) for v in value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


PER_DOCUMENT_KEYS = ("documents", "tokens", "token_perplexity", "word_perplexity", "bits_per_byte")


def _task_drop(value) -> bool:
    """One task of ``analyze --task``: its metric, direction, full-model value, examples and per-layer drop."""
    return (isinstance(value, dict) and isinstance(value.get("metric"), str)
            and isinstance(value.get("higher_is_better"), bool) and _number(value.get("value"))
            and _count(value.get("samples")) and _numbers(value.get("layer_drop")))


# what each field the report reads must hold, and how to say it
ANALYSIS_FIELDS = {
    "checkpoint": (lambda v: isinstance(v, str), "a string"),
    "num_layers": (lambda v: _count(v) and v > 0, "a positive integer"),
    "post_ln_layers": (_count, "an integer >= 0"),
    "layernorm_scaling": (lambda v: isinstance(v, bool), "true or false"),
    "perplexity": (lambda v: _number(v) and v > 0, "a positive number"),
    "layer_drop": (_numbers, "a list of numbers"),
    "angular_distance_matrix": (lambda v: isinstance(v, list) and all(_numbers(row) for row in v),
                                "a list of lists of numbers"),
    "grad_norm_per_layer": (_numbers, "a list of numbers"),
    "tokenizer_vocab_size": (lambda v: v is None or _count(v), "an integer"),
    "generation": (lambda v: isinstance(v, dict) and _number(v.get("repeated_4gram_share"))
                   and isinstance(v.get("continuations"), list)
                   and all(isinstance(c, dict) and isinstance(c.get("prompt"), str) and isinstance(c.get("text"), str)
                           for c in v["continuations"]),
                   "an object with repeated_4gram_share and continuations ({prompt, text})"),
    "prune_curve": (lambda v: isinstance(v, dict) and isinstance(v.get("method"), str) and _numbers(v.get("removed"))
                    and _numbers(v.get("perplexity")) and len(v["removed"]) == len(v["perplexity"]),
                    "an object with method, removed and perplexity lists of one length"),
    "task_drop": (lambda v: isinstance(v, dict) and all(_task_drop(d) for d in v.values()),
                  "an object of tasks, each with metric, higher_is_better, value, samples and a layer_drop list"),
    "per_document": (lambda v: isinstance(v, dict) and all(_number(v.get(k)) for k in PER_DOCUMENT_KEYS),
                     f"an object with numbers {', '.join(PER_DOCUMENT_KEYS)}"),
}
METRIC_FIELDS = {
    "step": (lambda v: _count(v), "an integer >= 0"),
    "tokens": (lambda v: _count(v), "an integer >= 0"),
    "loss": (_number, "a number"), "val_loss": (_number, "a number"), "val_ppl": (_number, "a number"),
    "lr": (_number, "a number"), "grad_norm": (_number, "a number"),
    "grad_norm_per_layer": (_numbers, "a list of numbers"),
}
def _evaluation(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("data"), str) and _count(value.get("tokens"))
            and _count(value.get("seq_len")) and value["seq_len"] > 1)


SUMMARY_FIELDS = {
    **{key: (_number, "a number") for key in (
        "tokens", "steps", "wall_time_s", "final_val_loss", "final_val_ppl", "initial_val_loss", "initial_val_ppl",
        "tokens_per_s", "num_layers", "post_ln_layers")},
    "layernorm_scaling": (lambda v: isinstance(v, bool), "true or false"),
    "heal_tokens": (_count, "a whole number >= 0"),
    "validation": (_evaluation, "an object with data (a string), tokens and seq_len (integers)"),
    "initial_val_block_losses": (lambda v: _numbers(v) and len(v) > 0, "a non-empty list of numbers"),
    "final_val_block_losses": (lambda v: _numbers(v) and len(v) > 0, "a non-empty list of numbers"),
}
PER_BLOCK_TABLES = ("loss_without_layer", "angular_distance", "grad_norm_per_layer")  # rows of one value per layer


def _check_fields(record: dict, fields: dict, where: str, required=()) -> None:
    for key in required:
        if key not in record:
            raise MixLNError(f"{where}: missing {key}")
    for key, (ok, kind) in fields.items():
        if key in record and not ok(record[key]):
            raise MixLNError(f"{where}: {key} must be {kind}, got {str(record[key])[:60]}")


def read_analysis(file: Path) -> dict:
    """``file`` (an analysis.json), checked for the keys, types and per-layer lengths the report uses."""
    analysis = _read_json(file)
    if not isinstance(analysis, dict):
        raise MixLNError(f"{file}: not an analysis of `mixln-convert analyze` (not a JSON object)")
    missing = [key for key in ANALYSIS_KEYS if key not in analysis]
    if missing:
        raise MixLNError(f"{file}: not an analysis of `mixln-convert analyze` (missing {', '.join(missing)})")
    _check_fields(analysis, ANALYSIS_FIELDS, str(file))
    num_layers = analysis["num_layers"]
    if analysis["post_ln_layers"] > num_layers:
        raise MixLNError(f"{file}: post_ln_layers {analysis['post_ln_layers']} exceeds num_layers {num_layers}")
    for key in PER_LAYER_KEYS:
        if len(analysis[key]) != num_layers:
            raise MixLNError(f"{file}: {key} has {len(analysis[key])} entries for {num_layers} layers")
    if "per_block" in analysis:
        _check_per_block(analysis, file)
    for task, drop in analysis.get("task_drop", {}).items():
        if len(drop["layer_drop"]) != num_layers:
            raise MixLNError(f"{file}: task_drop.{task}.layer_drop has {len(drop['layer_drop'])} entries for "
                             f"{num_layers} layers")
    return analysis


def _check_per_block(analysis: dict, file: Path) -> None:
    """The per-block values the report bootstraps from: one loss per evaluation block, and per
    block (or gradient batch) one value per layer; prune-curve losses per block likewise."""
    per_block, num_layers = analysis["per_block"], analysis["num_layers"]
    where = f"{file}: per_block"
    if not isinstance(per_block, dict) or not _numbers(per_block.get("loss")) or not per_block["loss"]:
        raise MixLNError(f"{where}: must be an object with loss, a non-empty list of numbers")
    blocks = len(per_block["loss"])
    for key in PER_BLOCK_TABLES:
        table = per_block.get(key)
        if not (isinstance(table, list) and table and all(_numbers(row) and len(row) == num_layers for row in table)):
            raise MixLNError(f"{where}.{key}: must be a non-empty list of rows of {num_layers} numbers")
        if key != "grad_norm_per_layer" and len(table) != blocks:
            raise MixLNError(f"{where}.{key}: {len(table)} rows for {blocks} evaluation blocks")
    losses = analysis.get("prune_curve", {}).get("block_losses")
    if losses is not None and not (isinstance(losses, list) and len(losses) == len(analysis["prune_curve"]["removed"])
                                   and all(_numbers(row) and len(row) == blocks for row in losses)):
        raise MixLNError(f"{file}: prune_curve.block_losses: must hold one row of {blocks} numbers per removal")


def _read_json(file: Path) -> dict:
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
        return [json.loads(line) if line.strip() else {} for line in lines]
    except json.JSONDecodeError as e:
        raise MixLNError(f"{file}: not one JSON object per line ({e})") from None
