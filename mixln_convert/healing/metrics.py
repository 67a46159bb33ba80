"""The teacher's held-out figures, kept between heals, and how a heal judges its own (diverged, or worse)."""

import contextlib
import hashlib
import json
import math
from dataclasses import dataclass

from ..errors import MixLNError, warn
from ..fetch import cache_dir
from ..io.atomic import write_atomic
from ..io.records import MetricRecord, Record
from ..schema import POSITIVE_NUMBER, read_record, setting
from .options import HealOptions


@dataclass(frozen=True)
class TeacherFigures(Record):
    """The teacher's held-out perplexities, packed and each document on its own, as the cache keeps them."""
    packed: float = setting(kind=POSITIVE_NUMBER)
    per_document: float = setting(kind=POSITIVE_NUMBER)


def cached_teacher_metrics(measure, **key) -> TeacherFigures:
    """``measure()``'s figures, kept in the user cache under ``key`` (everything they depend on): a sweep or
    a rerun heals against the same teacher many times. An unreadable cache entry is measured again."""
    path = cache_dir() / "teacher-metrics" / f"{digest(json.dumps(key, sort_keys=True).encode())}.json"
    with contextlib.suppress(OSError, ValueError, MixLNError):
        return read_record(TeacherFigures, json.loads(path.read_text()), str(path))
    figures = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(figures.to_dict()) + "\n")
    except OSError as e:  # a cache that cannot be written costs the next run a measurement, nothing more
        warn(f"{path.parent}: cannot keep the teacher's figures ({e.strerror})")
    return figures


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_record_finite(record: MetricRecord, lr: float, name=HealOptions.flag) -> None:
    """A heal whose held-out figures (of a step's ``record``) are no longer numbers has diverged: it must not be
    written (``name``: how the caller names a setting, a flag or a recipe's heal.KEY)."""
    for key in ("val_relative_error", "val_ppl", "val_doc_ppl"):
        if (value := getattr(record, key)) is not None and not math.isfinite(value):
            raise MixLNError(f"{name('lr')}: the healed model's held-out {key} is {value} at step "
                             f"{record.step}; the heal diverged at lr {lr}: try a smaller {name('lr')}")


def rise(before: float, after: float) -> str:
    """'261.41 to 261.43 (+0.0076%)': both figures to as many significant digits (4 at least) as tell them
    apart, and the relative change, so a small rise does not read '261.4 to 261.4'."""
    for digits in range(4, 18):
        old, new = f"{before:.{digits}g}", f"{after:.{digits}g}"
        if old != new:
            break
    change = after / before - 1 if before else math.inf
    percent = f"{100 * change:+.1f}%" if abs(change) >= 0.01 else f"{100 * change:+.2g}%"
    return f"{old} to {new} ({percent})"


def warn_if_worse(losses: list[float], ppl_before, ppl_after, lr: float, doc_before=None, doc_after=None,
                  name=HealOptions.flag) -> None:
    """A heal that ends worse than it started (training loss over its last tenth of steps above the
    first step's, or held-out perplexity up) has almost always diverged; say so, still writing it.
    Per-document perplexity up while packed went down is a heal too short for the first positions
    of a document, not a divergence."""
    tail = losses[-max(1, len(losses) // 10):]
    signs = []
    if len(losses) > 1 and sum(tail) / len(tail) > losses[0]:
        signs.append(f"its loss ended above the first step's: {rise(losses[0], sum(tail) / len(tail))}, the "
                     "mean of its last tenth of steps")
    if ppl_before is not None and ppl_after > ppl_before:
        signs.append(f"held-out perplexity rose from {rise(ppl_before, ppl_after)}")
    if signs:
        warn(f"the heal made the model worse ({'; '.join(signs)}): {name('lr')} {lr:g} is probably too high for this "
             f"model; try {lr / 3:.1g}")
    elif doc_before is not None and doc_after > doc_before:
        warn(f"the heal made per-document perplexity worse (from {rise(doc_before, doc_after)}, each document "
             "scored from its first token, as lm-evaluation-harness does) while packed perplexity fell: too few "
             f"tokens for the first positions of a document to recover; heal on more {name('tokens')}")
