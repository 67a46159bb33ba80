"""convert(): tensor layout, strategies, initialization, loading, sharding, dtypes, safety, bad inputs."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import TINY_CONFIG, make_tiny_llama, run_without_package

from mixln_convert.data import read_texts, token_windows
from mixln_convert.evaluation.perplexity import evaluate_perplexity
from mixln_convert.model.modeling_mixln import MixLNForCausalLM
from mixln_convert.surgery.loading import load_model, load_tokenizer

L = TINY_CONFIG["num_hidden_layers"]
N_POST = 2  # floor(0.25 * 8)
INIT_STD = 0.02  # LlamaConfig's default initializer_range
LINEARS = {f"self_attn.{p}_proj.weight" for p in "qkvo"} | {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
POST_LN_NAMES = LINEARS | {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}
PRE_LN_NAMES = LINEARS | {"input_layernorm.weight", "post_attention_layernorm.weight"}
IDS = torch.randint(3, TINY_CONFIG["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(0))


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint folder, whatever its sharding."""
    return {k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(f).items()}


def layer_names(names, i: int) -> set[str]:
    prefix = f"model.layers.{i}."
    return {n.removeprefix(prefix) for n in names if n.startswith(prefix)}


@torch.no_grad()
def logits(folder: Path) -> torch.Tensor:
    return load_model(folder)(input_ids=IDS).logits


def folder_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- what the converted checkpoint holds ----------------------------------------------------


@pytest.mark.parametrize("strategy", ["calibrated", "move"])
def test_alpha_zero_reproduces_the_source_exactly(tiny_llama, tiny_convert, strategy):
    out = tiny_convert(tiny_llama, alpha=0.0, strategy=strategy)
    model = load_model(out)
    assert type(model) is MixLNForCausalLM and model.config.post_ln_layers == 0
    converted, source = logits(out), logits(tiny_llama)
    assert converted.dtype == source.dtype == torch.float32
    assert torch.equal(converted, source)


