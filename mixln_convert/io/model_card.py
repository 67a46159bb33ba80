"""The model card (README.md, in the Hugging Face Hub's format) of every checkpoint folder a command keeps:
convert, heal and prune (through :func:`~mixln_convert.io.writer.write_checkpoint`), each trained arm's
``final/`` and an ``export --to llama`` folder.

Its facts come from the records the commands leave (:mod:`.lineage`: config.json's ``mixln_provenance``, a
plain model's ``pruned`` and ``trained`` lists, an export's source records) and the figures they measured (a
heal's in its record, a training's in its own), each with the text and token count it was measured on; the
commands that made the folder are restated from those records. Nothing of a source's own card is copied:
only its license, read from its front matter (or a ``license`` key in its config, or a GGUF's
general.license), is carried, if it is an identifier (:func:`_checked_license`). A Hub model is recognized by its snapshot's path in the Hugging Face cache
(:func:`.hub.snapshot_model`) and is the ``base_model``; a local checkpoint is named by its file or folder
name only (a path is the writer's machine's). Here, not in ``report``: the writer of every checkpoint calls
it, and needs nothing of the reports (their plots, their inputs).
"""

import re
from pathlib import Path

from .. import __version__
from ..architectures import architecture_of_any
from ..conversion.options import ConvertOptions
from ..errors import shown, warn
from ..evaluation.options import EvalOptions
from ..export.options import ExportOptions
from ..healing.options import HealCommand, HealOptions
from ..surgery.options import PruneOptions
from ..training.options import TrainOptions
from .atomic import write_atomic
from .checkpoint_files import CARD_FILE
from .hub import snapshot_model
from .lineage import Export, Facts, Heal, History, Pruning, Training, history as read_history, read_facts
from .markdown import to_markdown
from .records import read_json

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
PLACEHOLDER = "path/to/this/folder"
METHOD_URL = "https://arxiv.org/abs/2412.13795"  # Mix-LN (Li et al.)
LNS_URL = "https://arxiv.org/abs/2502.05795"  # LayerNorm Scaling (Sun et al.)
LOSSES = {"kl": "the KL divergence between the teacher's and the student's next-token distributions",
          "residual": "the relative error of the residual stream entering the first Pre-LN block"}
UNCHANGED = "with no Post-LN block it changed no weight: every tensor is the source's"


def write_card(folder: Path, config: dict | None = None, source=None, exported: Export | None = None,
               where: str | None = None) -> None:
    """``folder``/README.md: :func:`model_card` of ``config`` (default: the folder's config.json), its records
    read from ``where`` (default: that file)."""
    folder = Path(folder)
    config = read_json(folder / "config.json") if config is None else config
    write_atomic(folder / CARD_FILE, str(model_card(config, source, exported, where or str(folder / "config.json"))))


def model_card(config: dict, source=None, exported: Export | None = None, where: str = "config.json"):
    """The card (a ``huggingface_hub.ModelCard``) of a checkpoint whose config.json is ``config`` (read from
    ``where``). ``source``: the checkpoint the command read (a folder or a file), for its license and name;
    ``exported``: for a plain model ``mixln-convert export`` wrote, its record (the source's records among
    it), whose history the card tells."""
    from huggingface_hub import ModelCard, ModelCardData

    history = read_history(config, exported, where)  # an export's history is its source's
    trained = next(reversed(history.records("trained")), None)
    layout = layout_tag(config)
    family = architecture_of_any(config, "config.json").model_type
    data = ModelCardData(base_model=base_model(history, source), library_name="transformers",
                         tags=[TOOL_TAG, layout, family], pipeline_tag="text-generation",
                         **carried_license(history, source))
    origin = _origin(history, source)  # what the first command read
    license_text = (f"`{data.license}`, carried from the source's card or config." if data.license
                    else "No license was found in the source's card or config: check the source's own terms.")
    blocks = [("h1", title(history, source, config)),
              ("p", f"Written by {_tool()} {__version__}, which converts a pretrained Pre-LN model "
                    f"to [Mix-LN]({METHOD_URL}) (Post-LN in the first blocks, Pre-LN in the rest) or to "
                    f"[LayerNorm Scaling]({LNS_URL}), heals and trains it, and exports what is a plain model again. "
                    "What follows is what its commands recorded in config.json and the figures they measured, each "
                    "with the text it was measured on; nothing of the source's own card is copied."),
              ("h2", "What was done"), ("ul", _done(config, history, origin, trained, exported)),
              ("h2", "How it was made"), *_commands(history, origin, trained, exported),
              ("h2", "Measured"), *_measured(history.provenance.heal, trained),
              ("h2", "How to load"), *_loading(config, layout),
              ("h2", "License"), ("p", license_text)]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{to_markdown(blocks)}")


