"""Layer analysis: the block-by-block runner, layer drop, angular distance, the analyze command."""

import copy
import json
import math

import pytest
import torch

from mixln_convert.analysis.layers import BlockRunner, RepresentationStatistics, removal_sweep
from mixln_convert.evaluation.perplexity import evaluate_perplexity
from mixln_convert.surgery.loading import load_model

L = 8  # layers of the tiny models
CONTRACT_KEYS = {"checkpoint", "num_layers", "post_ln_layers", "layout", "tokens", "perplexity", "layer_drop",
                 "angular_distance", "angular_distance_matrix", "span", "block_influence", "grad_norm_per_layer",
                 "tokenizer_vocab_size"}
PLOTS = {"layer_drop.png", "representation_change.png", "angular_distance_matrix.png", "grad_norm_per_layer.png"}


def token_ids(n=4, seq_len=32, seed=0):
    return torch.randint(3, 320, (n, seq_len), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_llama_tied", "converted", "converted_lns"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # eager gets an explicit mask from create_causal_mask
def test_block_runner_reproduces_model_logits(which, attention, request):
    model = load_model(request.getfixturevalue(which))
    model.set_attn_implementation(attention)
    ids = token_ids()
    with torch.no_grad():
        assert torch.equal(BlockRunner(model).forward(ids), model(input_ids=ids).logits)


@pytest.mark.parametrize("which", ["tiny_llama", "converted"])  # converted: block 0 and 1 are Post-LN
def test_layer_drop_equals_model_without_that_layer(which, request):
    model = load_model(request.getfixturevalue(which))
    windows = token_ids(n=6)
    sweep = removal_sweep(BlockRunner(model), windows, [[0], [1], [5], [L - 1]], batch_size=4, progress=False)
    assert sweep.perplexity == pytest.approx(evaluate_perplexity(model, windows, progress=False).perplexity,
                                                rel=1e-6)
    for layer, ppl in zip([0, 1, 5, L - 1], sweep.removed):
        shallower = copy.deepcopy(model)
        del shallower.model.layers[layer]
        assert ppl == pytest.approx(evaluate_perplexity(shallower, windows, progress=False).perplexity, rel=1e-6)
    assert len(set(sweep.removed)) == 4  # each removal really differs


def test_angular_distance_of_identical_and_opposite_representations():
    x = torch.randn(2, 5, 16)
    statistics = RepresentationStatistics(num_layers=3)
    statistics.add([x, x, -x, 2 * x])  # block 0 is the identity, block 1 flips, block 2 flips back and scales
    matrix = statistics.angular_distance_matrix()
    assert [len(row) for row in matrix] == [3, 2, 1]
    assert matrix == [[pytest.approx(0, abs=1e-7), pytest.approx(1), pytest.approx(0, abs=1e-7)],
                      [pytest.approx(1), pytest.approx(0, abs=1e-7)],
                      [pytest.approx(1)]]
    assert statistics.block_influence() == [pytest.approx(0, abs=1e-7), pytest.approx(2), pytest.approx(2)]


def test_angular_distance_is_a_token_average():
    a, b = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]), torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    statistics = RepresentationStatistics(num_layers=1)
    statistics.add([a, b])  # one token turns by 90 degrees (distance 0.5), the other not at all
    assert statistics.angular_distance_matrix() == [[pytest.approx(0.25)]]


