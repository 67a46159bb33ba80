"""The model card (README.md, in the Hugging Face Hub's format) of every checkpoint folder a command keeps:
convert, heal and prune (through :func:`~mixln_convert.io.writer.write_checkpoint`) and each trained arm's
``final/``.

Its facts come from the folder's config.json (the ``mixln_provenance`` the commands record, or a plain
model's ``pruned`` list) and the figures the command measured (a heal's are in its provenance, a training
run's in the arm's summary), each with the text and token count it was measured on. Nothing of a
source's own card is copied: only its license, read from its front matter (or a ``license`` key in its
config), is carried, if it is an identifier (:func:`_checked_license`). A Hub model is recognized by its snapshot's path in the Hugging Face cache
(:func:`.hub.snapshot_model`): a local folder is named in the body only. Here, not in ``report``: the
writer of every checkpoint calls it, and needs nothing of the reports (their plots, their inputs).
"""

import re
from pathlib import Path

from .. import __version__
from ..architectures import architecture_of_any
from ..errors import shown, warn
from .atomic import write_atomic
from .checkpoint_files import CARD_FILE
from .hub import snapshot_model

TOOL_TAG = "mixln-convert"
LAYOUTS = {"mix-ln": "Mix-LN", "layernorm-scaling": "LayerNorm Scaling", "pre-ln": "Pre-LN"}  # tag -> name
STRATEGIES = {  # what each conversion strategy (conversion/plan.py) made of the source's weights
    "calibrated": "the Post-LN blocks' Pre-LN norms folded into the projections that read them, at the "
                  "activation scale measured on calibration text, and their Post-LN gains fitted on that text",
    "move": "the Post-LN blocks' norms moved after their sublayers (the input norm dropped, the post-attention "
            "gain kept, the post-feedforward gain 1)",
    "reinit-post": "the Post-LN blocks freshly initialized",
    "scratch": "every tensor freshly initialized: only the source's shape and tokenizer are kept",
    "exact": "every block's norm gains multiplied by sqrt(l), which the layout's 1/sqrt(l) cancels: the "
             "source's function",
}
PLACEHOLDER = "path/to/this/folder"  # where the load instructions name the folder: it moves, or goes to the Hub


def write_card(folder: Path, config: dict | None = None, source=None, trained: dict | None = None,
               exported: dict | None = None) -> None:
    """``folder``/README.md: :func:`model_card` of ``config`` (default: the folder's config.json)."""
    import json

    folder = Path(folder)
    if config is None:
        config = json.loads((folder / "config.json").read_text())
    write_atomic(folder / CARD_FILE, str(model_card(config, source, trained, exported)))


def model_card(config: dict, source=None, trained: dict | None = None, exported: dict | None = None):
    """The card (a ``huggingface_hub.ModelCard``) of a checkpoint whose config.json is ``config``.
    ``source``: the checkpoint the command read (a folder or a file), for its license and name;
    ``trained``: an arm's summary (:func:`~mixln_convert.training.trainer.train_arm`), with ``data`` the
    training text, when the folder is a trained arm's ``final/``; ``exported``: for a plain model
    ``mixln-convert export`` wrote, its record (the source's config among it), whose history the card tells."""
    from huggingface_hub import ModelCard, ModelCardData

    history = (exported or {}).get("source_config") or {}
    provenance = config.get("mixln_provenance") or history.get("mixln_provenance") or {}
    layout = layout_tag(config)
    family = architecture_of_any(config, "config.json").model_type
    sources = _sources(config, source)
    hub = next(filter(None, map(snapshot_model, sources)), None)
    scratch = provenance.get("strategy") == "scratch"  # a fresh model: the source gave no weights
    data = ModelCardData(base_model=hub[0] if hub and not scratch else None, library_name="transformers",
                         tags=[TOOL_TAG, layout, family], pipeline_tag="text-generation",
                         **_license(config, sources))
    origin = provenance.get("source") or (sources[-1] if sources else None)  # what the first command read
    origin_hub = snapshot_model(origin) if origin else None
    title = f"{origin_hub[0] if origin_hub else Path(origin).name}, " if origin else ""
    blocks = [("h1", f"{title}{LAYOUTS[layout]} ({family})"),
              ("p", f"Written by mixln-convert {__version__} from what its commands recorded in config.json and "
                    "the figures they measured, each with the text it was measured on. This card is the tool's: "
                    "nothing of the source's own card is copied."),
              ("h2", "What was done"), ("ul", _done(config, provenance, origin, hub, trained, exported)),
              ("h2", "Measured"), *_measured(provenance.get("heal"), trained),
              ("h2", "How to load"), *_loading(config, layout),
              ("h2", "License"), ("p", _license_text(data.license))]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{_markdown(blocks)}")


