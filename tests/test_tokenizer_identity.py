"""Every output folder (convert, prune, heal, a trained final/) reads text exactly as its source does: the same
tokenizer class, the same ids for every text, through the tool's loader and through plain AutoTokenizer.

A Qwen2 source once loaded as Qwen2Tokenizer and its converted copy as TokenizersBackend: transformers picks
the class by the config's model type too (a ``qwen2`` config reads any declared class as Qwen2Tokenizer, which
builds its own NFC normalizer and pre-tokenizer), and a converted ``mixln_qwen2`` config by the class the
copied tokenizer_config.json declares. The two encode some texts differently (evaluation 261.276 vs 261.480
with logits equal to 2e-7)."""

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny import make_tiny_llama, write_tiny_gguf
from transformers import AutoTokenizer

from mixln_convert.conversion.converter import convert
from mixln_convert.errors import MixLNError
from mixln_convert.healing import heal
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.surgery.loading import load_tokenizer
from mixln_convert.surgery.prune import prune

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    " one leading space", "   three leading spaces", "trailing spaces   ",
    "line one\nline two\n\n\tindented\r\nwindows line",
    "café naïve — “quoted” 日本語 😀 Ω ﬁ",
    "e\u0301 decomposed (NFD) next to \u00e9 composed",
    "</s><s> special <unk> tokens </s>", "<|endoftext|>after the end",
    "don't DON'T it's 12345 3.14 x2", "",
]
FAMILIES = ("llama", "qwen2", "qwen3")
# what tokenizer_config.json declares: as made (TokenizersBackend for LLaMA, Qwen2Tokenizer for Qwen), the
# generic class transformers 5 saves a fine-tune's tokenizer as, and no class at all
DECLARED = ("as-made", "TokenizersBackend", None)


def ids(tokenizer, text: str) -> tuple:
    return (tokenizer(text)["input_ids"], tokenizer(text, add_special_tokens=False)["input_ids"])


def assert_reads_alike(source, output, label: str):
    """``output``'s tokenizer, through the tool's loader and plain AutoTokenizer, is ``source``'s (the tool's)."""
    expected = load_tokenizer(source)
    for how, tokenizer in (("tool", load_tokenizer(output)), ("AutoTokenizer", AutoTokenizer.from_pretrained(output))):
        assert type(tokenizer).__name__ == type(expected).__name__, (label, how)
        for text in TEXTS:
            assert ids(tokenizer, text) == ids(expected, text), (label, how, text)
            assert tokenizer.decode(ids(tokenizer, text)[1]) == expected.decode(ids(expected, text)[1])
        assert tokenizer.eos_token_id == expected.eos_token_id and tokenizer.bos_token_id == expected.bos_token_id


def declaring(folder: Path, declared) -> Path:
    """``folder`` with its tokenizer_config.json's tokenizer_class set to ``declared`` (None: left out)."""
    if declared != "as-made":
        file = folder / "tokenizer_config.json"
        config = {k: v for k, v in json.loads(file.read_text()).items() if k != "tokenizer_class"}
        file.write_text(json.dumps(config if declared is None else {**config, "tokenizer_class": declared}))
    return folder


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """{(family, declared): a tiny checkpoint folder}, and {(family, "gguf"): its Qwen GGUF}."""
    root, found = tmp_path_factory.mktemp("sources"), {}
    for family in FAMILIES:
        for declared in DECLARED:
            folder = make_tiny_llama(root / f"{family}-{declared}", family=family)
            found[family, declared] = declaring(folder, declared)
        if family != "llama":  # write_tiny_gguf writes Qwen's (neox) rope order
            made = found[family, "as-made"]
            found[family, "gguf"] = write_tiny_gguf(made, open_checkpoint(made).arch, root / f"{family}.gguf")
    return found


@pytest.mark.filterwarnings("ignore:the heal made the model worse")  # 4 steps of a random model: not the point
@pytest.mark.parametrize("family", FAMILIES)
def test_converted_pruned_and_healed_outputs_read_text_as_the_source(family, sources, tmp_path):
    for (name, declared), source in sources.items():
        if name != family:
            continue
        label = f"{family} {declared}"
        moved = convert(source, tmp_path / f"{declared}-moved", strategy="move", progress=False)  # streaming
        calibrated = convert(source, tmp_path / f"{declared}-calibrated", calibration_tokens=512,
                             calibration_seq_len=32, progress=False)
        for output in (moved, calibrated):
            assert_reads_alike(source, output, f"{label} -> {output.name}")
        # pruned: the converted copy (a Mix-LN config) and the source itself (a GGUF is pruned into a folder)
        for what, folder in (("converted", moved), ("source", source)):
            pruned = prune(folder, tmp_path / f"{declared}-pruned-{what}", layers="3", progress=False)
            assert_reads_alike(source, pruned, f"{label} -> pruned {what}")
    if family == "qwen2":  # a heal writes the converted copy's tokenizer again
        source = sources["qwen2", "TokenizersBackend"]
        healed = tmp_path / "healed"
        heal(tmp_path / "TokenizersBackend-moved", source, healed, tokens=4 * 4 * 32, seq_len=32, batch_size=4,
             eval_tokens=256, perplexity=False, progress=False)
        assert_reads_alike(source, healed, "qwen2 TokenizersBackend -> healed")


