"""The model card (README.md) of every output folder a user keeps: convert, heal, prune and a trained arm's
final/. Its front matter is read as the Hub reads it (huggingface_hub's ModelCard); its body names what was
done and the figures measured; a source's own card text never appears in it."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hub_cache import MODEL_COMMIT, offline_hub, place_model
from tiny import make_tiny_llama, write_tiny_gguf
from mixln_convert.healing import heal
from mixln_convert.surgery.prune import prune

SENTINEL = "Words of the source's own card, which no card of ours repeats."
SOURCE_CARD = f"---\nlicense: apache-2.0\nlanguage: en\n---\n\n# The source\n\n{SENTINEL}\n"
HEAL = dict(seq_len=32, batch_size=4, eval_tokens=256, progress=False)  # one heal step of 4 x 32 tokens


def card(folder: Path) -> tuple[dict, str]:
    """(front matter, body) of ``folder``'s README.md."""
    loaded = ModelCard.load(folder / "README.md")
    return loaded.data.to_dict(), loaded.text


def with_card(model: Path, folder: Path, readme: str | None = SOURCE_CARD, **config) -> Path:
    """A copy of ``model`` with ``readme`` as its README.md and ``config`` set in its config.json."""
    shutil.copytree(model, folder)
    if readme is not None:
        (folder / "README.md").write_text(readme)
    if config:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


def test_convert_card_states_layout_strategy_and_the_source_license(tiny_llama, tiny_convert, tmp_path):
    source = with_card(tiny_llama, tmp_path / "source")
    out = tiny_convert(source, alpha=0.25)  # calibrated: 2 of 8 blocks Post-LN
    data, body = card(out)
    assert data["library_name"] == "transformers" and data["license"] == "apache-2.0"
    assert data["tags"] == ["mixln-convert", "mix-ln", "llama"]
    assert "base_model" not in data  # a local path is no Hub id: the body names it
    assert f"the local checkpoint `{source.name}`" in body and str(tmp_path) not in body  # no local path
    assert "first 2 of 8 decoder blocks Post-LN" in body and "alpha 0.25" in body
    assert "strategy `calibrated`" in body and "1,024 tokens of mixln-convert's embedded corpus (calibration split" in body
    assert ("mixln-convert convert source converted/ --alpha 0.25 --strategy calibrated --calibration-tokens 1024 "
            "--calibration-seq-len 64") in body and "(https://arxiv.org/abs/2412.13795)" in body
    assert "trust_remote_code=True" in body and "No quality figure was measured" in body
    assert SENTINEL not in (out / "README.md").read_text() and "# The source" not in body


def test_lns_card_and_a_license_from_the_config_past_a_damaged_card(tiny_llama, converted_lns, tiny_convert, tmp_path):
    data, body = card(converted_lns)  # its source has no card and no license: none is claimed
    assert data["tags"] == ["mixln-convert", "layernorm-scaling", "llama"] and "license" not in data
    assert "strategy `exact`" in body and "No license was found" in body and "trust_remote_code=True" in body
    assert "[LayerNorm Scaling](https://arxiv.org/abs/2502.05795)" in body
    damaged = "---\nlicense: [unclosed\n---\n" + SENTINEL  # a card whose YAML breaks: the command goes on
    out = tiny_convert(with_card(tiny_llama, tmp_path / "source", damaged, license="mit"), layout="lns")
    data, body = card(out)
    assert data["license"] == "mit" and SENTINEL not in body


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_the_family_is_a_tag(family, tiny_convert, tmp_path):
    data, body = card(tiny_convert(make_tiny_llama(tmp_path / family, family=family), strategy="move"))
    assert data["tags"] == ["mixln-convert", "mix-ln", family] and f"Mix-LN ({family})" in body


