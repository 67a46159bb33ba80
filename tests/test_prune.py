"""Pruning: explicit blocks, the angular/drop/last rules, Mix-LN layouts, bad input."""

import json
import math

import pytest
import torch
from safetensors import safe_open

from mixln_convert.analysis.layers import BlockRunner
from mixln_convert.data import read_texts, token_windows
from mixln_convert.surgery.loading import load_model, load_tokenizer
from mixln_convert.surgery.prune import prune

L = 8
FAST = dict(seq_len=32, max_tokens=256, progress=False)


def token_ids():
    return torch.randint(3, 320, (3, 32), generator=torch.Generator().manual_seed(0))


def config_of(folder):
    return json.loads((folder / "config.json").read_text())


def tensor_names(folder):
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return set(f.keys())


def assert_pruned_equals_skipping(src, dst, removed):
    ids = token_ids()
    with torch.no_grad():
        expected = BlockRunner(load_model(src)).forward(ids, skip=set(removed))
        assert torch.equal(load_model(dst)(input_ids=ids).logits, expected)


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_llama_tied"])
def test_prune_layers_equals_skipping_them(which, request, tmp_path, cli):
    src = request.getfixturevalue(which)
    result = cli("prune", src, tmp_path / "out", "--layers", "2-3,6")
    assert result.exit_code == 0, result.output
    assert "[2, 3, 6]" in result.output
    out = tmp_path / "out"
    assert_pruned_equals_skipping(src, out, [2, 3, 6])

    config = config_of(out)
    assert config["num_hidden_layers"] == L - 3 and config["model_type"] == "llama"
    assert config["pruned"][-1]["removed_layers"] == [2, 3, 6] and config["pruned"][-1]["method"] == "explicit"
    names = tensor_names(out)
    assert max(int(n.split(".")[2]) for n in names if n.startswith("model.layers.")) == L - 4
    tied = config["tie_word_embeddings"]
    assert ("lm_head.weight" in names) != tied  # a tied head stays the embeddings, not a copy
    model = load_model(out)
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    assert (out / "tokenizer.json").is_file()


def test_pruned_mixln_keeps_layout_and_provenance(converted, tmp_path):
    from transformers import AutoModelForCausalLM

    out = prune(converted, tmp_path / "out", layers="1,5", progress=False)
    config = config_of(out)
    assert config["model_type"] == "mixln_llama" and config["num_hidden_layers"] == L - 2
    assert config["post_ln_layers"] == 1  # Post-LN blocks 0 and 1; 1 removed
    provenance = config["mixln_provenance"]
    assert provenance["strategy"] == config_of(converted)["mixln_provenance"]["strategy"]  # kept
    assert provenance["pruned"][-1]["removed_layers"] == [1, 5]
    assert provenance["pruned"][-1]["post_ln_layers_before"] == 2
    assert {p.name for p in out.glob("*.py")} == {p.name for p in converted.glob("*.py")} != set()

    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "MixLNForCausalLM"
    assert [layer.is_post_ln for layer in model.model.layers] == [True] + [False] * (L - 3)
    assert_pruned_equals_skipping(converted, out, [1, 5])


def test_mixln_without_post_ln_layers_stays_mixln(converted, tmp_path):
    out = prune(converted, tmp_path / "out", layers="0-1", progress=False)
    config = config_of(out)
    assert config["model_type"] == "mixln_llama" and config["post_ln_layers"] == 0
    model = load_model(out)
    assert type(model).__name__ == "MixLNForCausalLM"
    assert not any(layer.is_post_ln for layer in model.model.layers)
    assert_pruned_equals_skipping(converted, out, [0, 1])

    again = prune(out, tmp_path / "again", layers="5", progress=False)  # a second pruning appends a record
    assert [r["removed_layers"] for r in config_of(again)["mixln_provenance"]["pruned"]] == [[0, 1], [5]]


def brute_force_angular_choice(src, n):
    """Angular distance of every n-block span from HF's own hidden states, token by token."""
    model = load_model(src)
    model.model.norm = torch.nn.Identity()  # HF's last hidden state is after the final norm; we want before
    windows = token_windows(load_tokenizer(src), read_texts(None, "calibration"), FAST["seq_len"], FAST["max_tokens"])
    with torch.no_grad():
        states = model(input_ids=windows, output_hidden_states=True).hidden_states
    distances = []
    for start in range(L - n + 1):
        a, b = states[start].flatten(0, 1).double(), states[start + n].flatten(0, 1).double()
        angles = [math.acos(max(-1.0, min(1.0, (x @ y / (x.norm() * y.norm())).item()))) / math.pi
                  for x, y in zip(a, b)]
        distances.append(sum(angles) / len(angles))
    return min(range(len(distances)), key=distances.__getitem__), distances


def test_angular_method_picks_the_brute_force_block(tiny_llama, tmp_path):
    out = prune(tiny_llama, tmp_path / "out", remove=3, method="angular", **FAST)
    record = config_of(out)["pruned"][-1]
    start, distances = brute_force_angular_choice(tiny_llama, 3)
    assert record["removed_layers"] == [start, start + 1, start + 2]
    assert record["angular_distance_by_start"] == pytest.approx(distances, abs=1e-6)
    assert record["method"] == "angular" and record["tokens"] == 256
    assert_pruned_equals_skipping(tiny_llama, out, record["removed_layers"])


def test_drop_and_last_methods(tiny_llama, tmp_path):
    record = config_of(prune(tiny_llama, tmp_path / "drop", remove=2, method="drop", **FAST))["pruned"][-1]
    drop = record["layer_drop"]
    assert len(drop) == L and record["removed_layers"] == sorted(sorted(range(L), key=drop.__getitem__)[:2])
    record = config_of(prune(tiny_llama, tmp_path / "last", remove=2, method="last", **FAST))["pruned"][-1]
    assert record["removed_layers"] == [L - 2, L - 1] and record["method"] == "last"


@pytest.mark.parametrize("args, message", [
    (["--layers", "8"], "--layers: layer 8 is outside [0, 7]"),
    (["--layers", "2-9"], "--layers: layer 9 is outside"),
    (["--layers", ","], "selects no layer"),
    (["--layers", "5-3"], "range '5-3' is empty"),
    (["--layers", "two"], "'two' is not a layer index"),
    (["--layers", "0-7"], "removes all 8 layers"),
    (["--remove", "8"], "--remove: 8 layers is outside [1, 7]"),
    (["--remove", "0"], "'--remove': 0 is not in the range 1<=x<=10000000000000"),
    (["--layers", "1", "--remove", "2"], "give exactly one"),
    ([], "give exactly one"),
    (["--remove", "1", "--method", "random"], "'--method': 'random' is not one of"),
])
def test_prune_bad_input_is_one_line(args, message, tiny_llama, tmp_path, cli):
    result = cli("prune", tiny_llama, tmp_path / "out", *args)
    assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_prune_refuses_a_corrupt_gguf_naming_it(tmp_path, cli):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    result = cli("prune", tmp_path / "model.gguf", tmp_path / "out", "--layers", "1")
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert f"{tmp_path / 'model.gguf'}: not a readable GGUF file" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--span", "0"], "'--span': 0 is not in the range 1<=x<=10000000000000"),
    (["--span", "9"], "--span: 9 exceeds the 8 layers"),
    (["--method", "random"], "'--method': 'random' is not one of"),
])
def test_analyze_bad_input_is_one_line(args, message, tiny_llama, tmp_path, cli):
    result = cli("analyze", tiny_llama, "--out", tmp_path / "out", "--max-tokens", 64, *args)
    assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]  # after transformers' bar
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