def test_a_generic_qwen2_tokenizer_is_pinned_in_the_converted_config(sources, tmp_path):
    """The root of the mismatch: the converted tokenizer_config.json names the class the source reads as."""
    source = sources["qwen2", "TokenizersBackend"]
    out = convert(source, tmp_path / "out", strategy="move", progress=False)
    assert json.loads((source / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    assert type(AutoTokenizer.from_pretrained(source)).__name__ == "Qwen2Tokenizer"
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()


def test_a_streaming_conversion_pins_the_class_without_importing_transformers(sources, tmp_path):
    """move/reinit-post/alpha 0 keep transformers out of the converting process: a child process names the class."""
    source, out = sources["qwen2", None], tmp_path / "out"
    code = ("import sys; from mixln_convert.conversion.converter import convert; "
            f"convert({str(source)!r}, {str(out)!r}, strategy='move', progress=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    assert_reads_alike(source, out, "qwen2 without a declared class -> moved in a fresh process")


@pytest.mark.parametrize("family", ("qwen2", "qwen3"))
def test_gguf_outputs_read_text_as_the_gguf(family, sources, tmp_path):
    """A GGUF's tokenizer is transformers' reading of its metadata as its saved files read back (as a
    Qwen2Tokenizer: NFC, which the metadata's pipeline lacks); every output saves and reads those files."""
    gguf = sources[family, "gguf"]
    tokenizer = load_tokenizer(gguf)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    composed = tokenizer("e\u0301", add_special_tokens=False)["input_ids"]
    assert composed == tokenizer("\u00e9", add_special_tokens=False)["input_ids"]  # NFC, as every output reads it
    assert ids(tokenizer, "The quick brown fox") == ids(load_tokenizer(sources[family, "as-made"]), "The quick brown fox")
    moved = convert(gguf, tmp_path / "moved", strategy="move", progress=False)
    calibrated = convert(gguf, tmp_path / "calibrated", calibration_tokens=512, calibration_seq_len=32, progress=False)
    pruned = prune(gguf, tmp_path / "pruned", layers="3", progress=False)
    for output in (moved, calibrated, pruned):
        assert_reads_alike(gguf, output, f"{family} gguf -> {output.name}")


# Plain transformers in a process that never imports this package: each folder's tokenizer class and ids.
WITHOUT_PACKAGE = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    texts, out, found = json.loads(sys.argv[1]), sys.argv[2], {}
    for folder in sys.argv[3:]:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        found[folder] = [type(tokenizer).__name__, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]]
    assert "mixln_convert" not in sys.modules
    open(out, "w").write(json.dumps(found))
""")


def test_outputs_read_alike_in_plain_transformers_without_the_package(sources, tmp_path):
    folders = {}
    for family in ("qwen2", "qwen3"):
        for declared in ("TokenizersBackend", None, "gguf"):
            source = sources[family, declared]
            folders[source] = convert(source, tmp_path / f"{family}-{declared}", strategy="move", progress=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    # no stdin: transformers' y/N prompt (run the converted config's code?) refuses, and the config is read plainly
    done = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGE, json.dumps(TEXTS), str(tmp_path / "found.json"),
                           *map(str, folders.values())], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env, cwd=tmp_path, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((tmp_path / "found.json").read_text())
    for source, output in folders.items():
        expected = load_tokenizer(source)
        name, read = found[str(output)]
        assert name == type(expected).__name__, source
        assert read == [expected(t, add_special_tokens=False)["input_ids"] for t in TEXTS], source


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng, words = random.Random(0), "the of model layer norm residual stream token block attention".split()
    path = tmp_path_factory.mktemp("data") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=60)) + "."}) + "\n" for _ in range(200)))
    return path


def test_trained_final_folders_read_text_as_the_source(sources, corpus, tmp_path):
    from mixln_convert.workflows.train import train
    from mixln_convert.training import load_recipe

    source = sources["qwen2", "TokenizersBackend"]
    sets = [f"source={source}", f"data.train={corpus}", "data.validation=null", "seq_len=32", "micro_batch_size=2",
            "global_batch_size=4", "max_tokens=256", "data.eval_tokens=256", "precision=fp32",
            "schedule.warmup_steps=1", "eval_interval=2", "checkpoint_interval=2", "grad_norm_interval=2"]
    train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run", progress=False)
    for arm in ("mixln", "preln"):
        assert_reads_alike(source, tmp_path / "run" / arm / "final", f"qwen2 TokenizersBackend -> {arm} final")


def test_a_folder_without_tokenizer_files_names_the_files_looked_for(sources, tmp_path):
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(sources["llama", "as-made"], folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(MixLNError) as refused:
        load_tokenizer(folder)
    message = str(refused.value)
    assert "cannot load its tokenizer" in message and "one of: )" not in message
    assert (f"one of: tokenizer.json, tokenizer.model, vocab.json with merges.txt; {folder} holds none of them"
            in message), message
    assert len(message.splitlines()) == 1