def base_model(history: History, source=None) -> str | None:
    """The Hub model the chain starts from (its snapshot in the Hugging Face cache), None for a local one or a
    model initialized from scratch (which holds none of the source's weights)."""
    if history.provenance.strategy == "scratch":
        return None
    hub = next(filter(None, map(snapshot_model, _sources(history, source))), None)
    return hub[0] if hub else None


def carried_license(history: History, source=None) -> dict:
    """The license fields a model made from ``source`` (the records ``history``) carries, as its card states them."""
    return _license(history, _sources(history, source))


def history_text(history: History, source, config: dict) -> str:
    """The card's "What was done" as one line of plain text (a GGUF's general.description)."""
    trained = next(reversed(history.records("trained")), None)
    return " ".join(item.replace("`", "") for item in _done(config, history, _origin(history, source), trained))


def _origin(history: History, source) -> str | None:
    """The checkpoint the chain's first command read: the conversion's source, else the furthest one recorded."""
    return history.provenance.source or next(reversed(_sources(history, source)), None)


def title(history: History, source, config: dict) -> str:
    """The model's name: its first source's (a Hub repo, a GGUF's own name, a folder's), its layout and family."""
    origin = _origin(history, source)
    named = f"{_name(origin).strip('`')}, " if origin else ""
    family = architecture_of_any(config, "config.json").model_type
    return f"{named}{LAYOUTS[layout_tag(config)]} ({family})"


def layout_tag(config: dict) -> str:
    """``mix-ln``, ``layernorm-scaling`` or ``pre-ln``: what the blocks compute (a Mix-LN checkpoint
    without a Post-LN block is a Pre-LN layout)."""
    if config.get("layernorm_scaling"):
        return "layernorm-scaling"
    return "mix-ln" if config.get("post_ln_layers") else "pre-ln"


def _sources(history: History, source) -> list[str]:
    """The checkpoints this one comes from, nearest first: the one the command read, then those its
    records name (prunings, newest first, then the conversion's source)."""
    later = [*history.records("pruned"), *history.records("trained")]  # newest last within each kind
    named = [source, *(record.source for record in reversed(later)), history.provenance.source]
    return list(dict.fromkeys(str(path) for path in named if path and str(path)))


def _tool() -> str:
    """The tool, linked where the installed package names its source (pyproject.toml's [project.urls])."""
    from importlib import metadata

    try:
        urls = dict(item.split(", ", 1) for item in metadata.metadata("mixln-convert").get_all("Project-URL") or [])
    except (metadata.PackageNotFoundError, ValueError):
        urls = {}
    url = urls.get("Source") or urls.get("Homepage")
    return f"[mixln-convert]({url})" if url else "mixln-convert"


def _name(path: str) -> str:
    """A checkpoint as the card names it: a Hub model's repo, else its file or folder name (a local path is
    the writer's machine's, not the reader's)."""
    hub = snapshot_model(path)
    return f"`{hub[0]}`" if hub else f"`{Path(path).name}`"


