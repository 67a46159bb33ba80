"""Hugging Face Hub names where a path is taken (mixln_convert/io/hub.py), offline: a tiny model and
a tiny dataset placed in Hugging Face caches as the libraries leave what they fetched; a name
reads as its folder or file does, a path always wins, and only what a checkpoint needs is fetched."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from hub_cache import DATASET_COMMIT, MODEL_COMMIT, offline_hub, place_dataset, place_model
from mixln_convert.errors import MixLNError, MixLNWarning
from mixln_convert.io.hub import HubDataset, hub_name
from mixln_convert.io.paths import checkpoint_path

MODEL, DATASET = "org/tiny-llama", "org/tiny-text"
TEXTS = [f"Document {i}: " + f"a few words about item number {i}. " * (4 + i % 7) for i in range(60)]


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_llama) -> Path:
    """An offline Hugging Face home (HF_HOME's layout): ``tiny_llama`` as MODEL, TEXTS as DATASET."""
    home = tmp_path / "hf"
    offline_hub(monkeypatch, home / "hub", home / "datasets")
    place_model(tiny_llama, home / "hub", MODEL)
    place_dataset(TEXTS, home / "datasets", DATASET)
    return home


@pytest.fixture
def text_file(tmp_path) -> Path:
    """TEXTS as a JSON-lines file: what the Hub dataset must read as."""
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    return path


def snapshot(home: Path) -> Path:
    return home / "hub" / f"models--{MODEL.replace('/', '--')}" / "snapshots" / MODEL_COMMIT


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_an_existing_path_wins_and_only_the_shape_of_a_name_is_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert hub_name("org/model", "model") is None and hub_name("org/model", "dataset") is None
    assert hub_name(Path("org/other"), "model") is None  # a Path object is always a path
    name = hub_name("org/other@v1.0", "model")
    assert (name.repo, name.revision) == ("org/other", "v1.0")
    name = hub_name("org/text:en:validation@refs/pr/1", "dataset")
    assert (name.repo, name.config, name.split, name.revision) == ("org/text", "en", "validation", "refs/pr/1")
    name = hub_name("org/text::test", "dataset")
    assert (name.config, name.split, name.revision) == (None, "test", None)
    assert (hub_name("org/text", "dataset").config, hub_name("org/text", "dataset").split) == (None, "train")
    assert hub_name("org/text:en", "model") is None
    for text in ("./org/x", "/abs/x", "~/x", "a/b/c", "org/", "org/x@", "org/x y", "org--a/x", "org/x.", "x", "org/*"):
        assert hub_name(text, "model") is None and hub_name(text, "dataset") is None, text
    with pytest.raises(MixLNError, match=r"^SRC a/b/c: no such file or folder$"):
        checkpoint_path("a/b/c", "SRC")


def test_a_cached_hub_model_converts_offline_as_its_folder_does(home, tiny_llama, tmp_path, cli):
    before = digests(home / "hub")
    for src, out in ((tiny_llama, "folder"), (MODEL, "name"), (f"{MODEL}@{MODEL_COMMIT}", "pinned")):
        result = cli("convert", src, tmp_path / out, "--strategy", "move")
        assert result.exit_code == 0, result.output
    expected = load_file(tmp_path / "folder" / "model.safetensors")
    for out in ("name", "pinned"):
        got = load_file(tmp_path / out / "model.safetensors")
        assert got.keys() == expected.keys() and all((got[k] == expected[k]).all() for k in expected)
        assert json.loads((tmp_path / out / "config.json").read_text())["mixln_provenance"]["source"] == str(snapshot(home))
    assert digests(home / "hub") == before


@pytest.mark.parametrize("weights", ["safetensors-sharded", "safetensors-and-bin", "bin"])
def test_only_the_files_a_checkpoint_reads_are_fetched_at_the_revision_asked(weights, tmp_path, monkeypatch):
    """The Hub answers through stand-ins of huggingface_hub's calls: its listing of a repo with
    weights in several formats and files the tool never reads."""
    import huggingface_hub

    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    beside = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
              "onnx/model.onnx", "original/consolidated.00.pth", "consolidated.safetensors"]
    listing = {"safetensors-sharded": [*shards, "model.safetensors.index.json", "pytorch_model.bin"],
               "safetensors-and-bin": ["model.safetensors", "pytorch_model.bin"],
               "bin": ["pytorch_model.bin"]}[weights] + beside
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": shards[0], "b.weight": shards[1], "c.weight": shards[1]}}))
    asked = {}

    def model_info(self, repo, revision=None, **_):
        asked["info"] = (repo, revision)
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=name) for name in listing])

    def hf_hub_download(repo, filename, revision=None, **_):
        asked["index"] = (repo, filename, revision)
        return str(index)

    def snapshot_download(repo, revision=None, allow_patterns=None, **_):
        asked["snapshot"] = (repo, revision, allow_patterns)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert checkpoint_path("org/big@v2", "SRC") == str(tmp_path / "snapshot")
    weight_files = {"safetensors-sharded": ["model.safetensors.index.json", *shards],
                    "safetensors-and-bin": ["model.safetensors"], "bin": ["pytorch_model.bin"]}[weights]
    assert asked["snapshot"] == ("org/big", "v2", ["config.json", *weight_files, "generation_config.json",
                                                    "tokenizer.json", "tokenizer_config.json", "README.md"])
    assert asked["info"] == ("org/big", "v2")
    assert asked.get("index") == (("org/big", "model.safetensors.index.json", "v2") if "index.json" in weight_files[0]
                                  else None)


