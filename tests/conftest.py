"""Shared fixtures: tiny random LLaMA checkpoints, made once per session, in every input layout."""

import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))

from tiny import make_tiny_llama  # noqa: E402

# Small calibration budget: the tiny model's statistics settle long before 8192 tokens.
FAST = dict(calibration_tokens=1024, calibration_seq_len=64, progress=False)


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory):
    """A temporary user cache (token caches land there), sharing the real cache's models folder so
    the real-model tests find the fetched GGUF instead of fetching it again."""
    from mixln_convert.fetch import cache_dir

    models, cache = cache_dir() / "models", tmp_path_factory.mktemp("cache")
    models.mkdir(parents=True, exist_ok=True)
    (cache / "models").symlink_to(models)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIXLN_CONVERT_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Untied 8-layer random LLaMA saved as one model.safetensors (never modified by tests)."""
    return make_tiny_llama(tmp_path_factory.mktemp("src") / "untied")


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("src") / "tied", seed=1, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_llama_sharded(tmp_path_factory) -> Path:
    """The same kind of model in several safetensors shards with an index."""
    folder = make_tiny_llama(tmp_path_factory.mktemp("src") / "sharded", seed=2, max_shard_size="300KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


@pytest.fixture(scope="session")
def tiny_llama_bin(tiny_llama, tmp_path_factory) -> Path:
    """``tiny_llama`` as a pickled ``pytorch_model.bin`` (transformers 5 only saves safetensors)."""
    folder = tmp_path_factory.mktemp("src") / "bin"
    shutil.copytree(tiny_llama, folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


@pytest.fixture(scope="session")
def converted(tiny_llama, tmp_path_factory) -> Path:
    """``tiny_llama`` converted with the default (calibrated) strategy, alpha 0.25: 2 Post-LN layers."""
    from mixln_convert.conversion.converter import convert

    return convert(tiny_llama, tmp_path_factory.mktemp("converted") / "calibrated", alpha=0.25, **FAST)


@pytest.fixture(scope="session")
def converted_lns(tiny_llama, tmp_path_factory) -> Path:
    """``tiny_llama`` retrofitted to LayerNorm Scaling (``--layout lns``): the same function."""
    from mixln_convert.conversion.converter import convert

    return convert(tiny_llama, tmp_path_factory.mktemp("converted") / "lns", layout="lns", progress=False)


@pytest.fixture
def tiny_convert(tmp_path):
    """``convert(src, tmp_path / name, ...)`` with the small calibration budget (a calibrated Mix-LN
    conversion's) and no progress bars."""
    from mixln_convert.conversion.converter import convert

    def run(src, name="out", **kw):
        calibrated = kw.get("strategy", "calibrated") == "calibrated" and kw.get("layout", "mixln") == "mixln"
        return convert(src, tmp_path / name, **{**(FAST if calibrated else {"progress": False}), **kw})

    return run


@pytest.fixture
def cli():
    """Run ``mixln-convert ARGS...`` in-process; returns click's Result (stdout/stderr apart)."""
    from mixln_convert.cli import main

    return lambda *args: CliRunner().invoke(main, [str(a) for a in args])