def _described(path: str, gguf: Facts | None = None) -> str:
    """A source as the card states it: a Hub model's repo and commit, else the local checkpoint by name; a GGUF
    with its own name and licence and what was done to its quantized tensors."""
    hub = snapshot_model(path)
    text = f"`{hub[0]}` (Hugging Face Hub, commit `{hub[1]}`)" if hub else f"the local checkpoint `{Path(path).name}`"
    if gguf:
        named = f"\"{gguf.name}\"" if gguf.name else "unnamed"
        text += f", a GGUF file ({named}{f' by {gguf.organization}' if gguf.organization else ''}"
        text += f", license `{gguf.license}`)" if gguf.license else ")"
        stored = [kind for kind in gguf.stored_types if kind not in ("F32", "F64")]
        quantized = [kind for kind in stored if kind not in ("F16", "BF16")]
        if quantized:
            text += (f"; its {', '.join(stored)} tensors were dequantized to float32, so the weights are the "
                     "quantized model's, not the unquantized original's")
        elif stored:
            text += f"; its {', '.join(stored)} tensors were read as float32"
    return text


def _text(data, trained: Training | None = None) -> str:
    """Text a step read, as a reader can follow it: the embedded corpus by its split, a token stream by what it
    was, a local path by name, a Hub dataset by its name."""
    data = str(data) if data is not None else "embedded:train"
    if data.startswith("embedded:"):
        split = data.removeprefix("embedded:")
        return f"mixln-convert's embedded corpus ({split} split: general English and Python docstrings)"
    if data.startswith("a stream of "):  # a heal given tokens: inside `train`, the training text's
        count = data.removeprefix("a stream of ").removesuffix(" tokens given")
        where = f" {_text(trained.data)}" if trained and trained.data else ""
        return f"the training text{where} (a stream of {int(count):,} tokens)" if count.isdigit() else data
    return f"`{_text_name(data)}`"


def _text_name(data: str) -> str:
    """A text path by its last part (a glob keeps its pattern), a Hub dataset or the embedded corpus by name."""
    return Path(data).name if Path(data).is_absolute() else data  # "embedded:train" is no absolute path


def _license(history: History, sources: list[str]) -> dict:
    """The license fields to carry: the front matter of the nearest source folder's card, else the
    config's ``license``, else the card of a source further back; {} when none says (never an error: a
    license that is no identifier is left out with a warning, :func:`_checked_license`)."""
    first, *rest = sources or [None]
    found = _card_license(first) or _checked_license(history, "config.json")
    for path in rest:
        found = found or _card_license(path)  # read only while none is found: no warning of a card not used
    return found or _gguf_license(sources, history)


def _card_license(path) -> dict:
    if path is None or not Path(path, CARD_FILE).is_file():
        return {}
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(Path(path, CARD_FILE), ignore_metadata_errors=True).data
    except Exception:  # a damaged card (its YAML, its encoding): no license known, the command goes on
        return {}
    return _checked_license(data, Path(path, CARD_FILE))


def _gguf_license(sources: list[str], history: History) -> dict:
    """A GGUF source's general.license (with its name and link for ``other``): read from the file, else as
    the chain's records kept it."""
    path = next((path for path in sources if Path(path).suffix.lower() == ".gguf" and Path(path).is_file()), None)
    facts = read_facts(path) if path else history.origin_gguf()
    return _checked_license(facts, "the GGUF source's general.license")


# A license is an identifier (the Hub's list: apache-2.0, llama3.2, ...; or `other`, named by license_name and
# license_link): bounded, so that a card's license of a megabyte or a paragraph is not copied into every output's card
LICENSE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")
LICENSE_FIELDS = {"license": LICENSE_ID, "license_name": LICENSE_ID, "license_link": re.compile(r"\S{1,512}")}


def _checked_license(given, where) -> dict:
    """The license fields to carry of ``given``'s (a card's data, a GGUF's facts, a config's records): license;
    license_name and license_link where it is ``other``, per the Hub. A value that is no identifier (a link) is
    left out with a warning naming ``where``."""
    keys = LICENSE_FIELDS if str(getattr(given, "license", None)).strip() == "other" else ["license"]
    found = {}
    for key in keys:
        value = getattr(given, key, None)
        if not isinstance(value, str) or not value.strip():
            continue
        if LICENSE_FIELDS[key].fullmatch(value.strip()):
            found[key] = value.strip()
        else:
            warn(f"{where}: {key} {shown(repr(value.strip()))} is not a license identifier (the Hugging Face Hub's, "
                 "such as apache-2.0, or other with a license_name) or link; left out of the card")
    return found if "license" in found else {}