def test_a_license_that_is_no_identifier_is_left_out_with_a_warning(tiny_llama, tiny_convert, tmp_path):
    """A license is an identifier (the Hub's, or `other` with a license_name): a source card's license of
    1 MB was once copied twice into the output's card (its front matter and its License section)."""
    from mixln_convert.errors import MixLNWarning

    huge = "x" * 2**20
    source = with_card(tiny_llama, tmp_path / "huge", f"---\nlicense: {huge}\n---\n", license="see the paper, p. 3")
    with pytest.warns(MixLNWarning) as warned:
        out = tiny_convert(source, layout="lns")
    data, body = card(out)
    assert "license" not in data and "No license was found" in body
    assert (out / "README.md").stat().st_size < 10_000
    messages = [str(w.message) for w in warned]
    assert any(m.startswith(f"{source / 'README.md'}: license 'xxx") and "(1,048,578 characters)" in m for m in messages)
    assert any(m.startswith("config.json: license 'see the paper, p. 3' is not a license identifier") for m in messages)
    named = "---\nlicense: other\nlicense_name: my-license-1.0\nlicense_link: https://example.com/LICENSE\n---\n"
    data, body = card(tiny_convert(with_card(tiny_llama, tmp_path / "other", named), "other-out", layout="lns"))
    assert (data["license"], data["license_name"], data["license_link"]) == ("other", "my-license-1.0",
                                                                             "https://example.com/LICENSE")

def test_heal_card_has_the_figures_before_and_after_with_their_text(converted, tiny_llama, tmp_path):
    result = heal(converted, tiny_llama, tmp_path / "healed", tokens=4 * 32, lr=0.01, loss="residual", **HEAL)
    data, body = card(tmp_path / "healed")
    assert data["tags"] == ["mixln-convert", "mix-ln", "llama"] and "base_model" not in data
    assert f"`{tiny_llama.name}`" in body and "first 2 of 8 decoder blocks Post-LN" in body
    assert "strategy `calibrated`" in body and "Healed with `mixln-convert heal`" in body
    assert f"the 2 Post-LN blocks distilled against `{tiny_llama.name}`" in body
    assert f"{result.tokens:,} tokens of mixln-convert's embedded corpus (train split" in body
    assert "loss `residual`: the relative error of the residual stream entering the first Pre-LN block" in body
    assert "embedded:" not in body and str(tiny_llama.parent) not in body
    assert "mixln-convert heal converted/ --teacher untied --out healed/ --tokens 128 --loss residual" in body
    evaluation = result.evaluation
    assert (f"(validation split: general English and Python docstrings), {evaluation.tokens:,} tokens in windows "
            "of 32") in body
    ppl = result.perplexity
    assert f"| perplexity (packed windows) | {ppl.before:.2f} | {ppl.after:.2f} | {ppl.teacher:.2f} |" in body
    error = result.relative_error
    assert f"{error.before:.4g} | {error.after:.4g}" in body


def test_prune_card_of_a_mixln_and_of_a_plain_model(converted, tiny_llama_tied, tmp_path):
    data, body = card(prune(converted, tmp_path / "mixln", layers="1,5", progress=False))
    assert data["tags"] == ["mixln-convert", "mix-ln", "llama"]
    assert "first 1 of 6 decoder blocks Post-LN" in body and "strategy `calibrated`" in body
    assert "decoder blocks 1, 5 of 8 removed (method `explicit`" in body
    source = with_card(tiny_llama_tied, tmp_path / "plain", license="llama3.2")  # its card says apache-2.0
    data, body = card(prune(source, tmp_path / "pruned", layers="7", progress=False))
    assert data["tags"] == ["mixln-convert", "pre-ln", "llama"] and data["license"] == "apache-2.0"
    assert "decoder block 7 of 8 removed" in body and "Layout: Pre-LN, 7 decoder blocks." in body
    assert "trust_remote_code" not in body and "no remote code is needed" in body and SENTINEL not in body


def test_a_hub_source_is_the_base_model_through_convert_and_prune(tiny_llama, tmp_path, monkeypatch, tiny_convert):
    hub = tmp_path / "hf" / "hub"
    offline_hub(monkeypatch, hub, tmp_path / "hf" / "datasets")
    place_model(with_card(tiny_llama, tmp_path / "files"), hub, "org/tiny-llama")
    out = tiny_convert("org/tiny-llama", strategy="move")
    data, body = card(out)
    assert data["base_model"] == "org/tiny-llama" and data["license"] == "apache-2.0"
    assert f"`org/tiny-llama` (Hugging Face Hub, commit `{MODEL_COMMIT}`)" in body and "strategy `move`" in body
    assert SENTINEL not in body and str(hub) not in body
    data, body = card(prune(out, tmp_path / "pruned", layers="6", progress=False))  # read from its local folder
    assert data["base_model"] == "org/tiny-llama" and data["license"] == "apache-2.0"
    assert SENTINEL not in body
    data, _ = card(tiny_convert("org/tiny-llama", "scratch", strategy="scratch"))
    assert "base_model" not in data  # a fresh model holds none of the source's weights


