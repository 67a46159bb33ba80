"""A run folder (train, demo, sweep, study) held by one process from its claim to its end, its record
(``run.json``: what --resume must match, :func:`claim_run`) and its stages, each with a result a resume
reads instead of running it again (:class:`Stages`).
"""

import dataclasses
import hashlib
import json
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..errors import MixLNError
from ..io.atomic import atomic_output_dir, hold
from ..io.paths import check_destination
from ..io.records import RunRecord, changed_setting, plain, read_json, write_json
from ..options import FORCE, OUT, RESUME
from ..schema import Kind, String, read_record, setting

RECORD = "run.json"
STAGE_RESULT = "result.json"  # in each stage's folder: what a resume reads instead of running it again


@dataclass(frozen=True)
class StoredStage:
    """A stage's ``result.json``: its result (whatever the stage returns, as JSON) and that result's sha256."""
    sha256: str = setting(kind=String())
    result: object = setting(kind=Kind())


def _read(cls, file: Path, what: str, redo: str):
    """``file`` read as a record of ``cls``: one line naming it, the key, and ``redo`` if it is damaged."""
    try:
        return read_record(cls, read_json(file), str(file), what)
    except MixLNError as e:
        raise MixLNError(f"{file}: damaged ({str(e).removeprefix(f'{file}: ')}); {redo}") from None


class Claim:
    """A run folder this process holds (:func:`claim_run`): :meth:`start` makes it ready; a refusal
    (a MixLNError) before :meth:`working` undoes the claim, so the corrected rerun finds the folder as it was."""

    def __init__(self, path: Path, kind: str, settings: dict, force: bool, fresh: bool, made: bool):
        self.path, self.kind, self.settings, self.force, self.fresh = path, kind, settings, force, fresh
        self.made = made  # ``path`` did not exist before this claim (its parents are the hold's: atomic.hold)
        self.started = self.is_working = False

    def start(self) -> None:
        """Emptied with ``force``, made, and holding the record a --resume is compared with."""
        out = self.path
        self.started = True
        if self.force and out.exists() and any(out.iterdir()):
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        if not (out / RECORD).is_file():
            write_json(out / RECORD, dataclasses.asdict(RunRecord(self.kind, self.settings)), indent=1)

    def working(self) -> None:
        """From here on a failure keeps what the run wrote, for --resume to continue."""
        self.is_working = True

    def undo(self) -> None:
        """What this run wrote into a folder that held nothing of value (absent, empty or emptied by
        ``force``), removed, with the folder if the claim made it."""
        if self.made:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.started and self.fresh and self.path.is_dir():
            for made in self.path.iterdir():
                shutil.rmtree(made, ignore_errors=True) if made.is_dir() and not made.is_symlink() else made.unlink()


_HELD: list[Claim] = []  # this process's claims, outermost first (a demo holds its folder, then its train folder)


@contextmanager
def claim_run(out, kind: str, settings: dict, inputs: dict, resume: bool, force: bool = False,
              force_hint: bool = True, held: bool = True):
    """``out`` held by this process for the block (``held``: the main one of several; :func:`~.atomic.hold`)
    once it may hold this run: absent or empty; with ``force`` anything but an input (:meth:`Claim.start`
    empties it); with ``resume`` a ``kind`` run whose record holds ``settings`` ({flag: JSON value}).
    ``inputs`` ({what: path}) are never written. Yields the :class:`Claim`; nothing is written before
    :meth:`Claim.start`, and a refusal before :meth:`Claim.working` undoes what was."""
    target = check_destination(out, inputs, force=True, flag=OUT)
    made = not target.exists()
    with hold(target, f"{OUT} {out}", kind, inputs) if held else nullcontext():
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
        raise MixLNError(f"{OUT} {out}: exists and is not empty; {RESUME} continues the {kind} it holds"
                         + (f", {FORCE} starts afresh" if force_hint else ""))
    record = target / RECORD
    if not record.exists():
        raise MixLNError(f"{OUT} {out}: holds no {kind} (no {RECORD}); {RESUME} continues only a {kind} begun "
                         f"there: choose another {OUT}")
    started = _read(RunRecord, record, "a run's record", f"it holds the settings {RESUME} must match")
    if started.kind != kind:
        raise MixLNError(f"{OUT} {out}: holds a {started.kind}, not a {kind}; choose another {OUT}")
    if changed := changed_setting(settings, started.settings):
        key, was, now = changed
        raise MixLNError(f"{RESUME}: the {kind} in {out} started with {key} {_shown(was)}, not {_shown(now)}; give "
                         f"the same, or another {OUT}")


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


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
        for claim in _HELD:  # a finished stage is kept for a resume, whatever fails after it
            claim.working()
        return result

    def record(self, kind: Kind, name: str, folder: Path, work, atomic: bool = True):
        """:meth:`run` of a stage whose ``work`` returns records: written as JSON, read back (the same, or what a
        resume finds) with ``kind`` (a record's :class:`~mixln_convert.schema.Nested`, or a ``ByName`` of them)."""
        result = self.run(name, folder, lambda tmp: plain(work(tmp)), atomic)
        return kind.record(result, str(folder / STAGE_RESULT), "")


def write_checked(file: Path, result) -> None:
    """``result`` as JSON with its sha256, so :func:`read_checked` refuses an edited or damaged file."""
    write_json(file, dataclasses.asdict(StoredStage(_digest(result), result)))


def read_checked(file: Path, redo: str):
    """The result :func:`write_checked` wrote into ``file``; if it is damaged or its sha256 does not match, an
    error saying ``redo``."""
    stored = _read(StoredStage, file, "a stage's result", redo)
    if stored.sha256 != _digest(stored.result):
        raise MixLNError(f"{file}: damaged; {redo}")  # edited: its sha256 is not its result's
    return stored.result


def _digest(result) -> str:
    as_read = json.loads(json.dumps(result))  # the digest of what a resume reads back (int keys become strings)
    return hashlib.sha256(json.dumps(as_read, sort_keys=True).encode()).hexdigest()