def _plural(count, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _done(config: dict, history: History, origin: str | None, trained: Training | None,
          exported: Export | None = None) -> list[str]:
    """What was done, each step as its record says: source, layout, conversion, heal, training, prunings, export."""
    provenance = history.provenance
    layers, post_ln_layers = config.get("num_hidden_layers"), config.get("post_ln_layers") or 0
    items = [f"Source: {_described(origin, history.origin_gguf(origin))}." if origin else "Source: not recorded."]
    if provenance.strategy == "scratch" and any(map(snapshot_model, _sources(history, origin))):
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
    if provenance.strategy is not None:  # the mixln arm: train converted (and healed) its source itself
        inside_train = trained and provenance.source == trained.source
        items.append(_conversion(history, "train" if inside_train else "convert"))
    if provenance.heal:
        items.append(_heal(provenance.heal, trained))
    if trained:
        items.append(f"Trained with `mixln-convert train` (arm `{trained.arm}`): {_plural(trained.steps, 'step')}, "
                     f"{trained.tokens:,} tokens of {_text(trained.data)}, precision "
                     f"`{'fp32' if trained.precision == 'no' else trained.precision}`.")  # accelerate's "no": fp32
    for record in history.records("pruned"):
        if record.exported:  # pruned after an export: the export came first
            items.append(_export(record.exported))
        items.append(_pruning(record))
    if exported:
        items.append(_export(exported))
    return items


def _export(exported: Export) -> str:
    folded = (" LayerNorm Scaling's 1/sqrt(l) folded into each block's norm gains;"
              if exported.folded_layernorm_scaling else "")
    return (f"Exported with `mixln-convert export {_export_to(exported)}` from {_name(exported.source or '')} "
            f"(model type `{exported.source_model_type}`) as a plain `{exported.architecture}`:"
            f"{folded} the same logits, no remote code.")


def _commands(history: History, origin: str | None, trained: Training | None, exported: Export | None) -> list:
    """The commands that made this folder, as blocks: each step's options as its record states them (inputs by
    name, outputs by step), and a training's resolved recipe (as a merge's card carries its config)."""
    provenance = history.provenance
    source = _name(origin).strip("`") if origin else "SOURCE"
    lines, last = [], source
    inside_train = trained and provenance.source == trained.source  # train converted and healed it
    if provenance.strategy is not None and not inside_train:
        lines.append(f"mixln-convert convert {source} converted/ {_convert_options(history)}")
        last = "converted/"
        if heal := provenance.heal:
            teacher = _name(heal.teacher).strip("`") if heal.teacher else source
            data = ({} if str(heal.data or "").startswith(("embedded:", "a stream of"))
                    else {"data": _text_name(str(heal.data))})
            given = _given(HealOptions, tokens=heal.tokens, loss=heal.loss, lr=heal.lr, seq_len=heal.seq_len,
                           batch_size=heal.batch_size, **data)
            lines.append(f"mixln-convert heal {last} {_given(HealCommand, teacher=teacher, out='healed/')} {given}")
            last = "healed/"
    if trained:
        lines.append(f"mixln-convert train recipe.yaml {_given(TrainOptions, arm_names=trained.arm, out='run/')}"
                     "   # the recipe below")
        last = f"run/{trained.arm}/final"
    for record in history.records("pruned"):
        if record.exported:  # pruned after an export: the export came first
            lines.append(f"mixln-convert export {last} exported/ {_export_to(record.exported)}")
            last = "exported/"
        how = (_given(PruneOptions, layers=",".join(map(str, record.removed_layers))) if record.method == "explicit"
               else _given(PruneOptions, remove=len(record.removed_layers), method=record.method))
        lines.append(f"mixln-convert prune {last} pruned/ {how}")
        last = "pruned/"
    if exported:
        lines.append(f"mixln-convert export {last} exported/ {_export_to(exported)}")
    if not lines:
        return [("p", "No command of mixln-convert is recorded for this folder.")]
    blocks = [("p", "As recorded (inputs by name, each output named by its step; the last is this folder):"),
              ("p", "```bash\n" + "\n".join(lines) + "\n```")]
    if trained and trained.recipe is not None:
        import yaml

        blocks += [("p", "The training recipe, resolved (`train` writes it to OUT/recipe.yaml; paths by name):"),
                   ("p", "```yaml\n" + yaml.safe_dump(_named_paths(trained.recipe), sort_keys=False).rstrip()
                    + "\n```")]
    return blocks


def _given(options, **values) -> str:
    """``--flag value`` for each of a command's settings in ``values``, each flag as its ``options`` class declares it:
    a card's commands follow a renamed flag."""
    return " ".join(f"{options.flag(name)} {value}" for name, value in values.items())


def _export_to(exported: Export) -> str:
    return _given(ExportOptions, to=exported.exported_to or "llama")


def _named_paths(value):
    """A recipe with each absolute path by its last part (a Hub snapshot by its repo)."""
    if isinstance(value, dict):
        return {key: _named_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_named_paths(item) for item in value]
    if isinstance(value, str) and Path(value).is_absolute():
        return _name(value).strip("`")
    return value


def _convert_options(history: History) -> str:
    provenance, strategy = history.provenance, history.provenance.strategy
    if history.layernorm_scaling:
        given = {"layout": "lns", **({"strategy": strategy} if strategy == "scratch" else {})}
    elif history.alpha is not None:
        given = {"alpha": f"{history.alpha:g}", "strategy": strategy}
    else:
        given = {"post_ln_layers": history.post_ln_layers, "strategy": strategy}
    if (calibration := provenance.calibration) and calibration.tokens:
        if not str(calibration.data or "").startswith("embedded:"):
            given["calibration_data"] = _text_name(str(calibration.data))
        given |= {"calibration_tokens": calibration.tokens, "calibration_seq_len": calibration.seq_len}
    if provenance.seed is not None and strategy in ("reinit-post", "scratch"):
        given["seed"] = provenance.seed
    no_scaled_init = f" {ConvertOptions.flag('scaled_init', off=True)}" if provenance.scaled_init is False else ""
    return _given(ConvertOptions, **given) + no_scaled_init


def _conversion(history: History, command: str = "convert") -> str:
    provenance, strategy = history.provenance, history.provenance.strategy
    if history.layernorm_scaling:
        what = "to LayerNorm Scaling"
    else:
        alpha = history.alpha
        what = "to Mix-LN, " + (f"alpha {alpha:g}" if alpha is not None else "the Post-LN count given")
        if not history.post_ln_layers and not history.pruned and not provenance.pruned:
            what += (f" (floor(alpha x {history.num_hidden_layers}) = 0: no block was made Post-LN, so the model "
                     "computes the source's Pre-LN function in the Mix-LN format)")
    unchanged = (not history.layernorm_scaling and not history.post_ln_layers
                 and strategy in ("calibrated", "move", "reinit-post"))  # they change only the Post-LN blocks
    text = (f"Converted with `mixln-convert {command}` {what}, strategy `{strategy}`: "
            f"{UNCHANGED if unchanged else STRATEGIES.get(strategy, strategy)}")
    if (calibration := provenance.calibration) and calibration.tokens:
        text += (f" (calibrated on {calibration.tokens:,} tokens of {_text(calibration.data)}, windows of "
                 f"{calibration.seq_len})")
    if provenance.seed is not None and strategy in ("reinit-post", "scratch"):
        text += f"; seed {provenance.seed}"
    return text + "."


def _heal(heal: Heal, trained: Training | None = None) -> str:
    which = "Post-LN block" if heal.post_ln_layers == 1 else f"{heal.post_ln_layers} Post-LN blocks"
    return (f"Healed with `mixln-convert heal`: the {which} distilled "
            f"against {_name(heal.teacher) if heal.teacher else 'the source'} on "
            f"{heal.tokens:,} tokens of {_text(heal.data, trained)} "
            f"({_plural(heal.steps, 'step')}, lr {heal.lr}; loss `{heal.loss}`: {LOSSES.get(heal.loss, 'as recorded')})"
            + (f"; {heal.data_passes:.3g} passes over that text: it repeated" if (heal.data_passes or 0) > 1 else "")
            + ".")


def _pruning(record: Pruning) -> str:
    removed = record.removed_layers
    text = (f"Pruned with `mixln-convert prune`: decoder block{'s' * (len(removed) != 1)} "
            f"{', '.join(map(str, removed))} of {record.num_layers_before} removed (method `{record.method}`")
    if record.tokens:
        text += f", scored on {record.tokens:,} tokens of {_text(record.data)}"
    return text + ")."


def _ppl(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "not measured"


def _measured(heal: Heal | None, trained: Training | None) -> list:
    """The command's figures as blocks: the heal's and the training run's, each with its text."""
    blocks = []
    if heal:
        on = (f"{_text(heal.evaluation.data)}, {heal.evaluation.tokens:,} tokens in windows of "
              f"{heal.evaluation.seq_len}")
        rows = [[name, _ppl(figures.before), _ppl(figures.after), _ppl(figures.teacher)]
                for name, figures in (("perplexity (packed windows)", heal.perplexity),
                                      ("perplexity (per document)", heal.per_document_perplexity)) if figures]
        error = heal.relative_error
        rows.append(["relative error of the Post-LN blocks' output to the teacher's",
                     *(f"{value:.4g}" if value is not None else "not measured"
                       for value in ((error.before, error.after) if error else (None, None))), "—"])
        blocks += [("p", f"The heal, measured on the model as it was then, on held-out text ({on}):"),
                   ("table", ["figure", "before the heal", "after the heal", "teacher"], rows)]
    if trained:
        validation = trained.validation
        blocks.append(("p", f"Training: validation perplexity {_ppl(trained.initial_val_ppl)} before the "
                            f"first step and {_ppl(trained.final_val_ppl)} after the last, on "
                            f"{_text(validation.data)} ({validation.tokens:,} tokens in windows of "
                            f"{validation.seq_len})."))
    if not blocks:
        blocks.append(("p", "No quality figure was measured on the way to this model. `mixln-convert eval` "
                            f"measures perplexity; `mixln-convert eval {EvalOptions.flag('tasks')}` scores "
                            "lm-evaluation-harness tasks."))
    return blocks


def _loading(config: dict, layout: str) -> list:
    remote = "auto_map" in config  # the Mix-LN classes, saved beside the weights
    trust = ", trust_remote_code=True" if remote else ""
    # the tokenizer too: AutoTokenizer reads config.json, whose model type is the remote code's (without the
    # flag transformers asks "run the custom code? [y/N]" and waits)
    code = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f"model = AutoModelForCausalLM.from_pretrained(\"{PLACEHOLDER}\"{trust})\n"
            f"tokenizer = AutoTokenizer.from_pretrained(\"{PLACEHOLDER}\"{trust})\n"
            "inputs = tokenizer(\"The quick brown fox\", return_tensors=\"pt\")\n"
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20, do_sample=False)[0]))\n```")
    if remote:
        note = (f"`trust_remote_code=True` runs the {LAYOUTS[layout] if layout != 'pre-ln' else 'Mix-LN'} model code "
                "saved beside the weights (configuration_mixln.py, modeling_mixln.py). With mixln-convert installed, "
                "`import mixln_convert.model.register` first loads it without remote code.")
    else:
        note = "A plain transformers checkpoint: no remote code is needed."
    return [("p", code), ("p", f"Replace `{PLACEHOLDER}` with this folder's path, or its Hub id once uploaded. "
                               + note)]