def train_tiny(source: Path, tmp_path: Path, arms=("mixln",)):
    """The CPU recipe's train on ``source``, one step of 4 x 32 tokens per arm, into ``tmp_path``/run: (summaries, corpus)."""
    from mixln_convert.workflows.train import train
    from mixln_convert.training import load_recipe

    rng, corpus = random.Random(0), tmp_path / "corpus.jsonl"
    words = "the of model layer norm residual stream token block attention gradient data step".split()
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=60)) + "."}) + "\n"
                              for _ in range(120)))
    sets = {"source": source, "data.train": corpus, "data.validation": "null", "seq_len": 32, "micro_batch_size": 2,
            "global_batch_size": 4, "max_tokens": 128, "data.eval_tokens": 128, "precision": "fp32",
            "schedule.warmup_steps": 1, "eval_interval": 1, "checkpoint_interval": 1, "grad_norm_interval": 1,
            "conversion.strategy": "move", "heal.tokens": 0}
    recipe = load_recipe("smollm2-135m-cpu", [f"{k}={v}" for k, v in sets.items()])
    return train(recipe, tmp_path / "run", arms=list(arms), progress=False), corpus


def test_a_trained_arm_final_card_has_its_training_and_validation_figures(tiny_llama_tied, tmp_path):
    source = with_card(tiny_llama_tied, tmp_path / "source")
    summaries, corpus = train_tiny(source, tmp_path)
    summary = summaries["mixln"]
    data, body = card(tmp_path / "run" / "mixln" / "final")
    assert data["tags"] == ["mixln-convert", "mix-ln", "llama"] and data["library_name"] == "transformers"
    assert data["license"] == "apache-2.0" and "base_model" not in data  # carried through the converted folder
    assert f"`{source.name}`" in body and "first 2 of 8 decoder blocks Post-LN" in body and "strategy `move`" in body
    assert f"(arm `mixln`): 1 step, 128 tokens of `{corpus.name}`" in body and str(tmp_path) not in body
    assert "mixln-convert train recipe.yaml --arm mixln --out run/" in body and "max_tokens: 128" in body
    validation = summary.validation
    assert (f"validation perplexity {summary.initial_val_ppl:.2f} before the first step and "
            f"{summary.final_val_ppl:.2f} after the last, on `{Path(validation.data).name}` "
            f"({validation.tokens:,} tokens in windows of 32)") in body
    assert "trust_remote_code=True" in body and SENTINEL not in body


def test_an_exported_plain_model_card_tells_its_sources_history(converted_lns, tmp_path):
    """An LNS checkpoint exported as plain LLaMA: a Pre-LN card loading without remote code, which still says
    where the weights came from (the conversion) and what the export folded; no command that does not exist."""
    from mixln_convert.export import export

    export(converted_lns, tmp_path / "plain", to="llama", progress=False)
    data, body = card(tmp_path / "plain")
    assert data["tags"] == ["mixln-convert", "pre-ln", "llama"] and data["library_name"] == "transformers"
    assert "to LayerNorm Scaling, strategy `exact`" in body
    assert f"Exported with `mixln-convert export --to llama` from `{converted_lns.name}`" in body
    assert "1/sqrt(l) folded into each block's norm gains" in body and "trust_remote_code" not in body
    assert "mixln-convert downstream" not in body and "`mixln-convert eval --tasks`" in body


SNIPPET = re.compile(r"```python\n(.*?)```", re.S)