def test_cli_analyze_writes_contract_and_plots(converted, tmp_path, cli):
    out = tmp_path / "analysis"
    result = cli("analyze", converted, "--out", out, "--seq-len", 32, "--max-tokens", 256, "--span", 2,
                 "--prune-curve", "--method", "drop")
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    assert CONTRACT_KEYS | {"prune_curve"} <= set(analysis)
    assert {p.name for p in out.iterdir()} == PLOTS | {"prune_curve.png", "analysis.json"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in out.glob("*.png"))

    assert analysis["num_layers"] == L and analysis["post_ln_layers"] == 2 and analysis["span"] == 2
    assert analysis["layout"] == ["Post-LN"] * 2 + ["Pre-LN"] * (L - 2)
    assert analysis["tokens"] == 8 * 31
    for key in ("layer_drop", "block_influence", "grad_norm_per_layer", "angular_distance"):
        assert len(analysis[key]) == L
    assert all(g > 0 for g in analysis["grad_norm_per_layer"])
    matrix = analysis["angular_distance_matrix"]
    assert [len(row) for row in matrix] == list(range(L, 0, -1))
    assert analysis["angular_distance"] == [row[1] for row in matrix[:-1]] + [None]
    assert all(0 < d < 1 for row in matrix for d in row)

    curve = analysis["prune_curve"]
    assert curve["method"] == "drop" and curve["removed"] == [1, 2, 3, 4]
    assert [len(layers) for layers in curve["layers"]] == [1, 2, 3, 4]
    cheapest = min(range(L), key=analysis["layer_drop"].__getitem__)
    assert curve["layers"][0] == [cheapest]
    assert curve["perplexity"][0] == pytest.approx(analysis["perplexity"] + analysis["layer_drop"][cheapest])
    assert all(math.isfinite(p) for p in curve["perplexity"])


def test_an_analysis_reads_back_as_analyze_returned_it(converted, tmp_path):
    """analyze() returns an Analysis; its analysis.json, read back, is that Analysis (every field that was
    measured, nothing not measured: no prune curve key without --prune-curve)."""
    from mixln_convert.analysis.analyze import analyze
    from mixln_convert.analysis.result import Analysis

    result = analyze(converted, tmp_path / "a", seq_len=32, max_tokens=128, generate=False, progress=False)
    assert Analysis.read(tmp_path / "a" / "analysis.json") == result and result.layered
    written = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert "prune_curve" not in written and written == result.to_dict()


def test_analyze_without_the_layer_sweep_scores_the_same_perplexity(converted, tmp_path, cli):
    common = ("--seq-len", 32, "--max-tokens", 256)
    full, light = tmp_path / "full", tmp_path / "light"
    assert cli("analyze", converted, "--out", full, *common).exit_code == 0
    result = cli("analyze", converted, "--out", light, "--no-layer-sweep", *common)
    assert result.exit_code == 0, result.output
    assert "cheapest block" not in result.output
    swept, measured = (json.loads((folder / "analysis.json").read_text()) for folder in (full, light))
    assert not {"layer_drop", "angular_distance_matrix", "grad_norm_per_layer"} & set(measured)
    assert measured["perplexity"] == pytest.approx(swept["perplexity"], rel=1e-5)
    assert measured["tokens"] == swept["tokens"] == 8 * 31
    assert measured["per_window"]["loss"] == pytest.approx(swept["per_window"]["loss"], rel=1e-5)
    assert {p.name for p in light.iterdir()} == {"analysis.json"}  # no per-layer figures without the sweep


@pytest.mark.parametrize("flag", [("--prune-curve",), ("--task", "arc_easy")])
def test_no_layer_sweep_refuses_what_needs_it(flag, converted, tmp_path, cli):
    if flag[0] == "--task":
        pytest.importorskip("lm_eval")
    result = cli("analyze", converted, "--out", tmp_path / "a", "--no-layer-sweep", *flag)
    assert result.exit_code != 0 and "--no-layer-sweep" in result.output and flag[0] in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "a").exists()


@pytest.mark.real_model
def test_analyze_real_gguf(tmp_path):
    from mixln_convert.analysis.analyze import analyze
    from mixln_convert.fetch import smollm2_gguf

    analysis = analyze(smollm2_gguf(), tmp_path / "a", seq_len=32, max_tokens=64, progress=False)
    assert analysis.num_layers == 30 and analysis.post_ln_layers == 0
    assert analysis.tokenizer_vocab_size == 49152
    assert 1 < analysis.perplexity < 200
    # the paper's observation for Pre-LN: the first block matters far more than the deep ones
    assert analysis.layer_drop[0] > max(analysis.layer_drop[15:])
