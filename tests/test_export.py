"""``mixln-convert export``: LNS, Pre-LN-arm, pruned and plain checkpoints (LLaMA, Qwen2, Qwen3) written as
plain transformers folders (the same logits, loaded without remote code or this package) and as GGUF
files that transformers' GGUF loader and ours read back (logits within each type's measured tolerance,
the tokenizer encoding text to the same ids); a Mix-LN checkpoint with Post-LN blocks refused; inputs
never written."""

import hashlib
import json
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from tiny import TRAINING_TEXT, make_tiny_llama, run_without_package, tiny_tokenizer, write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from mixln_convert.errors import MixLNError, MixLNWarning
from mixln_convert.export import export
from mixln_convert.export.plain import MIXLN_CONFIG_KEYS
from mixln_convert.io.lineage import read_export
from mixln_convert.io.loader import open_checkpoint

IDS = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(0))
TEXT = "Hello, world! In 2024 the quick brown fox\n  jumps  over\tthe ünïcödé dog — 中文."
# max |logit - source logit| / max |source logit| of a GGUF read back, per --type. Measured on the tiny
# random models here (all five sources, both readers): f32 <= 5.3e-7, f16 <= 8.1e-4, bf16 <= 6.5e-3,
# q8_0 <= 2.0e-2; the bounds leave about 3x.
TOLERANCE = {"f32": 2e-6, "f16": 3e-3, "bf16": 2e-2, "q8_0": 6e-2}
PLAIN_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hashes(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@torch.no_grad()
def logits_of(checkpoint) -> torch.Tensor:
    """The logits of a checkpoint as this package loads it (Mix-LN/LNS classes registered), in float32."""
    return open_checkpoint(checkpoint).model(dtype=torch.float32)(input_ids=IDS).logits


@pytest.fixture(scope="module")
def sources(tiny_llama, tiny_llama_tied, converted_lns, tmp_path_factory) -> dict[str, Path]:
    """One checkpoint of each kind that exports: LNS (LLaMA and Qwen3), the Pre-LN arm (a Mix-LN model
    with post_ln_layers 0), a pruned plain LLaMA (tied head), a plain Qwen2 whose config reads like the
    released models' (a sliding_window size, use_sliding_window false)."""
    from mixln_convert.conversion.converter import convert
    from mixln_convert.surgery.prune import prune

    root = tmp_path_factory.mktemp("export-sources")
    qwen2 = make_tiny_llama(root / "qwen2", family="qwen2")
    config = json.loads((qwen2 / "config.json").read_text())
    (qwen2 / "config.json").write_text(json.dumps({**config, "sliding_window": 32768, "use_sliding_window": False}))
    qwen3 = make_tiny_llama(root / "qwen3", family="qwen3", seed=3)
    return {"llama-lns": converted_lns,
            "llama-preln": convert(tiny_llama, root / "preln", alpha=0.0, progress=False),
            "llama-pruned": prune(tiny_llama_tied, root / "pruned", layers="2,5", progress=False),
            "qwen2-plain": qwen2,
            "qwen3-lns": convert(qwen3, root / "qwen3-lns", layout="lns", progress=False)}


KINDS = ["llama-lns", "llama-preln", "llama-pruned", "qwen2-plain", "qwen3-lns"]


def test_llama_export_is_a_plain_model_with_the_same_logits(sources, tmp_path):
    """Every kind as a plain folder: its family's class and model type, none of this package's config keys or
    code, the tokenizer carried over; loaded by plain transformers in a process that never imports this
    package, without trust_remote_code, to logits within 1e-5 of the source's."""
    before = {kind: hashes(src) for kind, src in sources.items()}
    outs = {kind: export(src, tmp_path / kind, to="llama", progress=False) for kind, src in sources.items()}
    for kind, out in outs.items():
        config = json.loads((out / "config.json").read_text())
        family = kind.split("-")[0]
        assert config["model_type"] == family and config["architectures"] == [PLAIN_CLASSES[family]]
        assert not set(MIXLN_CONFIG_KEYS) & set(config), kind
        assert not list(out.glob("*.py")) and (out / "tokenizer.json").is_file()
        assert read_export(out).folded_layernorm_scaling == kind.endswith("-lns")
    stdout, results = run_without_package("logits", IDS, list(outs.values()), tmp_path)
    assert stdout.count("LOADED WITHOUT trust_remote_code") == len(outs), stdout
    for kind, out in outs.items():
        assert PLAIN_CLASSES[kind.split("-")[0]] in stdout
        assert (results[str(out)] - logits_of(sources[kind])).abs().max() <= 1e-5, kind
        assert hashes(sources[kind]) == before[kind]  # the input was never written


def test_lns_export_folds_the_scaling_into_the_block_norm_gains_only(sources, tmp_path):
    """Block l's input and post-attention gains times 1/sqrt(l + 1); Qwen3's per-head q/k norms (inside the
    attention, never scaled) and the final norm unchanged."""
    src = sources["qwen3-lns"]
    out = export(src, tmp_path / "plain", to="llama", progress=False)
    source, plain = open_checkpoint(src), open_checkpoint(out)
    for name in plain.names():
        layer = plain.arch.layer_of(name)
        block_norm = name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight"))
        expected = source.get(name).double() / (layer + 1) ** 0.5 if block_norm else source.get(name).double()
        assert torch.allclose(plain.get(name).double(), expected, rtol=1e-6, atol=0), name


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_export_reads_back_in_transformers_and_here(kind, sources, tmp_path):
    """f32, f16, bf16 and q8_0 files: the logits transformers' GGUF loader and open_checkpoint read are the
    source's within TOLERANCE, the tokenizer transformers reads encodes text to the source's ids, the
    tensors are stored as the type says (vectors f32), the export warns of nothing."""
    src = sources[kind]
    reference, tokenizer = logits_of(src), open_checkpoint(src).tokenizer
    scale = reference.abs().max()
    for tensor_type, bound in TOLERANCE.items():
        path = tmp_path / f"{tensor_type}.gguf"
        with warnings.catch_warnings():
            warnings.simplefilter("error", MixLNWarning)
            export(src, path, to="gguf", type=tensor_type, progress=False)
        with torch.no_grad():
            theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()(input_ids=IDS).logits
        ours = logits_of(path)
        for read in (theirs, ours):
            assert (read - reference).abs().max() <= bound * scale, (kind, tensor_type)
        read_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
        assert read_tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"], (kind, tensor_type)
        # transformers' GGUF reader appends GPT-2's <|endoftext|> to a byte-level vocabulary lacking it (the tiny
        # LLaMA's; Llama 3's), one token past vocab_size: our loader drops it, and reads every file
        assert open_checkpoint(path).tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"], (kind, tensor_type)
        types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
        assert {types[name] for name in types if "norm" in name or name.endswith(".bias")} == {"F32"}
        assert types["token_embd.weight"] == tensor_type.upper()


def test_gguf_names_and_metadata_are_llama_cpp_s(sources, tmp_path):
    path = export(sources["llama-pruned"], tmp_path / "m.gguf", to="gguf", type="q8_0", progress=False)
    fields = GGUFReader(path).fields
    value = {key: fields[key].contents() for key in fields if not key.startswith("GGUF.")}
    assert value["general.architecture"] == "llama" and value["llama.block_count"] == 6
    assert value["llama.attention.head_count_kv"] == 2 and value["llama.rope.dimension_count"] == 16
    assert value["general.file_type"] == 7  # MOSTLY_Q8_0
    assert value["tokenizer.ggml.model"] == "gpt2" and value["tokenizer.ggml.pre"] == "gpt-2"
    assert len(value["tokenizer.ggml.tokens"]) == value["llama.vocab_size"] and value["tokenizer.ggml.merges"]
    names = {t.name for t in GGUFReader(path).tensors}
    assert "output.weight" not in names  # tied: llama.cpp uses the embeddings
    assert {"token_embd.weight", "output_norm.weight", "blk.5.attn_q.weight", "blk.5.ffn_down.weight"} <= names
    assert not any(name.startswith("blk.6.") for name in names)
    qwen = export(sources["qwen2-plain"], tmp_path / "q.gguf", to="gguf", progress=False)
    fields = GGUFReader(qwen).fields
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2" and fields["general.file_type"].contents() == 1
    assert "blk.0.attn_q.bias" in {t.name for t in GGUFReader(qwen).tensors}


def sentencepiece_tokenizer():
    """A tiny LLaMA-2-style tokenizer: BPE over "\u2581"-marked words with byte fallback (<0xNN> tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    state = json.loads(bpe.to_str())["model"]
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)])}
    for token in sorted(state["vocab"], key=state["vocab"].get):
        vocab.setdefault(token, len(vocab))
    return LlamaTokenizer(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split()) for m in
                                               state["merges"]])


def test_a_sentencepiece_tokenizer_exports_as_llama_cpp_s_llama_model(tmp_path):
    tokenizer = sentencepiece_tokenizer()
    src = make_tiny_llama(tmp_path / "src", vocab_size=len(tokenizer))
    for file in src.glob("tokenizer*"):
        file.unlink()
    tokenizer.save_pretrained(src)
    path = export(src, tmp_path / "m.gguf", to="gguf", type="f32", progress=False)
    fields = GGUFReader(path).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    types = fields["tokenizer.ggml.token_type"].contents()
    assert types[3] == 6 and types[0] == 2 and types[1] == 3  # <0x00> BYTE, <unk> UNKNOWN, <s> CONTROL
    read = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert read(TEXT)["input_ids"] == open_checkpoint(src).tokenizer(TEXT)["input_ids"]


def test_a_gguf_source_exports_both_ways(sources, tmp_path):
    """A GGUF input: its tokenizer fields copied as they are, its logits kept."""
    src = sources["qwen2-plain"]
    source_gguf = write_tiny_gguf(src, open_checkpoint(src).arch, tmp_path / "source.gguf")
    folder = export(source_gguf, tmp_path / "plain", to="llama", progress=False)
    assert (logits_of(folder) - logits_of(src)).abs().max() <= 1e-5
    again = export(source_gguf, tmp_path / "again.gguf", to="gguf", type="f32", progress=False)
    written, original = GGUFReader(again).fields, GGUFReader(source_gguf).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id"):
        assert written[key].contents() == original[key].contents(), key
    assert (logits_of(again) - logits_of(src)).abs().max() <= 1e-5


DIGITS = "x\u00b2+y\u00b2=z\u00b2, \u00bd of \u00be; in 2024, 1,999 and 12345 steps of 3.14159"


def test_a_smollm_gguf_keeps_its_digit_split_through_convert_and_export(tiny_llama, tmp_path):
    """A GGUF whose tokenizer.ggml.pre is smollm splits every number character on its own before GPT-2's regex
    (llama.cpp); transformers' reader keeps only the byte-level part. The source as read, a conversion, a plain
    export (read by plain transformers too) and a GGUF export of that encode text with digits as that split does,
    and the GGUF export names smollm again. A vocabulary with merges across digits, or the split would not show."""
    from tokenizers import pre_tokenizers

    from mixln_convert.conversion.converter import convert

    numbers = [f"In {1990 + i} we counted {i * 37} of {i * 1234}, x\u00b2 \u00bd \u00be." for i in range(40)]
    vocabulary = tiny_tokenizer(TRAINING_TEXT + numbers)
    smollm = tiny_tokenizer(TRAINING_TEXT + numbers)
    smollm.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    expected = smollm(DIGITS)["input_ids"]
    assert vocabulary(DIGITS)["input_ids"] != expected  # the split changes this text's ids
    arch = open_checkpoint(tiny_llama).arch
    gpt2 = write_tiny_gguf(tiny_llama, arch, tmp_path / "gpt2.gguf", pre="gpt-2", tokenizer=vocabulary)
    assert open_checkpoint(gpt2).tokenizer(DIGITS)["input_ids"] == vocabulary(DIGITS)["input_ids"]  # gpt-2: no split
    source = write_tiny_gguf(tiny_llama, arch, tmp_path / "smollm.gguf", pre="smollm", tokenizer=vocabulary)
    assert open_checkpoint(source).tokenizer(DIGITS)["input_ids"] == expected
    plain = export(source, tmp_path / "plain", to="llama", progress=False)
    converted = convert(source, tmp_path / "mixln", alpha=0.25, progress=False)
    with pytest.warns(MixLNWarning, match="transformers' own GGUF reader .* drops that split"):
        again = export(plain, tmp_path / "again.gguf", to="gguf", type="f32", progress=False)
    for out in (plain, converted, again):
        assert open_checkpoint(out).tokenizer(DIGITS)["input_ids"] == expected, out
    assert AutoTokenizer.from_pretrained(plain)(DIGITS)["input_ids"] == expected
    assert GGUFReader(again).fields["tokenizer.ggml.pre"].contents() == "smollm"


def without_tokenizer(path: Path, bare: Path) -> Path:
    """The float32 GGUF ``path`` rewritten without its ``tokenizer.*`` metadata."""
    from gguf import GGUFValueType, GGUFWriter

    reader = GGUFReader(path)
    writer = GGUFWriter(bare, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if not key.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            array = field.types[0] == GGUFValueType.ARRAY
            writer.add_key_value(key, field.contents(), field.types[0], field.types[-1] if array else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return bare


@pytest.mark.parametrize("to", ["llama", "gguf"])
def test_a_gguf_without_a_tokenizer_is_refused_before_any_work(to, sources, tmp_path, cli):
    full = export(sources["qwen2-plain"], tmp_path / "full.gguf", to="gguf", type="f32", progress=False)
    bare = without_tokenizer(full, tmp_path / "bare.gguf")
    out = tmp_path / ("out.gguf" if to == "gguf" else "out")
    result = cli("export", bare, out, "--to", to)
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{bare}: cannot load its tokenizer" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.gguf", "full.gguf"]


@pytest.mark.parametrize("to", ["llama", "gguf"])
def test_a_mixln_checkpoint_with_post_ln_blocks_is_refused_in_one_line(to, converted, tmp_path, cli):
    before = hashes(converted)
    out = tmp_path / ("out.gguf" if to == "gguf" else "out")
    result = cli("export", converted, out, "--to", to)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert f"{converted / 'config.json'}: post_ln_layers 2" in lines[0] and "Norm(x + F(x))" in lines[0]
    assert list(tmp_path.iterdir()) == [] and hashes(converted) == before


@pytest.mark.parametrize("to, name", [("llama", "out"), ("gguf", "out.gguf")])
def test_an_existing_out_is_replaced_only_with_force(to, name, sources, tmp_path, cli):
    src, out = sources["llama-preln"], tmp_path / name
    before = hashes(src)
    if to == "gguf":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    result = cli("export", src, out, "--to", to)
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"OUT {out}: exists" in result.stderr and "--force" in result.stderr
    assert (out.read_text() if to == "gguf" else (out / "notes.txt").read_text()) == "mine"
    result = cli("export", src, out, "--to", to, "--force")
    assert result.exit_code == 0, result.output
    assert (out.is_file() and out.read_bytes()[:4] == b"GGUF") if to == "gguf" else (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary file or lock left beside it
    assert hashes(src) == before


def test_the_gguf_file_honours_the_umask(sources, tmp_path):
    old = os.umask(0o027)
    try:
        path = export(sources["llama-preln"], tmp_path / "m.gguf", to="gguf", progress=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.parametrize("args, message", [
    (["--to", "llama", "--type", "f16"], "--type f16: only --to gguf takes a tensor type"),
    (["--to", "gguf"], "--to gguf writes one file; name it NAME.gguf"),
    (["--to", "gguf", "--type", "q4_0"], "'--type': 'q4_0' is not one of"),
    (["--to", "safetensors"], "'--to': 'safetensors' is not one of"),
    ([], "Missing option '--to'"),
])
def test_bad_options_are_one_line(args, message, tiny_llama, tmp_path, cli):
    result = cli("export", tiny_llama, tmp_path / "out", *args)
    assert result.exit_code in (1, 2), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("to", ["llama", "gguf"])
def test_out_inside_the_input_is_refused(to, tiny_llama, cli):
    before = hashes(tiny_llama)
    out = tiny_llama / ("sub.gguf" if to == "gguf" else "sub")
    result = cli("export", tiny_llama, out, "--to", to, "--force")
    assert result.exit_code == 1 and "lies inside the input CKPT" in result.stderr, result.stderr
    assert hashes(tiny_llama) == before and not out.exists()


def test_gguf_refuses_rope_scaling_before_writing(tiny_llama, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for file in tiny_llama.iterdir():
        (src / file.name).write_bytes(file.read_bytes())
    config = json.loads((src / "config.json").read_text())
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (src / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    with pytest.raises(MixLNError, match="rope_type 'linear': transformers' GGUF reader reads no rope scaling"):
        export(src, tmp_path / "m.gguf", to="gguf", progress=False)
    assert not (tmp_path / "m.gguf").exists()