def test_with_the_hub_out_of_reach_the_cache_serves_and_a_name_it_lacks_says_why(home, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers there
    with pytest.warns(MixLNWarning, match=f"^SRC {MODEL}: the Hub is out of reach: "):  # the cache may be behind it
        assert checkpoint_path(MODEL, "SRC") == str(snapshot(home))
    with pytest.raises(MixLNError, match=r"^--teacher org/absent: no such file or folder, and the Hugging Face cache "
                                         r".* holds no model org/absent \(the Hub is out of reach: "):
        checkpoint_path("org/absent", "--teacher")


def test_a_hub_dataset_reads_and_tokenizes_streamed_as_its_text_file_does(home, text_file, tiny_llama, tmp_path, cli,
                                                                        monkeypatch):
    from mixln_convert.data import read_texts

    streamed, real = [], HubDataset.records
    monkeypatch.setattr(HubDataset, "records", lambda self, streaming: streamed.append(streaming) or real(self, streaming))
    assert read_texts(DATASET) == read_texts(text_file) == TEXTS and streamed == [False]
    settings = ["--num-proc", "1", "--shard-tokens", "256", "--validation-fraction", "0.2"]
    by_name = cli("tokenize", DATASET, "--tokenizer", MODEL, "--out", tmp_path / "by-name", *settings)
    by_file = cli("tokenize", text_file, "--tokenizer", tiny_llama, "--out", tmp_path / "by-file", *settings)
    assert by_name.exit_code == 0 and by_file.exit_code == 0, by_name.output + by_file.output
    assert streamed[1:] and all(streamed[1:])
    shards = sorted(p.name for p in (tmp_path / "by-file").glob("*.bin"))
    assert len(shards) > 2 and sorted(p.name for p in (tmp_path / "by-name").glob("*.bin")) == shards
    assert all((tmp_path / "by-name" / s).read_bytes() == (tmp_path / "by-file" / s).read_bytes() for s in shards)
    manifest = json.loads((tmp_path / "by-name" / "mixln-tokens.json").read_text())
    assert manifest["sources"] == [{"role": "held_out", "dataset": DATASET, "config": "default", "split": "train",
                                    "revision": DATASET_COMMIT}]


def test_a_recipe_takes_hub_names_for_its_source_and_its_text(home, cli):
    from mixln_convert.data import data_fingerprint
    from mixln_convert.training import load_recipe

    recipe = load_recipe("smollm2-135m-cpu", [f"source={MODEL}", f"data.train={DATASET}"])
    assert recipe.source == str(snapshot(home)) and recipe.data.train == DATASET
    assert data_fingerprint(recipe.data.train, recipe.data.validation) == {DATASET: DATASET_COMMIT}
    result = cli("estimate", "smollm2-135m-cpu", "--set", f"source={MODEL}")
    assert result.exit_code == 0 and "parameters" in result.output, result.output


def test_the_environment_is_honoured_and_a_name_the_cache_lacks_is_refused(home):
    """HF_HUB_OFFLINE and HF_HOME as a user sets them, read by the libraries at start-up."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HF_DATASETS_CACHE")},
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(home)}
    code = ("import json, sys\nfrom mixln_convert.cli import main\ntry:\n    main(['eval', 'org/absent'])\n"
            "except SystemExit as e:\n"
            "    found = [e.code]\n"
            "from mixln_convert.data import read_texts\nfrom mixln_convert.io.paths import checkpoint_path\n"
            f"print(json.dumps([*found, checkpoint_path({MODEL!r}, 'SRC'), read_texts({DATASET!r})]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, str(snapshot(home)), TEXTS]
    assert [line for line in done.stderr.splitlines() if line.startswith("Error:")] == [
        f"Error: CKPT org/absent: no such file or folder, and the Hugging Face cache {home / 'hub'} holds no model "
        "org/absent (offline mode: HF_HUB_OFFLINE)"]


def test_heal_names_its_default_output_after_a_hub_model_in_the_current_folder(tmp_path):
    """CONVERTED-healed lies beside a local CONVERTED; for a Hub model ORG/NAME it is NAME-healed here,
    not a folder ORG/ made for it."""
    from mixln_convert.cli import _healed_beside

    (tmp_path / "org" / "model").mkdir(parents=True)
    assert _healed_beside(str(tmp_path / "org" / "model")) == str(tmp_path / "org" / "model-healed")
    assert _healed_beside("some-org/some-model@v1.0") == "some-model-healed"


def test_a_cached_repo_of_one_gguf_reads_as_that_file_and_several_are_named(home, tmp_path, cli):
    """A Hub repo that holds a GGUF and no config.json (how llama.cpp models are shared) is no "no model"."""
    from tiny import make_tiny_llama, write_tiny_gguf

    from mixln_convert.io.loader import open_checkpoint

    folder = make_tiny_llama(tmp_path / "qwen2", family="qwen2")
    files = tmp_path / "repo"
    files.mkdir()
    write_tiny_gguf(folder, open_checkpoint(folder).arch, files / "tiny-f32.gguf")
    (files / "README.md").write_text("a model card")
    snapshot = place_model(files, home / "hub", "org/tiny-gguf")
    assert checkpoint_path("org/tiny-gguf", "SRC") == str(snapshot / "tiny-f32.gguf")
    result = cli("eval", "org/tiny-gguf", "--max-tokens", "64", "--seq-len", "16")
    assert result.exit_code == 0 and "perplexity" in result.output, result.output
    shutil.copy(files / "tiny-f32.gguf", files / "tiny-q8.gguf")
    place_model(files, home / "hub", "org/two-gguf")
    with pytest.raises(MixLNError, match=r"^SRC org/two-gguf: the cached snapshot .* holds no config.json but 2 .gguf "
                                         r"files \(tiny-f32.gguf, tiny-q8.gguf\); fetch the one you mean"):
        checkpoint_path("org/two-gguf", "SRC")
    (files / "tiny-f32.gguf").unlink(), (files / "tiny-q8.gguf").unlink()
    place_model(files, home / "hub", "org/card-only")
    with pytest.raises(MixLNError, match=r"^SRC org/card-only: the cached snapshot .* holds no config.json and no "
                                         r".gguf file \(offline mode"):
        checkpoint_path("org/card-only", "SRC")
