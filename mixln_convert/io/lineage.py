"""Where a checkpoint comes from, step by step, as this tool's commands recorded it: a Mix-LN config's
``mixln_provenance`` (the conversion, the heal, prunings, trainings), a plain config's ``pruned`` and
``trained`` lists, an exported folder's ``mixln_export.json`` (the records its source held, which the
plain config.json leaves out), and the facts of a GGUF source (its name, licence, stored tensor types and
pre-tokenizer; :func:`gguf_facts`), recorded beside its path when it is read.

The model card (:mod:`.model_card`) and the GGUF export (:mod:`..export.gguf`) both tell the history
from here, so a chain source -> convert -> heal -> train -> prune -> export keeps its base model, licence
and steps in every output.
"""

import json
from pathlib import Path

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


def gguf_facts(path) -> dict:
    """What a GGUF file says of itself that an output keeps: the strings of :data:`GGUF_FACTS` and the
    tensor types it stores (``stored_types``: Q4_1, Q6_K, F32, ...); {} for a file that cannot be read."""
    try:
        from gguf import GGUFReader, GGUFValueType

        reader = GGUFReader(path)
        facts = {}
        for key, name in GGUF_FACTS.items():
            field = reader.fields.get(key)
            if field is not None and list(field.types) == [GGUFValueType.STRING]:
                value = " ".join(str(field.contents()).split())
                if value:
                    facts[name] = value[:MAX_FACT]
        facts["stored_types"] = sorted({tensor.tensor_type.name for tensor in reader.tensors})
        return facts
    except Exception:  # noqa: BLE001  (a foreign or damaged file: nothing known of it)
        return {}


def source_facts(source) -> dict:
    """``{"source_gguf": facts}`` for a record whose source is a GGUF file, else {}."""
    path = Path(str(source)) if isinstance(source, (str, Path)) else None
    if path is None or path.suffix.lower() != ".gguf" or not path.is_file():
        return {}
    facts = gguf_facts(path)
    return {"source_gguf": facts} if facts else {}


def read_export(folder) -> dict:
    """An exported folder's record (:data:`EXPORT_FILE`), {} where there is none or it does not read."""
    if folder is None or not Path(folder, EXPORT_FILE).is_file():
        return {}
    try:
        record = json.loads(Path(folder, EXPORT_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def recorded(config: dict, exported: dict | None = None) -> dict:
    """``config`` with the records of the checkpoint an export was made from (``exported``'s
    ``source_config``) where the config holds none of its own; for a plain folder pruned after an export (its
    pruning record holds that export's record, ``exported``), that export's history first."""
    past = (exported or {}).get("source_config") or {}
    merged = {**config, **{key: value for key, value in past.items() if key not in config}}
    before = next((r["exported"] for r in _listed(merged.get("pruned")) if isinstance(r.get("exported"), dict)), None)
    if before:
        history = recorded(before.get("source_config") or {})
        merged = {**history, **merged,
                  "pruned": _unique([*_listed(history.get("pruned")), *_listed(merged.get("pruned"))])}
    return merged


def _listed(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _unique(items: list[dict]) -> list[dict]:
    """``items`` without repeats, in order (a record an export kept and the pruned folder's own history both list)."""
    kept = []
    for item in items:
        if item not in kept:
            kept.append(item)
    return kept


def provenance(config: dict) -> dict:
    return config.get("mixln_provenance") if isinstance(config.get("mixln_provenance"), dict) else {}


def records(config: dict, kind: str) -> list[dict]:
    """The ``pruned`` or ``trained`` records of ``config``: a Mix-LN config's provenance's, then its top level's
    (a plain model's; both where a plain folder exported from a Mix-LN or LNS one was pruned)."""
    return _unique([*_listed(provenance(config).get(kind)), *_listed(config.get(kind))])


def add_record(config_file: Path, kind: str, record: dict) -> None:
    """Append ``record`` to the ``kind`` list ("pruned", "trained") of the config.json ``config_file``: in a
    Mix-LN config's ``mixln_provenance``, else at a plain config's top level (which transformers keeps)."""
    config = json.loads(Path(config_file).read_text())
    if "post_ln_layers" in config:
        held = dict(provenance(config))
        held[kind] = [*records(config, kind), record]
        config["mixln_provenance"] = held
    else:
        config[kind] = [*records(config, kind), record]
    Path(config_file).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def origin(config: dict, nearest=None) -> str | None:
    """The first checkpoint of the chain: the conversion's source, else the first recorded pruning's or
    training's, else ``nearest`` (the one the command read)."""
    firsts = [provenance(config).get("source"), *(r.get("source") for r in records(config, "trained")[:1]),
              *((r.get("exported") or {}).get("source") or r.get("source") for r in records(config, "pruned")[:1]),
              nearest]
    return next((str(path) for path in firsts if isinstance(path, (str, Path)) and str(path)), None)


def origin_gguf(config: dict, nearest=None) -> dict:
    """The facts of the chain's first checkpoint where it is a GGUF file: as recorded, else read now."""
    for record in (provenance(config), *records(config, "trained")[:1], *records(config, "pruned")[:1]):
        if isinstance(record.get("source_gguf"), dict):
            return record["source_gguf"]
    first = origin(config, nearest)
    return source_facts(first).get("source_gguf", {}) if first else {}


__all__ = ["EXPORT_FILE", "RECORD_KEYS", "add_record", "gguf_facts", "origin", "origin_gguf", "provenance",
           "read_export",
           "recorded", "records", "source_facts"]
