"""Where a checkpoint comes from, step by step, as this tool's commands recorded it: a Mix-LN config's
``mixln_provenance`` (the conversion, the heal, prunings, trainings), a plain config's ``pruned`` and
``trained`` lists, an exported folder's ``mixln_export.json`` (the records its source held, which the
plain config.json leaves out), and the facts of a GGUF source (its name, licence, stored tensor types and
pre-tokenizer; :func:`source_facts`), recorded beside its path when it is read.

The model card (:mod:`.model_card`) and the GGUF export (:mod:`..export.gguf`) both tell the history
from here, so a chain source -> convert -> heal -> train -> prune -> export keeps its base model, licence
and steps in every output.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ..schema import SEED, TOKENS, TOKENS_OR_ZERO, Flag, Kind, Nested, String, read_record, setting
from .records import FIGURE, LAYER_COUNT, NUMBER, NUMBER_LIST, OBJECT, POST_LN_COUNT, STRINGS, Record, read_json

EXPORT_FILE = "mixln_export.json"  # an exported folder's record (export/plain.py writes it)
# config.json keys holding this package's layout and records (a plain export leaves them out of config.json)
RECORD_KEYS = ("post_ln_layers", "layernorm_scaling", "alpha", "mixln_provenance", "pruned", "trained")
# GGUF metadata kept of a GGUF source: {key: name in the record}
GGUF_FACTS = {"general.name": "name", "general.organization": "organization", "general.basename": "basename",
              "general.license": "license", "general.license.name": "license_name",
              "general.license.link": "license_link", "general.repo_url": "repo_url", "general.url": "url",
              "general.source.url": "source_url", "general.source.repo_url": "source_repo_url",
              "tokenizer.ggml.pre": "pre"}
MAX_FACT = 200  # characters of a GGUF string kept: the metadata is the file author's text
TEXT = String()


@dataclass(frozen=True)
class Facts(Record):
    """What a recorded GGUF source says of itself (:func:`source_facts`): the fields the outputs read."""
    name: str | None = setting(None, TEXT)
    organization: str | None = setting(None, TEXT)
    license: str | None = setting(None, TEXT)
    license_name: str | None = setting(None, TEXT)
    license_link: str | None = setting(None, TEXT)
    repo_url: str | None = setting(None, TEXT)
    source_repo_url: str | None = setting(None, TEXT)
    stored_types: list = setting((), STRINGS)


@dataclass(frozen=True)
class Windows(Record):
    """The text a step read or was measured on, in windows: its name, the tokens and the window length."""
    data: str | None = setting(None, TEXT)
    tokens: int = setting(0, TOKENS_OR_ZERO)
    seq_len: int | None = setting(None, TOKENS)


@dataclass(frozen=True)
class Figures(Record):
    """A heal's figure: the student's before and after the heal, the teacher's (where it has one: not of the
    relative error, whose record leaves it out)."""
    SPARSE = True
    before: float | None = setting(None, FIGURE)
    after: float | None = setting(None, FIGURE)
    teacher: float | None = setting(None, FIGURE)


@dataclass(frozen=True)
class Heal(Record):
    """A heal's record (healing/run.py; its figures :class:`~mixln_convert.healing.result.HealResult`'s)."""
    teacher: str | None = setting(None, TEXT)
    data: str | None = setting(None, TEXT)
    tokens: int = setting(0, TOKENS_OR_ZERO)
    steps: int | None = setting(None, TOKENS_OR_ZERO)
    lr: float | None = setting(None, NUMBER)
    loss: str | None = setting(None, TEXT)
    seq_len: int | None = setting(None, TOKENS)
    batch_size: int | None = setting(None, TOKENS)
    post_ln_layers: int | None = setting(None, POST_LN_COUNT)
    data_passes: float | None = setting(None, NUMBER)
    perplexity: Figures | None = setting(None, Nested(Figures, "a heal's figures"))
    per_document_perplexity: Figures | None = setting(None, Nested(Figures, "a heal's figures"))
    relative_error: Figures | None = setting(None, Nested(Figures, "a heal's figures"))
    evaluation: Windows = setting(factory=Windows, kind=Nested(Windows, "a text's windows"))


@dataclass(frozen=True)
class Training(Record):
    """A training's record (training/trainer.py), in the trained arm's final/config.json."""
    source: str | None = setting(None, TEXT)
    arm: str | None = setting(None, TEXT)
    steps: int | None = setting(None, TOKENS_OR_ZERO)
    tokens: int | None = setting(None, TOKENS_OR_ZERO)
    data: str | None = setting(None, TEXT)
    precision: str | None = setting(None, TEXT)
    initial_val_ppl: float | None = setting(None, FIGURE)
    final_val_ppl: float | None = setting(None, FIGURE)
    validation: Windows = setting(factory=Windows, kind=Nested(Windows, "a text's windows"))
    recipe: dict | None = setting(None, OBJECT)
    source_gguf: Facts | None = setting(None, Nested(Facts, "a GGUF file's facts"))


@dataclass(frozen=True)
class Export(Record):
    """An exported folder's record (:data:`EXPORT_FILE`, export/plain.py): the records its source's config held
    (``source_config``, as they were) and what the export did. Written as it is read."""
    SPARSE = True
    tool: str | None = setting(None, TEXT)
    exported_to: str | None = setting(None, TEXT)
    source: str | None = setting(None, TEXT)
    source_model_type: str | None = setting(None, TEXT)
    architecture: str | None = setting(None, TEXT)
    folded_layernorm_scaling: bool | None = setting(None, Flag())
    source_config: dict | None = setting(None, OBJECT)
    source_gguf: dict | None = setting(None, OBJECT)


@dataclass(frozen=True)
class Pruning(Record):
    """A pruning's record (surgery/prune.py); ``exported``: the record of the exported folder it pruned."""
    source: str | None = setting(None, TEXT)
    method: str | None = setting(None, TEXT)
    removed_layers: list = setting((), NUMBER_LIST)
    num_layers_before: int | None = setting(None, LAYER_COUNT)
    data: str | None = setting(None, TEXT)
    tokens: int = setting(0, TOKENS_OR_ZERO)
    exported: Export | None = setting(None, Nested(Export, "an export's record"))
    source_gguf: Facts | None = setting(None, Nested(Facts, "a GGUF file's facts"))