def _markdown(blocks: list) -> str:
    """Markdown of ("h1"|"h2"|"p", text), ("ul", [texts]) and ("table", header, rows) blocks."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append(f"{'#' * int(kind[1])} {content[0]}")
        elif kind == "ul":
            parts.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "table":
            header, rows = content
            lines = [header, ["---"] * len(header), *rows]
            parts.append("\n".join("| " + " | ".join(str(c).replace("|", "\\|") for c in line) + " |"
                                   for line in lines))
        else:
            parts.append(content[0])
    return "\n\n".join(parts) + "\n"


def layout_tag(config: dict) -> str:
    """``mix-ln``, ``layernorm-scaling`` or ``pre-ln``: what the blocks compute (a Mix-LN checkpoint
    without a Post-LN block is a Pre-LN layout)."""
    if config.get("layernorm_scaling"):
        return "layernorm-scaling"
    return "mix-ln" if config.get("post_ln_layers") else "pre-ln"


def _sources(config: dict, source) -> list[str]:
    """The checkpoints this one comes from, nearest first: the one the command read, then those its
    records name (prunings, newest first, then the conversion's source)."""
    provenance = config.get("mixln_provenance") or {}
    pruned = provenance.get("pruned") or config.get("pruned") or []
    named = [source, *(record.get("source") for record in reversed(pruned) if isinstance(record, dict)),
             provenance.get("source")]
    found = []
    for path in named:
        if isinstance(path, (str, Path)) and str(path) and str(path) not in found:
            found.append(str(path))
    return found


def _name(path: str) -> str:
    """A checkpoint as the card names it: a Hub model's repo, else its path."""
    hub = snapshot_model(path)
    return f"`{hub[0]}`" if hub else f"`{path}`"


def _described(path: str) -> str:
    """A source as the card states it: a Hub model's repo and commit, else the local path (never a base_model)."""
    hub = snapshot_model(path)
    return f"`{hub[0]}` (Hugging Face Hub, commit `{hub[1]}`)" if hub else f"the local checkpoint `{path}`"


def _license(config: dict, sources: list[str]) -> dict:
    """The license fields to carry: the front matter of the nearest source folder's card, else the
    config's ``license``, else the card of a source further back; {} when none says (never an error: a
    license that is no identifier is left out with a warning, :func:`_checked_license`)."""
    first, *rest = sources or [None]
    found = _card_license(first) or _config_license(config)
    for path in rest:
        found = found or _card_license(path)  # read only while none is found: no warning of a card not used
    return found


def _card_license(path) -> dict:
    if path is None or not Path(path, CARD_FILE).is_file():
        return {}
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(Path(path, CARD_FILE), ignore_metadata_errors=True).data
    except Exception:  # a damaged card (its YAML, its encoding): no license known, the command goes on
        return {}
    fields = {key: getattr(data, key, None) for key in ("license", "license_name", "license_link")}
    return _checked_license(fields, Path(path, CARD_FILE))


def _config_license(config: dict) -> dict:
    return _checked_license({"license": config.get("license")}, "config.json")


# A license is an identifier (the Hub's list: apache-2.0, llama3.2, ...; or `other`, named by license_name and
# license_link): bounded, so that a card's license of a megabyte or a paragraph is not copied into every output's card
LICENSE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")
LICENSE_FIELDS = {"license": LICENSE_ID, "license_name": LICENSE_ID, "license_link": re.compile(r"\S{1,512}")}


def _checked_license(fields: dict, where) -> dict:
    """The license fields to carry of ``fields`` (license; license_name and license_link where it is
    ``other``, per the Hub); a value that is no identifier (a link) is left out with a warning naming ``where``."""
    keys = list(LICENSE_FIELDS) if str(fields.get("license")).strip() == "other" else ["license"]
    found = {}
    for key in keys:
        value = fields.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        if LICENSE_FIELDS[key].fullmatch(value.strip()):
            found[key] = value.strip()
        else:
            warn(f"{where}: {key} {shown(repr(value.strip()))} is not a license identifier (the Hugging Face Hub's, "
                 "such as apache-2.0, or other with a license_name) or link; left out of the card")
    return found if "license" in found else {}


def _done(config: dict, provenance: dict, origin: str | None, hub, trained: dict | None,
          exported: dict | None = None) -> list[str]:
    """What was done, each step as its record says: source, layout, conversion, heal, prunings, training, export."""
    recorded = {**config, **((exported or {}).get("source_config") or {})}  # an export's history is its source's
    layers, post_ln_layers = config.get("num_hidden_layers"), config.get("post_ln_layers") or 0
    items = [f"Source: {_described(origin)}." if origin else "Source: not recorded."]
    if hub and provenance.get("strategy") == "scratch":
        items.append("`base_model` is left out: a model initialized from scratch holds none of the source's weights.")
    layout = layout_tag(config)
    if layout == "mix-ln":
        items.append(f"Layout: Mix-LN, the first {post_ln_layers} of {layers} decoder blocks Post-LN, the other "
                     f"{layers - post_ln_layers} Pre-LN.")
    elif layout == "layernorm-scaling":
        items.append(f"Layout: LayerNorm Scaling, all {layers} decoder blocks Pre-LN with each block's norm outputs "
                     "scaled by 1/sqrt(l) (l its depth, from 1).")
    else:
        items.append(f"Layout: Pre-LN, {layers} decoder blocks" + (" (a Mix-LN checkpoint with no Post-LN block)"
                                                                    if "post_ln_layers" in config else "") + ".")
    if "strategy" in provenance:
        items.append(_conversion(recorded, provenance))
    if provenance.get("heal"):
        items.append(_heal(provenance["heal"]))
    for record in provenance.get("pruned") or recorded.get("pruned") or []:
        items.append(_pruning(record))
    if trained:
        steps, precision = trained.get("steps"), trained.get("precision")
        items.append(f"Trained with `mixln-convert train` (arm `{trained.get('arm')}`): {steps} step"
                     f"{'s' * (steps != 1)}, {trained.get('tokens'):,} tokens of `{trained.get('data')}`, precision "
                     f"`{'fp32' if precision == 'no' else precision}`.")  # accelerate's "no": no mixed precision
    if exported:
        folded = (" LayerNorm Scaling's 1/sqrt(l) folded into each block's norm gains;"
                  if exported.get("folded_layernorm_scaling") else "")
        items.append(f"Exported with `mixln-convert export --to llama` from `{exported.get('source')}` "
                     f"(model type `{exported.get('source_model_type')}`) as a plain `{exported.get('architecture')}`:"
                     f"{folded} the same logits, no remote code.")
    return items


def _conversion(config: dict, provenance: dict) -> str:
    strategy = provenance["strategy"]
    if config.get("layernorm_scaling"):
        what = "to LayerNorm Scaling"
    else:
        alpha = config.get("alpha")
        what = "to Mix-LN, " + (f"alpha {alpha:g}" if isinstance(alpha, (int, float)) else "the Post-LN count given")
    text = f"Converted with `mixln-convert convert` {what}, strategy `{strategy}`: {STRATEGIES.get(strategy, strategy)}"
    calibration = provenance.get("calibration")
    if isinstance(calibration, dict) and calibration.get("tokens"):
        text += (f" (calibrated on {calibration['tokens']:,} tokens of `{calibration.get('data')}`, windows of "
                 f"{calibration.get('seq_len')})")
    if "seed" in provenance and strategy in ("reinit-post", "scratch"):
        text += f"; seed {provenance['seed']}"
    return text + "."


def _heal(record: dict) -> str:
    return (f"Healed with `mixln-convert heal`: the {record.get('post_ln_layers')} Post-LN blocks distilled "
            f"against {_name(record['teacher']) if record.get('teacher') else 'the source'} on "
            f"{record.get('tokens', 0):,} tokens of `{record.get('data')}` "
            f"({record.get('steps')} step{'s' * (record.get('steps') != 1)}, `{record.get('loss')}` loss, "
            f"lr {record.get('lr')}).")


def _pruning(record: dict) -> str:
    if not isinstance(record, dict):
        return "Pruned (record unreadable)."
    removed = record.get("removed_layers") or []
    text = (f"Pruned with `mixln-convert prune`: decoder block{'s' * (len(removed) != 1)} "
            f"{', '.join(map(str, removed))} of {record.get('num_layers_before')} removed (method "
            f"`{record.get('method')}`")
    if record.get("tokens"):
        text += f", scored on {record['tokens']:,} tokens of `{record.get('data')}`"
    return text + ")."


def _ppl(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "not measured"


def _measured(heal: dict | None, trained: dict | None) -> list:
    """The command's figures as blocks: the heal's and the training run's, each with its text."""
    blocks = []
    if heal:
        evaluation = heal.get("evaluation") or {}
        on = (f"`{evaluation.get('data')}`, {evaluation.get('tokens', 0):,} tokens in windows of "
              f"{evaluation.get('seq_len')}")
        rows = []
        if heal.get("perplexity"):
            rows.append(["perplexity (packed windows)", *(_ppl(heal["perplexity"].get(k))
                                                          for k in ("before", "after", "teacher"))])
        if heal.get("per_document_perplexity"):
            rows.append(["perplexity (per document)", *(_ppl(heal["per_document_perplexity"].get(k))
                                                        for k in ("before", "after", "teacher"))])
        error = heal.get("relative_error") or {}
        rows.append(["relative error of the Post-LN blocks' output to the teacher's",
                     *(f"{error[k]:.4g}" if isinstance(error.get(k), (int, float)) else "not measured"
                       for k in ("before", "after")), "—"])
        blocks += [("p", f"The heal, measured on the model as it was then, on held-out text ({on}):"),
                   ("table", ["figure", "before the heal", "after the heal", "teacher"], rows)]
    if trained:
        validation = trained.get("validation") or {}
        blocks.append(("p", f"Training: validation perplexity {_ppl(trained.get('initial_val_ppl'))} before the "
                            f"first step and {_ppl(trained.get('final_val_ppl'))} after the last, on "
                            f"`{validation.get('data')}` ({validation.get('tokens', 0):,} tokens in windows of "
                            f"{validation.get('seq_len')})."))
    if not blocks:
        blocks.append(("p", "No quality figure was measured on the way to this model. `mixln-convert eval` "
                            "measures perplexity; `mixln-convert eval --tasks` scores lm-evaluation-harness tasks."))
    return blocks


def _loading(config: dict, layout: str) -> list:
    remote = "auto_map" in config  # the Mix-LN classes, saved beside the weights
    trust = ", trust_remote_code=True" if remote else ""
    code = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f"model = AutoModelForCausalLM.from_pretrained(\"{PLACEHOLDER}\"{trust})\n"
            f"tokenizer = AutoTokenizer.from_pretrained(\"{PLACEHOLDER}\")\n```")
    if remote:
        note = (f"`trust_remote_code=True` runs the {LAYOUTS[layout] if layout != 'pre-ln' else 'Mix-LN'} model code "
                "saved beside the weights (configuration_mixln.py, modeling_mixln.py). With mixln-convert installed, "
                "`import mixln_convert.model.register` first loads it without remote code.")
    else:
        note = "A plain transformers checkpoint: no remote code is needed."
    return [("p", code), ("p", f"Replace `{PLACEHOLDER}` with this folder's path, or its Hub id once uploaded. "
                               + note)]


def _license_text(license: str | None) -> str:
    if license:
        return f"`{license}`, carried from the source's card or config."
    return "No license was found in the source's card or config: check the source's own terms."
