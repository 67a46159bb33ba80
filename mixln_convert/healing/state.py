"""A heal's work folder, ``.OUT.heal`` beside its output: what ``--resume`` continues.

It holds ``run.json`` (what the heal was started with: the pair's and the data's fingerprints and every
setting that changes the result), ``heal_metrics.jsonl`` as it is written, and ``step-N.pt`` every
``checkpoint_interval`` steps: the Post-LN blocks, AdamW's state, the schedule, the step guard, the
seconds spent and the RNG, each file written whole or not at all. A batch is a pure function of its
step (:class:`~mixln_convert.data.PackedWindows`), so the step is the data position. The folder goes
when the healed checkpoint is in place; a heal killed before its first checkpoint leaves nothing a
later run must continue.
"""

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import MixLNError, first_line, warn
from ..io.atomic import write_atomic
from ..io.paths import check_not_input
from ..io.records import (MetricRecord, RunRecord, append_metrics, changed_setting, cut_metrics, read_metrics,
                          write_json)
from ..options import FORCE, OUT, RESUME
from ..schema import read_record

RECORD = "run.json"
KIND = "mixln-convert heal"  # the record's "kind": a folder without it is not a heal's to remove
METRICS = "heal_metrics.jsonl"
KEEP = 2  # checkpoints kept: the last, and the one before it should the last be damaged


@dataclass(frozen=True)
class Saved:
    """A checkpoint of the heal (``step-N.pt``): the Post-LN blocks' weights and the states it continues from."""
    step: int
    seconds: float
    blocks: dict
    optimizer: dict
    scheduler: dict
    guard: dict
    rng: object


class HealState:
    def __init__(self, out: Path):
        out = Path(out).absolute()
        self.folder = out.with_name(f".{out.name}.heal")
        self.owned = False  # made or continued by this run: the only folder it may remove

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, file) of every complete checkpoint, by step."""
        found = self.folder.glob("step-*.pt") if self.folder.is_dir() else ()
        return sorted((int(f.stem[5:]), f) for f in found if f.stem[5:].isdigit())

    def check(self, settings: dict, resume: bool, force: bool, out, inputs: dict) -> bool:
        """Whether this heal continues the one in the folder: only with ``resume``, only one begun with
        ``settings``. ``force`` discards it; a folder without a checkpoint holds nothing to continue. A folder
        of that name that is no heal's (or an input, ``inputs``: {what: path}) is refused, never removed."""
        if not (self.folder.exists() or self.folder.is_symlink()):
            return False
        check_not_input(self.folder, inputs, f"{OUT} {out}: the heal's work folder")
        file = self.folder / RECORD
        try:
            record = json.loads(file.read_text())
        except (OSError, ValueError):
            record = None
        # a heal's by its kind alone: one whose settings are damaged is still the heal's, for force to remove
        ours = isinstance(record, dict) and record.get("kind") == KIND
        if self.folder.is_symlink() or not self.folder.is_dir() or (not ours and any(self.folder.iterdir())):
            raise MixLNError(f"{OUT} {out}: {self.folder} exists and is not a heal's work folder; remove it or "
                             f"choose another {OUT}")
        if not self.checkpoints() or force:
            shutil.rmtree(self.folder)
            return False
        step = self.checkpoints()[-1][0]
        if not resume:
            raise MixLNError(f"{OUT} {out}: a heal of it was interrupted at step {step} ({self.folder}); {RESUME} "
                             f"continues it, {FORCE} starts afresh")
        try:
            started = read_record(RunRecord, record, str(file), "a heal's record")
        except MixLNError as e:
            raise MixLNError(f"{file}: damaged ({str(e).removeprefix(f'{file}: ')}); it holds the settings {RESUME} "
                             f"must match: {FORCE} starts afresh") from None
        changed = changed_setting(settings, started.settings)
        if changed:
            key, was, now = changed  # a long value is cut by MixLNError
            raise MixLNError(f"{RESUME}: the heal in {self.folder} started with {key} {json.dumps(was)}, not "
                             f"{json.dumps(now)}; give the same, or {FORCE} to start afresh")
        self.owned = True
        return True

    def start(self, settings: dict, before: MetricRecord) -> None:
        """A fresh folder: the record, and the metrics' first line (step 0's, the figures ``before`` any step)."""
        self.folder.mkdir()
        self.owned = True
        write_json(self.folder / RECORD, dataclasses.asdict(RunRecord(KIND, settings)), indent=1)
        write_atomic(self.folder / METRICS, json.dumps(before.to_dict()) + "\n")

    def save(self, saved: Saved) -> None:
        """Checkpoint ``saved`` as its step; the oldest beyond :data:`KEEP` go."""
        step = saved.step
        tmp = self.folder / f".step-{step}.pt.tmp"
        try:
            torch.save(vars(saved), tmp)
            os.replace(tmp, self.folder / f"step-{step}.pt")
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise MixLNError(f"{self.folder}: saving the heal's checkpoint failed: {e.strerror or e}") from None
        for _, old in self.checkpoints()[:-KEEP]:
            old.unlink()

    def load(self, main: bool = True) -> Saved:
        """The last checkpoint that loads (a damaged one is skipped with a warning); the ``main`` process keeps
        the metrics up to it."""
        for step, file in reversed(self.checkpoints()):
            try:
                state = Saved(**torch.load(file, map_location="cpu", weights_only=True))
                if state.step != step:
                    raise ValueError(f"it holds step {state.step}")
            except Exception as e:  # torch and pickle each fail their own way on a damaged file
                warn(f"{file} is damaged ({first_line(e)[:200]}); trying the checkpoint before it")
                continue
            if main:
                cut_metrics(self.folder / METRICS, step)
            return state
        raise MixLNError(f"{self.folder}: no checkpoint loads; {FORCE} starts the heal afresh")

    def records(self) -> list[MetricRecord]:
        return read_metrics(self.folder / METRICS, "a heal record")

    def log(self, record: MetricRecord) -> None:
        append_metrics(self.folder / METRICS, record)

    def remove(self, finished: bool) -> None:
        """The folder, once the heal is ``finished``, or when it failed before its first checkpoint (nothing to
        resume); only one this run made or continued."""
        if self.owned and (finished or not self.checkpoints()):
            shutil.rmtree(self.folder, ignore_errors=True)