def test_mistral_source_converts_like_llama(tiny_convert, tmp_path):
    """A Mistral checkpoint without sliding-window attention is LLaMA's blocks under another name
    (architectures/mistral.json): alpha 0 reproduces it exactly, alpha 0.25 gives a usable model."""
    source = make_tiny_llama(tmp_path / "mistral", family="mistral", sliding_window=None)
    assert json.loads((source / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    assert torch.equal(logits(tiny_convert(source, "alpha0", alpha=0.0, strategy="move")), logits(source))
    converted = load_model(tiny_convert(source, "calibrated", alpha=0.25))
    assert type(converted) is MixLNForCausalLM and converted.config.post_ln_layers == N_POST
    assert torch.isfinite(logits(tmp_path / "calibrated")).all()


@pytest.mark.parametrize("strategy", ["calibrated", "move", "reinit-post", "scratch"])
def test_tensor_names_follow_mixln_layout(tiny_llama, tiny_convert, strategy):
    out = tiny_convert(tiny_llama, alpha=0.25, strategy=strategy)
    source, names = tensors(tiny_llama).keys(), tensors(out).keys()
    for i in range(L):
        assert layer_names(names, i) == (POST_LN_NAMES if i < N_POST else PRE_LN_NAMES), f"layer {i}"
        assert layer_names(source, i) == PRE_LN_NAMES
    outside = {n for n in names if not n.startswith("model.layers.")}
    assert outside == {n for n in source if not n.startswith("model.layers.")}
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mixln_llama" and config["architectures"] == ["MixLNForCausalLM"]
    assert (config["post_ln_layers"], config["alpha"]) == (N_POST, 0.25)
    assert config["mixln_provenance"]["strategy"] == strategy
    assert (out / "modeling_mixln.py").is_file() and (out / "configuration_mixln.py").is_file()
    assert (out / "tokenizer.json").is_file()


def test_move_keeps_weights_and_post_attention_gains(tiny_llama, tiny_convert):
    source, out = tensors(tiny_llama), tensors(tiny_convert(tiny_llama, alpha=0.25, strategy="move"))
    for name, tensor in out.items():
        if name.endswith("post_feedforward_layernorm.weight"):
            assert torch.equal(tensor, torch.ones(TINY_CONFIG["hidden_size"])), name
        else:  # everything else, the moved post_attention gains included, is the source's, bit for bit
            assert torch.equal(tensor, source[name]), name
    assert not torch.equal(source["model.layers.0.post_attention_layernorm.weight"], torch.ones(64))  # gains != 1
    assert set(source) - set(out) == {f"model.layers.{i}.input_layernorm.weight" for i in range(N_POST)}


def test_calibrated_is_closer_to_the_source_than_move(tiny_llama, tiny_convert, converted):
    windows = token_windows(load_tokenizer(tiny_llama), read_texts(None, "validation"), seq_len=64, max_tokens=1024)
    loss = lambda folder: evaluate_perplexity(load_model(folder), windows, progress=False).loss  # noqa: E731
    source, calibrated = loss(tiny_llama), loss(converted)
    moved = loss(tiny_convert(tiny_llama, alpha=0.25, strategy="move"))
    assert abs(calibrated - source) < abs(moved - source)

    calibration = json.loads((converted / "config.json").read_text())["mixln_provenance"]["calibration"]
    assert calibration["data"] == "embedded:calibration" and calibration["tokens"] == 1024
    per_layer = {key: value for key, value in calibration.items() if isinstance(value, list)}
    assert per_layer and all(len(value) == N_POST for value in per_layer.values()), per_layer
    out = tensors(converted)
    for i in range(N_POST):  # the Post-LN gains' means are recorded
        for norm in ("post_attention", "post_feedforward"):
            gain = out[f"model.layers.{i}.{norm}_layernorm.weight"]
            assert gain.mean().item() == pytest.approx(calibration[f"{norm}_gain"][i], rel=1e-5), (norm, i)


def assert_std(tensor: torch.Tensor, std: float, name: str) -> None:
    actual = tensor.float().std().item()
    assert abs(actual / std - 1) < 0.1, f"{name}: std {actual:.5f}, expected {std:.5f}"
    assert abs(tensor.float().mean().item()) < 0.1 * std, name


@pytest.mark.parametrize("strategy", ["reinit-post", "scratch"])
@pytest.mark.parametrize("scaled", [True, False])
def test_initialized_weights_have_the_paper_std(tiny_llama, tmp_path, cli, strategy, scaled):
    result = cli("convert", tiny_llama, tmp_path / "out", "--strategy", strategy,
                 "--scaled-init" if scaled else "--no-scaled-init")
    assert result.exit_code == 0, result.output
    source, out = tensors(tiny_llama), tensors(tmp_path / "out")
    scaled_std = INIT_STD / math.sqrt(2 * L)
    for name, tensor in out.items():
        i = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if strategy == "reinit-post" and (i is None or i >= N_POST):
            assert torch.equal(tensor, source[name]), f"{name} must be carried over unchanged"
        elif name.endswith("norm.weight"):
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert_std(tensor, scaled_std if scaled else INIT_STD, name)
        else:  # the other linears, and embeddings / LM head when initialized
            assert_std(tensor, INIT_STD, name)


# ---- loading -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["converted", "converted_lns"])
def test_round_trip_with_and_without_the_package(layout, request, tmp_path):
    from transformers import AutoModelForCausalLM

    converted = request.getfixturevalue(layout)
    reference = logits(converted)
    model = AutoModelForCausalLM.from_pretrained(converted).eval()  # registered by the package: no remote code
    assert type(model) is MixLNForCausalLM
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, reference)

    stdout, logits_of = run_without_package("logits", IDS, [converted], tmp_path)
    assert "refused:" in stdout, stdout  # never silently a plain LLaMA
    assert "MixLNForCausalLM transformers_modules." in stdout, stdout
    assert torch.equal(logits_of[str(converted)], reference)


def test_the_config_records_the_alpha_used(tiny_llama, tiny_convert, cli):
    """At the default alpha the config said "alpha": null, and inspect left it out."""
    config = lambda folder: json.loads((folder / "config.json").read_text())  # noqa: E731
    default = tiny_convert(tiny_llama, "default", strategy="move")
    assert config(default)["alpha"] == 0.25 and config(default)["post_ln_layers"] == 2
    assert "converted at alpha 0.25" in cli("inspect", default).output
    assert config(tiny_convert(tiny_llama, "given", strategy="move", alpha=0.5))["alpha"] == 0.5
    counted = config(tiny_convert(tiny_llama, "counted", strategy="move", post_ln_layers=3))
    assert counted["alpha"] is None and counted["post_ln_layers"] == 3  # a count given: no alpha behind it
    assert config(tiny_convert(tiny_llama, "lns", layout="lns"))["alpha"] is None


def test_sharded_output_loads_like_a_single_file(tiny_llama, tiny_convert):
    single = tiny_convert(tiny_llama, "single", strategy="move")
    sharded = tiny_convert(tiny_llama, "sharded", strategy="move", max_shard_size="300KB")
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3 and "model.safetensors" not in shards
    assert set(index["weight_map"].values()) == set(shards)
    assert index["weight_map"].keys() == tensors(single).keys()
    assert all((sharded / s).stat().st_size < 300_000 + 10_000 for s in shards)  # tensors + header
    assert torch.equal(logits(sharded), logits(single))


def test_tied_embeddings_stay_tied(tiny_llama_tied, tiny_convert):
    assert "lm_head.weight" not in tensors(tiny_llama_tied)
    out = tiny_convert(tiny_llama_tied, strategy="move")
    assert "lm_head.weight" not in tensors(out)
    model = load_model(out)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_tied_head_saved_anyway_converts_to_the_model_transformers_loads(tiny_llama_tied, tiny_convert, tmp_path):
    """A tied config over weights holding a head equal to the embeddings is unambiguous: it
    converts, and at alpha 0 the output computes what the source does. (A head that differs is
    refused: tests/test_bad_inputs.py, tied-config-separate-head.)"""
    source = tmp_path / "head-saved"
    shutil.copytree(tiny_llama_tied, source)
    state = load_file(source / "model.safetensors")
    save_file({**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}, source / "model.safetensors")
    out = tiny_convert(source, alpha=0.0, strategy="move")
    assert "lm_head.weight" not in tensors(out) and torch.equal(logits(out), logits(source))


def test_sharded_and_bin_sources_convert_like_safetensors(tiny_llama_sharded, tiny_llama_bin, tiny_convert, converted):
    from_bin = tensors(tiny_convert(tiny_llama_bin, "from-bin"))
    assert from_bin.keys() == tensors(converted).keys()
    for name, tensor in tensors(converted).items():
        assert torch.equal(from_bin[name], tensor), name
    from_shards = tiny_convert(tiny_llama_sharded, "from-shards")
    assert tensors(from_shards).keys() == from_bin.keys()
    assert torch.isfinite(logits(from_shards)).all()


# ---- dtypes --------------------------------------------------------------------------------


def test_dtype_is_the_sources_unless_asked(tiny_llama, tiny_convert, tmp_path, cli):
    assert {t.dtype for t in tensors(tiny_convert(tiny_llama, "fp32")).values()} == {torch.float32}

    result = cli("convert", tiny_llama, tmp_path / "bf16", "--dtype", "bfloat16", "--strategy", "move")
    assert result.exit_code == 0, result.output
    assert {t.dtype for t in tensors(tmp_path / "bf16").values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_model(tmp_path / "bf16").dtype == torch.bfloat16

    bf16_source = tmp_path / "bf16-source"  # with transformers 4's config key for its dtype
    shutil.copytree(tiny_llama, bf16_source)
    weights, config = bf16_source / "model.safetensors", bf16_source / "config.json"
    save_file({k: v.bfloat16() for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    legacy = json.loads(config.read_text())
    del legacy["dtype"]
    legacy["torch_dtype"] = "bfloat16"
    config.write_text(json.dumps(legacy))
    assert {t.dtype for t in tensors(tiny_convert(bf16_source, "kept")).values()} == {torch.bfloat16}
    as_fp32 = tiny_convert(bf16_source, "fp32-from-bf16", dtype="float32")
    assert {t.dtype for t in tensors(as_fp32).values()} == {torch.float32}
    written = json.loads((as_fp32 / "config.json").read_text())
    assert written["dtype"] == "float32" and "torch_dtype" not in written  # no contradicting legacy key
    assert load_model(as_fp32).dtype == torch.float32


# ---- safety: the source is read-only, the output atomic ------------------------------------


def test_source_is_never_modified(tiny_llama, tiny_convert):
    before = folder_hashes(tiny_llama)
    tiny_convert(tiny_llama, alpha=0.5)
    assert folder_hashes(tiny_llama) == before


def test_output_appears_only_when_complete(tiny_llama, tiny_convert, tmp_path, monkeypatch):
    from mixln_convert.io.writer import ShardedWriter

    dst = tmp_path / "out" / "dst"
    seen = []

    def fail_at_the_end(writer):
        seen.append((dst.exists(), sorted(p.name for p in dst.parent.iterdir())))
        raise RuntimeError("disk full")

    monkeypatch.setattr(ShardedWriter, "close", fail_at_the_end)
    with pytest.raises(RuntimeError, match="disk full"):
        tiny_convert(tiny_llama, "out/dst")
    (dst_existed, siblings), = seen
    # the temporary folder, and the lock that holds dst for this process while it writes
    assert not dst_existed and len(siblings) == 2 and siblings[0] == ".dst.lock" and siblings[1].startswith(".dst.tmp-")
    assert not dst.parent.exists()  # both gone, and the folder made to hold dst too


# ---- bad inputs, through the CLI -----------------------------------------------------------


def gpt2_checkpoint(tmp: Path, fixtures) -> tuple[list, str]:
    folder = tmp / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                    "n_layer": 2, "num_hidden_layers": 2}))
    save_file({"transformer.wte.weight": torch.zeros(8, 4)}, folder / "model.safetensors")
    return [folder], str(folder / "config.json")


def missing_shard(tmp: Path, fixtures) -> tuple[list, str]:
    folder = shutil.copytree(fixtures("tiny_llama_sharded"), tmp / "sharded")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    return [folder], str(shard)


def corrupt_header(tmp: Path, fixtures) -> tuple[list, str]:
    folder = shutil.copytree(fixtures("tiny_llama"), tmp / "corrupt")
    with open(folder / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 8)  # the header length: now absurd
    return [folder], str(folder / "model.safetensors")


def already_mixln(tmp: Path, fixtures) -> tuple[list, str]:
    return [fixtures("converted")], "already a Mix-LN"


def calibration_file(content: bytes, name: str):
    def case(tmp: Path, fixtures) -> tuple[list, str]:
        data = tmp / name
        data.write_bytes(content)
        return [fixtures("tiny_llama"), "--calibration-data", data], str(data)
    return case


def gguf_of_gpt2(tmp: Path, fixtures) -> tuple[list, str]:
    from gguf import GGUFWriter

    path = tmp / "gpt2.gguf"
    writer = GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [path], str(path)


def mistral_sliding_window(tmp: Path, fixtures) -> tuple[list, str]:
    return [make_tiny_llama(tmp / "mistral", family="mistral", sliding_window=16)], "sliding_window 16"


def flag(*args: str, named: str):
    return lambda tmp, fixtures: ([fixtures("tiny_llama"), *args], named)


BAD_INPUTS = {
    "non-llama": gpt2_checkpoint,
    "missing-shard": missing_shard,
    "corrupt-header": corrupt_header,
    "alpha-negative": flag("--alpha", "-0.1", named="--alpha"),
    "alpha-above-one": flag("--alpha", "1.5", named="--alpha"),
    "post-ln-layers-above-L": flag("--post-ln-layers", str(L + 1), named="--post-ln-layers"),
    "already-mixln": already_mixln,
    "unknown-strategy": flag("--strategy", "magic", named="--strategy"),
    "calibration-seq-len-zero": flag("--calibration-seq-len", "0", named="--calibration-seq-len"),
    "calibration-tokens-negative": flag("--calibration-tokens", "-5", named="--calibration-tokens"),
    "calibration-empty": calibration_file(b"", "empty.txt"),
    "calibration-not-utf8": calibration_file(b"\xff\xfe\x00bad", "binary.txt"),
    "calibration-bad-json": calibration_file(b'{"text": "ok"}\n{broken\n', "broken.jsonl"),
    "calibration-missing": lambda tmp, fixtures: ([fixtures("tiny_llama"), "--calibration-data", tmp / "nope.txt"],
                                                  str(tmp / "nope.txt")),
    "gguf-gpt2": gguf_of_gpt2,
    "mistral-sliding-window": mistral_sliding_window,
    "unknown-layout": flag("--layout", "postln", named="--layout"),
    "lns-with-alpha": flag("--layout", "lns", "--alpha", "0.25", named="--alpha: --layout lns makes no block Post-LN"),
    "lns-with-post-ln-layers": flag("--layout", "lns", "--post-ln-layers", "2", named="--post-ln-layers: --layout lns"),
    "lns-with-move": flag("--layout", "lns", "--strategy", "move", named="--strategy move: --layout lns"),
    "lns-with-heal": flag("--layout", "lns", "--heal-tokens", "1024", named="--heal-tokens: --layout lns"),
    "lns-with-calibration": flag("--layout", "lns", "--calibration-tokens", "64", named="--calibration-tokens"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gives_one_line_error_and_no_output(case, tmp_path, request, cli):
    args, named = BAD_INPUTS[case](tmp_path, request.getfixturevalue)
    out_parent = tmp_path / "out"
    result = cli("convert", args[0], out_parent / "dst", *args[1:])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), f"unhandled {result.exception!r}"  # no traceback
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert named in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert not out_parent.exists() or list(out_parent.iterdir()) == []


def test_nonempty_dst_is_refused_unless_forced(tiny_llama, tmp_path, cli):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    result = cli("convert", tiny_llama, dst, "--strategy", "move")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert len(result.stderr.strip().splitlines()) == 1 and str(dst) in result.stderr and "--force" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"] and [p.name for p in dst.iterdir()] == ["keep.txt"]

    result = cli("convert", tiny_llama, dst, "--strategy", "move", "--force")
    assert result.exit_code == 0, result.output
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # no .tmp- or .old- leftovers