@dataclass(frozen=True)
class Provenance(Record):
    """A Mix-LN config's ``mixln_provenance``: the conversion's record (conversion/converter.py), the heal's, and
    the prunings and trainings after it."""
    source: str | None = setting(None, TEXT)
    strategy: str | None = setting(None, TEXT)
    seed: int | None = setting(None, SEED)
    scaled_init: bool | None = setting(None, Flag())
    calibration: Windows | None = setting(None, Nested(Windows, "a text's windows"))
    heal: Heal | None = setting(None, Nested(Heal, "a heal's record"))
    pruned: list = setting((), Nested(Pruning, "a pruning's record", many=True))
    trained: list = setting((), Nested(Training, "a training's record", many=True))
    source_gguf: Facts | None = setting(None, Nested(Facts, "a GGUF file's facts"))


@dataclass(frozen=True)
class History(Record):
    """What a checkpoint's config.json records of how it was made (with the records of the checkpoint an export
    was made from: :func:`recorded`), as :func:`history` reads it."""
    num_hidden_layers: int | None = setting(None, LAYER_COUNT)
    post_ln_layers: int | None = setting(None, POST_LN_COUNT)
    layernorm_scaling: bool | None = setting(None, Flag())
    alpha: float | None = setting(None, NUMBER)
    license: object = setting(None, Kind())  # checked where it is carried (io/model_card.py)
    mixln_provenance: Provenance | None = setting(None, Nested(Provenance, "a provenance record"))
    pruned: list = setting((), Nested(Pruning, "a pruning's record", many=True))
    trained: list = setting((), Nested(Training, "a training's record", many=True))

    @property
    def provenance(self) -> Provenance:
        return self.mixln_provenance or Provenance()

    def records(self, kind: str) -> list:
        """The ``pruned`` or ``trained`` records: a Mix-LN config's provenance's, then its top level's (a plain
        model's; both where a plain folder exported from a Mix-LN or LNS one was pruned)."""
        return _unique([*getattr(self.provenance, kind), *getattr(self, kind)])

    def origin_gguf(self, nearest=None) -> Facts | None:
        """The facts of the chain's first checkpoint where it is a GGUF file: as its first record kept them (the
        conversion's, else the first training's or pruning's), else read now (from that record's source, else
        ``nearest``, the one the command read)."""
        firsts = [self.provenance, *self.records("trained")[:1], *self.records("pruned")[:1]]
        if kept := next((record.source_gguf for record in firsts if record.source_gguf), None):
            return kept
        # a pruning of an exported folder: the export's source
        paths = [(getattr(record, "exported", None) and record.exported.source) or record.source for record in firsts]
        first = next((str(path) for path in [*paths, nearest] if path), None)
        return read_facts(first) if first else None


