"""What the commands leave in their run folders, read and written here only: metrics, summaries,
analyses, ``run.json`` (what --resume must match, :func:`claim_run`) and each stage's result
(:class:`Stages`). Each reader checks what its callers use; a failure is one line naming the file and key.
"""

import hashlib
import json
import math
import shutil
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from ..errors import MixLNError
from ..limits import is_finite_number
from .atomic import atomic_output_dir, hold, write_atomic
from .paths import check_destination

RECORD = "run.json"
STAGE_RESULT = "result.json"  # in each stage's folder: what a resume reads instead of running it again
SUMMARY, METRICS, ANALYSIS = "summary.json", "metrics.jsonl", "analysis.json"


class Claim:
    """A run folder this process holds (:func:`claim_run`): :meth:`start` makes it ready; a refusal
    (a MixLNError) before :meth:`working` undoes the claim, so the corrected rerun finds the folder as it was."""

    def __init__(self, path: Path, kind: str, settings: dict, force: bool, fresh: bool, made: Path | None):
        self.path, self.kind, self.settings, self.force, self.fresh = path, kind, settings, force, fresh
        self.made = made  # the outermost folder of ``path`` that did not exist before this claim, if any
        self.started = self.is_working = False

    def start(self) -> None:
        """Emptied with ``force``, made, and holding the record a --resume is compared with."""
        out = self.path
        self.started = True
        if self.force and out.exists() and any(out.iterdir()):
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        if not (out / RECORD).is_file():
            write_json(out / RECORD, {"kind": self.kind, "settings": self.settings}, indent=1)

    def working(self) -> None:
        """From here on a failure keeps what the run wrote, for --resume to continue."""
        self.is_working = True

    def undo(self) -> None:
        """What this run wrote into a folder that held nothing of value (absent, empty or emptied by
        ``force``), removed, with the folders the claim made."""
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)
        elif self.started and self.fresh and self.path.is_dir():
            for made in self.path.iterdir():
                shutil.rmtree(made, ignore_errors=True) if made.is_dir() and not made.is_symlink() else made.unlink()


_HELD: list[Claim] = []  # this process's claims, outermost first (a demo holds its folder, then its train folder)


def mark_working() -> None:
    """Every claim this process holds is now working (:meth:`Claim.working`): a stage inside it finished
    or began what a resume continues."""
    for claim in _HELD:
        claim.working()


@contextmanager
def claim_run(out, kind: str, settings: dict, inputs: dict, resume: bool, force: bool = False,
              force_hint: bool = True, held: bool = True):
    """``out`` held by this process for the block (``held``: the main one of several; :func:`~.atomic.hold`)
    once it may hold this run: absent or empty; with ``force`` anything but an input (:meth:`Claim.start`
    empties it); with ``resume`` a ``kind`` run whose record holds ``settings`` ({flag: JSON value}).
    ``inputs`` ({what: path}) are never written. Yields the :class:`Claim`; nothing is written before
    :meth:`Claim.start`, and a refusal before :meth:`Claim.working` undoes what was."""
    target = check_destination(out, inputs, force=True, flag="--out")
    made = next((folder for folder in reversed([target, *target.parents]) if not folder.exists()), None)
    with hold(target, f"--out {out}", kind) if held else nullcontext():
        fresh = force or not (target.is_dir() and any(target.iterdir()))
        if not fresh:
            _check_resume(out, target, kind, settings, resume, force_hint)
        claim = Claim(target, kind, settings, force, fresh, made)
        _HELD.append(claim)
        try:
            yield claim
        except MixLNError:
            if held and not claim.is_working:
                claim.undo()
            raise
        finally:
            _HELD.remove(claim)


def _check_resume(out, target: Path, kind: str, settings: dict, resume: bool, force_hint: bool) -> None:
    """A non-empty ``target`` continued: only with ``resume``, only a ``kind`` begun with ``settings``."""
    if not resume:
        raise MixLNError(f"--out {out}: exists and is not empty; --resume continues the {kind} it holds"
                         + (", --force starts afresh" if force_hint else ""))
    record = target / RECORD
    try:
        started = json.loads(record.read_text())
        kind_there, settings_there = started["kind"], started["settings"]
        if not isinstance(settings_there, dict):
            raise TypeError
    except FileNotFoundError:
        raise MixLNError(f"--out {out}: holds no {kind} (no {RECORD}); --resume continues only a {kind} begun "
                         "there: choose another --out") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise MixLNError(f"{record}: damaged; it holds the settings --resume must match") from None
    if kind_there != kind:
        raise MixLNError(f"--out {out}: holds a {kind_there}, not a {kind}; choose another --out")
    now = json.loads(json.dumps(settings))  # as the record reads back (tuples become lists)
    for key in [*now, *(key for key in settings_there if key not in now)]:
        if now.get(key) != settings_there.get(key):
            raise MixLNError(f"--resume: the {kind} in {out} started with {key} {_shown(settings_there.get(key))}, "
                             f"not {_shown(now.get(key))}; give the same, or another --out")


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


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


