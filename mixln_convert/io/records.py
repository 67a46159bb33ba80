"""What the commands leave in their folders, read and written here: JSON, training metrics, and
:class:`Result`, the base of each typed result file (a trained arm's summary,
:mod:`mixln_convert.training.summary`; an analysis, :mod:`mixln_convert.analysis.result`). Each reader checks
what its callers use; a failure is one line naming the file and key. (A run folder's claim, its record and
its stages: :mod:`mixln_convert.workflows.runs`.)
"""

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import MixLNError
from ..limits import MAX_TOKENS
from ..schema import TOKENS_OR_ZERO, ByName, Count, Flag, Number, Numbers, Shaped, String, read_record, setting
from .atomic import write_atomic

METRICS = "metrics.jsonl"


def write_json(file: Path, value, indent: int = 2) -> None:
    """``value`` as indented JSON with a final newline, replacing ``file`` in one step."""
    write_atomic(file, json.dumps(value, indent=indent) + "\n")


def append_metrics(file: Path, record: "Record") -> None:
    """One record of a training or heal, a line of ``file`` (metrics.jsonl, heal_metrics.jsonl)."""
    with open(file, "a") as f:
        f.write(json.dumps(record.to_dict()) + "\n")


def cut_metrics(file: Path, step: int) -> None:
    """Keep the records of ``file`` (a metrics.jsonl) up to ``step``, where a resumed run continues; a
    last line cut short by a kill is dropped, a damaged line before it is an error naming the file."""
    lines = [line for line in file.read_text(errors="replace").splitlines() if line.strip()]
    kept = []
    for n, line in enumerate(lines, 1):
        try:
            record = read_record(MetricRecord, json.loads(line), str(file))
        except (ValueError, MixLNError):
            if n == len(lines):
                break  # written while the process was killed
            raise MixLNError(f"{file}: line {n} is damaged (not a training record); remove it to resume") from None
        if record.step <= step:
            kept.append(line)
    write_atomic(file, "".join(line + "\n" for line in kept))


def read_metrics(file: Path, what: str = "a training record") -> list["MetricRecord"]:
    """The records of ``file`` (a metrics.jsonl or heal_metrics.jsonl), each checked; blank lines are skipped."""
    try:
        lines = file.read_text().splitlines()
    except OSError as e:
        raise MixLNError(f"{file}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise MixLNError(f"{file}: not UTF-8 text") from None
    try:
        records = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise MixLNError(f"{file}: not one JSON object per line ({e})") from None
    return [read_record(MetricRecord, record, f"{file}: record {n}", what) for n, record in enumerate(records, 1)]


# what a number of a result file may be: any finite one; a list of them, one per layer (or window)
NUMBER, NUMBER_LIST = Number(), Numbers(Number(), 0, MAX_TOKENS)
PAIR = Numbers(Number(), 2, 2)  # an interval [low, high], a point [x, y]
SECONDS = ByName(Number(0))  # the seconds of each stage, by its name
STRINGS = Shaped(lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v), "a list of strings")
OBJECT = Shaped(lambda v: isinstance(v, dict), "an object")  # its readers check what they use of it
FIGURE = Shaped(lambda v: isinstance(v, (int, float)), "a number")  # a figure may be inf or nan (a diverged run)
# a model's blocks, and its leading Post-LN ones, as a result file records them
LAYER_COUNT, POST_LN_COUNT = Count(1, 10**6), Count(0, 10**6)


class Record:
    """An object of a result file: a dataclass whose fields are declared with their kinds, a nested object's
    kind :class:`~mixln_convert.schema.Nested`. :meth:`to_dict` is the object as the file holds it."""
    SPARSE: ClassVar[bool] = False  # a field that is None (not measured) is left out of the file

    def to_dict(self) -> dict:
        return {f.name: plain(value) for f in dataclasses.fields(self)
                if not ((value := getattr(self, f.name)) is None and self.SPARSE)}


def plain(value):
    """A value as JSON holds it: a record (or a list or object of them) as its own ``to_dict`` says."""
    if isinstance(value, Record):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return copy.deepcopy(value)


@dataclass(frozen=True, kw_only=True)
class MetricRecord(Record):
    """A line of metrics.jsonl or heal_metrics.jsonl (a heal's step 0: the figures before any step): a logged step's
    figures in the order written, those not measured at that step left out."""
    SPARSE = True

    step: int = setting(kind=TOKENS_OR_ZERO)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    grad_norm_per_layer: list | None = setting(None, NUMBER_LIST)
    loss: float | None = setting(None, NUMBER)
    lr: float | None = setting(None, NUMBER)
    grad_norm: float | None = setting(None, NUMBER)
    skipped: bool | None = setting(None, Flag())
    tokens_per_s: float | None = setting(None, NUMBER)
    seconds: float | None = setting(None, NUMBER)
    val_relative_error: float | None = setting(None, NUMBER)
    val_loss: float | None = setting(None, NUMBER)
    val_ppl: float | None = setting(None, NUMBER)
    val_doc_ppl: float | None = setting(None, NUMBER)
    val_window_losses: list | None = setting(None, NUMBER_LIST)


class Result(Record):
    """A result file a command writes and its readers read back (``FILE`` in a folder): a dataclass whose
    fields are declared with their kinds (:func:`~mixln_convert.schema.setting`), which :meth:`read` checks,
    then :meth:`check` what the fields say of each other. A field of a newer version is ignored; one an older
    version did not write is its default."""
    FILE: ClassVar[str]
    WHAT: ClassVar[str]  # what the file is, in errors: "an analysis of `mixln-convert analyze`"

    def write(self, folder: Path) -> None:
        write_json(folder / self.FILE, self.to_dict())

    @classmethod
    def read(cls, file: Path):
        """``file``, each field checked: one line naming the file and key if not."""
        result = read_record(cls, read_json(file), str(file), cls.WHAT)
        result.check(file)
        return result

    def check(self, file: Path) -> None:
        """What the fields say of each other, checked (a MixLNError naming ``file``)."""


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: the kind of run begun in a folder (a workflow's, or a heal's work folder) and its settings
    ({flag: JSON value}), what --resume matches."""
    kind: str = setting(kind=String())
    settings: dict = setting(kind=OBJECT)


def changed_setting(settings: dict, recorded: dict) -> tuple[str, object, object] | None:
    """The first setting of ``settings`` that differs from ``recorded`` (what a run began with, read back from
    JSON), as (key, recorded value, value now); a key only one of them has differs too. None: all the same."""
    now = json.loads(json.dumps(settings))  # as the record reads back (tuples become lists)
    for key in [*now, *(key for key in recorded if key not in now)]:
        if now.get(key) != recorded.get(key):
            return key, recorded.get(key), now.get(key)
    return None


def read_json(file: Path):
    """``file``'s JSON value; one line naming the file if it is missing or no JSON."""
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise MixLNError(f"{file}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MixLNError(f"{file}: unreadable JSON ({e})") from None