def history(config: dict, exported: Export | None = None, where: str = "config.json") -> History:
    """The records of ``config`` (read from ``where``) and of the checkpoint an export was made from
    (:func:`recorded`); a damaged one is one line naming ``where`` and its key."""
    return read_record(History, recorded(config, exported), where, "a checkpoint's config")


def source_facts(source) -> dict:
    """``{"source_gguf": facts}`` for a record whose source is a GGUF file: what the file says of itself that an
    output keeps, the strings of :data:`GGUF_FACTS` and the tensor types it stores (``stored_types``: Q4_1, Q6_K,
    F32, ...); {} for another source or a file that cannot be read."""
    path = Path(str(source)) if isinstance(source, (str, Path)) else None
    if path is None or path.suffix.lower() != ".gguf" or not path.is_file():
        return {}
    try:
        from gguf import GGUFReader, GGUFValueType

        reader = GGUFReader(path)
        strings = {name: " ".join(str(field.contents()).split()) for key, name in GGUF_FACTS.items()
                   if (field := reader.fields.get(key)) is not None and list(field.types) == [GGUFValueType.STRING]}
        facts = {name: value[:MAX_FACT] for name, value in strings.items() if value}
        return {"source_gguf": {**facts, "stored_types": sorted({t.tensor_type.name for t in reader.tensors})}}
    except Exception:  # noqa: BLE001  (a foreign or damaged file: nothing known of it)
        return {}


def read_facts(path) -> Facts | None:
    """:func:`source_facts` of ``path`` as a record; None where it is no GGUF file that reads."""
    facts = source_facts(path)
    return read_record(Facts, facts["source_gguf"], str(path)) if facts else None


def read_export(folder) -> Export | None:
    """An exported folder's record (:data:`EXPORT_FILE`), None where there is none; a damaged one is one line
    naming the file and key."""
    file = Path(folder, EXPORT_FILE)
    return read_record(Export, read_json(file), str(file), "an export's record") if file.is_file() else None


def recorded(config: dict, exported: Export | None = None) -> dict:
    """``config`` with the records of the checkpoint an export was made from (``exported``'s
    ``source_config``) where the config holds none of its own; for a plain folder pruned after an export (its
    pruning record holds that export's record), that export's history first. As the configs hold them."""
    past = (exported and exported.source_config) or {}
    merged = {**config, **{key: value for key, value in past.items() if key not in config}}
    before = next((r["exported"] for r in _listed(merged.get("pruned")) if isinstance(r.get("exported"), dict)), None)
    if before:
        history = recorded(before.get("source_config") or {})
        merged = {**history, **merged,
                  "pruned": _unique([*_listed(history.get("pruned")), *_listed(merged.get("pruned"))])}
    return merged


def _listed(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _unique(items: list) -> list:
    """``items`` without repeats, in order (a record an export kept and the pruned folder's own history both list)."""
    kept = []
    for item in items:
        if item not in kept:
            kept.append(item)
    return kept


def with_record(config: dict, kind: str, record: dict) -> dict:
    """``config`` with ``record`` appended to its ``kind`` list ("pruned", "trained"): in a Mix-LN config's
    ``mixln_provenance``, else at a plain config's top level (which transformers keeps)."""
    held = config.get("mixln_provenance") or {}
    listed = [*_unique([*_listed(held.get(kind)), *_listed(config.get(kind))]), record]
    if "post_ln_layers" in config:
        return {**config, "mixln_provenance": {**held, kind: listed}}
    return {**config, kind: listed}


def add_record(config_file: Path, kind: str, record: dict) -> None:
    """:func:`with_record` in the config.json ``config_file``."""
    config = with_record(json.loads(Path(config_file).read_text()), kind, record)
    Path(config_file).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


__all__ = ["EXPORT_FILE", "RECORD_KEYS", "Export", "History", "add_record", "history", "read_export", "read_facts",
           "recorded", "source_facts", "with_record"]