def run_snippet(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The card's loading code, exactly as the card prints it, in a fresh process with no stdin and without this
    package on its path, where the card's placeholder path names ``folder``."""
    from mixln_convert.io.model_card import PLACEHOLDER

    code = SNIPPET.findall((folder / "README.md").read_text())
    assert len(code) == 1, code
    where = tmp_path / f"run-{folder.parent.name}-{folder.name}"
    (where / PLACEHOLDER).parent.mkdir(parents=True)
    (where / PLACEHOLDER).symlink_to(folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code[0]], cwd=where, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


def test_every_card_loading_code_runs_as_written(converted, tiny_llama, tiny_llama_tied, tmp_path):
    """Issue 56: the loading code of each kind of folder the tool writes (convert, heal, prune, a trained arm's
    final/, export --to llama) runs as written in a fresh process whose stdin is closed: no y/N prompt."""
    from mixln_convert.export import export

    heal(converted, tiny_llama, tmp_path / "healed", tokens=4 * 32, lr=0.01, loss="residual", **HEAL)
    folders = {"convert": converted, "heal": tmp_path / "healed",
               "prune": prune(converted, tmp_path / "pruned", layers="7", progress=False)}
    summaries, _ = train_tiny(tiny_llama_tied, tmp_path, arms=("mixln", "preln"))
    folders["train"] = tmp_path / "run" / "mixln" / "final"
    folders["export"] = export(tmp_path / "run" / "preln" / "final", tmp_path / "exported", to="llama", progress=False)
    for kind, folder in folders.items():
        run = run_snippet(Path(folder), tmp_path)
        assert run.returncode == 0, (kind, run.stderr[-2000:])
        assert "[y/N]" not in run.stdout + run.stderr and run.stdout.strip(), (kind, run.stdout, run.stderr[-2000:])


def gguf_strings(path: Path) -> dict:
    from gguf import GGUFReader, GGUFValueType

    return {key: field.contents() for key, field in GGUFReader(path).fields.items()
            if field.types and field.types[0] in (GGUFValueType.STRING, GGUFValueType.UINT32)}


def test_provenance_through_prune_and_export_to_a_folder_and_to_gguf(tiny_llama, tmp_path, monkeypatch):
    """Issue 56, item 2: a Hub source stays the base model, with its licence, through prune, export --to llama and
    export --to gguf (general.name, general.license, general.base_model.0.*), and the steps are told in each."""
    from mixln_convert.export import export

    hub = tmp_path / "hf" / "hub"
    offline_hub(monkeypatch, hub, tmp_path / "hf" / "datasets")
    place_model(with_card(tiny_llama, tmp_path / "files"), hub, "org/tiny-llama")
    pruned = prune("org/tiny-llama", tmp_path / "pruned", layers="6", progress=False)
    exported = export(pruned, tmp_path / "exported", to="llama", progress=False)
    for folder in (pruned, exported):
        data, body = card(folder)
        assert data["base_model"] == "org/tiny-llama" and data["license"] == "apache-2.0", folder
        assert "decoder block 6 of 8 removed" in body and str(tmp_path) not in body
    assert "mixln-convert prune org/tiny-llama pruned/ --layers 6\nmixln-convert export pruned/ exported/ --to llama" \
        in card(exported)[1]
    for source in (pruned, exported):  # the GGUF tells the same, from the folder or from the exported folder
        file = export(source, tmp_path / f"{source.name}.gguf", to="gguf", type="f32", progress=False)
        meta = gguf_strings(file)
        assert meta["general.name"] == "org/tiny-llama, Pre-LN (llama)" and meta["general.license"] == "apache-2.0"
        assert meta["general.base_model.count"] == 1 and meta["general.base_model.0.name"] == "tiny-llama"
        assert meta["general.base_model.0.organization"] == "org"
        assert meta["general.base_model.0.repo_url"] == "https://huggingface.co/org/tiny-llama"
        assert "decoder block 6 of 8 removed" in meta["general.description"] and str(tmp_path) not in str(meta)
    meta = gguf_strings(export("org/tiny-llama", tmp_path / "as-is.gguf", to="gguf", type="f32", progress=False))
    assert meta["general.source.url"] == "https://huggingface.co/org/tiny-llama"


def test_an_exported_trained_arm_keeps_its_training_record_and_figures(tiny_llama_tied, tmp_path):
    from mixln_convert.export import export

    summaries, corpus = train_tiny(with_card(tiny_llama_tied, tmp_path / "source"), tmp_path, arms=("preln",))
    out = export(tmp_path / "run" / "preln" / "final", tmp_path / "exported", to="llama", progress=False)
    data, body = card(out)
    assert data["license"] == "apache-2.0" and "No quality figure was measured" not in body
    summary = summaries["preln"]
    assert f"(arm `preln`): 1 step, 128 tokens of `{corpus.name}`" in body
    assert f"validation perplexity {summary.initial_val_ppl:.2f} before the first step" in body
    assert "mixln-convert train recipe.yaml --arm preln --out run/" in body
    assert "mixln-convert export run/preln/final exported/ --to llama" in body


def test_a_gguf_source_licence_and_its_dequantized_tensors_are_carried(tmp_path, tiny_convert):
    """Issue 56, item 3: a GGUF source's general.license is the card's licence, and the card says its quantized
    tensors were dequantized."""
    from mixln_convert.io.loader import open_checkpoint

    folder = make_tiny_llama(tmp_path / "qwen2", family="qwen2")
    source = write_tiny_gguf(folder, open_checkpoint(folder).arch, tmp_path / "model.gguf", q8_0=True,
                             general={"general.name": "Tiny Qwen", "general.license": "apache-2.0",
                                      "general.organization": "Org"})
    data, body = card(tiny_convert(source, strategy="move"))
    assert data["license"] == "apache-2.0"
    assert ('the local checkpoint `model.gguf`, a GGUF file ("Tiny Qwen" by Org, license `apache-2.0`); its Q8_0 '
            "tensors were dequantized to float32") in body


def test_a_conversion_to_no_post_ln_block_warns_and_its_card_says_so(tiny_llama, tiny_convert):
    """alpha 0.1 of 8 blocks rounds to 0 Post-LN blocks: convert warns, the card says it."""
    from mixln_convert.errors import MixLNWarning

    with pytest.warns(MixLNWarning, match=r"floor\(0.1 x 8\) = 0 Post-LN blocks"):
        out = tiny_convert(tiny_llama, alpha=0.1)
    body = card(out)[1]
    assert "floor(alpha x 8) = 0: no block was made Post-LN" in body
    # no Post-LN block: the strategy's description of what it did to them is not the card's; every weight is kept
    assert "strategy `calibrated`: with no Post-LN block it changed no weight" in body and "Post-LN blocks'" not in body
    from safetensors.torch import load_file

    source, converted = load_file(tiny_llama / "model.safetensors"), {}
    for shard in out.glob("*.safetensors"):
        converted.update(load_file(shard))
    assert source.keys() == converted.keys() and all(source[k].equal(converted[k]) for k in source)


def test_a_pruned_export_keeps_the_history_from_before_the_export(tiny_llama, tiny_convert, tmp_path):
    """An exported folder's history is in its mixln_export.json, which prune used to leave behind: the pruned
    folder's card, and an export of it, tell source, conversion, export and pruning, in that order, once each."""
    from mixln_convert.export import export

    lns = tiny_convert(with_card(tiny_llama, tmp_path / "source"), layout="lns")
    exported = export(lns, tmp_path / "exported", to="llama", progress=False)
    pruned = prune(exported, tmp_path / "pruned", layers="6", progress=False)
    again = export(pruned, tmp_path / "again", to="llama", progress=False)
    for folder, last in ((pruned, ""), (again, "\nmixln-convert export pruned/ exported/ --to llama")):
        data, body = card(folder)
        assert data["license"] == "apache-2.0" and "Source: the local checkpoint `source`" in body, folder
        done = body.split("## What was done")[1].split("## How it was made")[0]
        assert [done.count(step) for step in ("Converted with", "Exported with", "Pruned with")] == \
            [1, 1 + bool(last), 1], folder
        assert done.index("Converted with") < done.index("Exported with") < done.index("Pruned with"), folder
        assert ("mixln-convert export converted/ exported/ --to llama\nmixln-convert prune exported/ pruned/ --layers 6"
                + last + "\n```") in body, folder
        assert "decoder block 6 of 8 removed" in body and str(tmp_path) not in body


@pytest.mark.parametrize("damage, message", [
    (lambda config: config["mixln_provenance"]["calibration"].update(tokens="many"),
     "config.json: mixln_provenance.calibration.tokens: must be an integer in [0, "),
    (lambda config: config["mixln_provenance"].update(pruned=[{"removed_layers": "6"}]),
     "config.json: mixln_provenance.pruned[0].removed_layers: must be a list of numbers"),
    (lambda config: config.update(mixln_provenance=["not", "a", "record"]),
     "config.json: mixln_provenance: not a provenance record (not a JSON object)"),
])
def test_a_damaged_provenance_record_is_refused_in_one_line_naming_the_file_and_key(converted, tiny_llama, tmp_path,
                                                                                    damage, message):
    """A record of config.json's mixln_provenance is read once, where it enters: a wrong type is one line naming
    the file and the key's path, before any work (prune, heal) and when a card is written from it."""
    from mixln_convert.errors import MixLNError
    from mixln_convert.io.model_card import write_card

    source = tmp_path / "damaged"
    shutil.copytree(converted, source)
    config = json.loads((source / "config.json").read_text())
    damage(config)
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(MixLNError) as raised:
        prune(source, tmp_path / "pruned", layers="6", progress=False)
    assert str(raised.value).startswith(f"{source / 'config.json'}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value) and not (tmp_path / "pruned").exists()
    with pytest.raises(MixLNError, match=re.escape(message)):
        heal(source, tiny_llama, tmp_path / "healed", tokens=4 * 32, lr=0.01, loss="residual", **HEAL)
    assert not (tmp_path / "healed").exists()
    with pytest.raises(MixLNError, match=re.escape(message)):
        write_card(source)


def test_a_damaged_export_record_is_refused_in_one_line_naming_the_file_and_key(converted_lns, tmp_path):
    """An exported folder's mixln_export.json is read as a record: a wrong type in it is one line naming the file
    and key, where prune and an export read it."""
    from mixln_convert.errors import MixLNError
    from mixln_convert.export import export

    exported = export(converted_lns, tmp_path / "exported", to="llama", progress=False)
    record = json.loads((exported / "mixln_export.json").read_text())
    (exported / "mixln_export.json").write_text(json.dumps({**record, "source_config": ["damaged"]}))
    for command in (lambda: prune(exported, tmp_path / "pruned", layers="6", progress=False),
                    lambda: export(exported, tmp_path / "again", to="llama", progress=False)):
        with pytest.raises(MixLNError) as raised:
            command()
        assert str(raised.value) == (f"{exported / 'mixln_export.json'}: source_config: must be an object, "
                                     "got ['damaged']"), str(raised.value)


def test_card_commands_parse_with_the_cli():
    """Each command a card writes, for every kind of step it records, is one the CLI accepts as written: its flags
    come from the commands' declarations, so a renamed flag cannot leave a card that no longer runs."""
    import shlex
    from types import SimpleNamespace as Record

    from mixln_convert.cli import main
    from mixln_convert.io.model_card import _commands

    heal = Record(teacher="/models/teacher", data="/texts/heal.txt", tokens=4096, loss="kl", lr=3e-5, seq_len=256,
                  batch_size=4)
    calibration = Record(tokens=1000, data="/texts/calibration.txt", seq_len=128)
    prunings = [Record(exported=Record(exported_to="llama"), method="explicit", removed_layers=[3, 4]),
                Record(exported=None, method="angular", removed_layers=[1])]
    for layernorm_scaling, alpha, strategy in [(False, None, "reinit-post"), (False, 0.25, "calibrated"),
                                               (True, None, "scratch")]:
        history = Record(layernorm_scaling=layernorm_scaling, alpha=alpha, post_ln_layers=2,
                         provenance=Record(strategy=strategy, calibration=calibration, seed=7, scaled_init=False,
                                           heal=heal, source="/models/source"),
                         records=lambda kind: prunings)
        trained = Record(source="/elsewhere", arm="mixln", recipe=None)
        blocks = _commands(history, "/models/source", trained, Record(exported_to="gguf"))
        lines = blocks[1][1].strip("`\n").removeprefix("bash\n").splitlines()
        assert [line.split()[1] for line in lines] == ["convert", "heal", "train", "export", "prune", "prune",
                                                       "export"]
        for line in lines:
            words = shlex.split(line.split("#")[0])[1:]
            main.commands[words[0]].make_context(words[0], words[1:])  # a flag or choice not taken: UsageError