@contextmanager
def timed(times: dict, name: str):
    """``times[name]``: the seconds the ``with`` block took, if it ends without an error (a failed stage has none)."""
    started = time.perf_counter()
    yield
    times[name] = round(time.perf_counter() - started, 2)


class Stages:
    """The stages of a multi-stage run, each in a folder of its own: its result is written there with its
    sha256 when done and, with ``resume``, read back instead of running the stage again (an edited or
    damaged one is refused, not half read); ``times`` holds each stage's seconds."""

    def __init__(self, resume: bool):
        self.resume, self.times = resume, {}

    def run(self, name: str, folder: Path, work, atomic: bool = True, checked: bool = True):
        """``work(folder)``'s result. ``atomic``: work in a temporary folder renamed to ``folder`` when done, so an
        interrupted stage leaves nothing; else in ``folder`` itself (a stage resuming its own work: training).
        ``checked`` False: ``work`` writes its own result file last (an arm's summary.json), which the caller reads."""
        done = folder / STAGE_RESULT
        if self.resume and checked and done.is_file():
            return read_checked(done, f"remove {folder} to run this stage again")
        with timed(self.times, name):
            if atomic:
                with atomic_output_dir(folder, force=True) as tmp:
                    result = work(tmp)
                    write_checked(tmp / STAGE_RESULT, result)
            else:
                folder.mkdir(parents=True, exist_ok=True)
                result = work(folder)
                if checked:
                    write_checked(done, result)
        mark_working()  # a finished stage is kept for a resume, whatever fails after it
        return result

    def done(self, folder: Path, record: str = STAGE_RESULT) -> bool:
        """Whether a resumed run finds the stage in ``folder`` done (its result file there)."""
        return self.resume and (folder / record).is_file()


def write_checked(file: Path, result) -> None:
    """``result`` as JSON with its sha256, so :func:`read_checked` refuses an edited or damaged file."""
    write_atomic(file, json.dumps({"sha256": _digest(result), "result": result}, indent=2) + "\n")


def read_checked(file: Path, redo: str):
    """The result :func:`write_checked` wrote into ``file``; if its sha256 does not match, an error saying ``redo``."""
    try:
        stored = json.loads(file.read_text())
        if stored["sha256"] != _digest(stored["result"]):
            raise ValueError("sha256 mismatch")
        return stored["result"]
    except (OSError, ValueError, KeyError, TypeError):
        raise MixLNError(f"{file}: damaged; {redo}") from None


def _digest(result) -> str:
    as_read = json.loads(json.dumps(result))  # the digest of what a resume reads back (int keys become strings)
    return hashlib.sha256(json.dumps(as_read, sort_keys=True).encode()).hexdigest()


ANALYSIS_KEYS = ("checkpoint", "num_layers", "post_ln_layers", "perplexity")
# the layer sweep's results: all of them, or none in an analysis made without ``layer_sweep``
PER_LAYER_KEYS = ("layer_drop", "angular_distance_matrix", "grad_norm_per_layer")
# what a finished arm's summary gives every caller (train's printout, demo, sweep, study)
FINISHED = ("arm", "steps", "tokens", "wall_time_s", "initial_val_ppl", "final_val_ppl")


def read_summary(file: Path, required=FINISHED) -> dict:
    """A training arm's summary.json, its fields checked: one line naming the file and key if not."""
    summary = _read_json(file)
    if not isinstance(summary, dict):
        raise MixLNError(f"{file}: not a JSON object")
    _check_fields(summary, SUMMARY_FIELDS, str(file), required)
    if summary.get("post_ln_layers", 0) > summary.get("num_layers", math.inf):
        raise MixLNError(f"{file}: post_ln_layers {summary['post_ln_layers']} exceeds num_layers "
                         f"{summary['num_layers']}")
    return summary


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


def _evaluation(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("data"), str) and _count(value.get("tokens"))
            and _count(value.get("seq_len")) and value["seq_len"] > 1)


SUMMARY_FIELDS = {
    **{key: (is_finite_number, "a number") for key in (
        "tokens", "steps", "wall_time_s", "final_val_loss", "final_val_ppl", "initial_val_loss", "initial_val_ppl",
        "tokens_per_s")},
    **{key: ANALYSIS_FIELDS[key] for key in ("num_layers", "post_ln_layers")},
    "layernorm_scaling": (lambda v: isinstance(v, bool), "true or false"),
    "heal_tokens": (_count, "a whole number >= 0"),
    "validation": (_evaluation, "an object with data (a string), tokens and seq_len (integers)"),
    "initial_val_window_losses": (lambda v: _numbers(v) and len(v) > 0, "a non-empty list of numbers"),
    "final_val_window_losses": (lambda v: _numbers(v) and len(v) > 0, "a non-empty list of numbers"),
    "arm": (lambda v: isinstance(v, str), "a string"),
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
        return [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise MixLNError(f"{file}: not one JSON object per line ({e})") from None
