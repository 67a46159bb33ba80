"""One evaluation definition: eval, analyze, training validation and heal score the same windows at
their defaults, so one model gets one perplexity; every result says what it was measured on."""

import json
import math
import re

import pytest
import torch

from mixln_convert.analysis.layers import grad_norm_per_layer
from mixln_convert.data import read_texts, token_windows
from mixln_convert.evaluation.options import EVAL_DATA, EVAL_TOKENS
from mixln_convert.options import SEQ_LEN
from mixln_convert.surgery.loading import load_model, load_tokenizer


@pytest.fixture(scope="module")
def default_figures(tiny_llama, converted, tmp_path_factory):
    """The original's perplexity from every command that measures one, each at its defaults."""
    from click.testing import CliRunner

    from mixln_convert.cli import main

    def cli(*args):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result

    work = tmp_path_factory.mktemp("figures")
    figures = {"eval": json.loads(cli("eval", tiny_llama, "--json").stdout.splitlines()[-1])}
    cli("analyze", tiny_llama, "--out", work / "analysis")
    figures["analyze"] = json.loads((work / "analysis" / "analysis.json").read_text())
    # one optimizer step of 4 default-length sequences on the embedded corpus, Pre-LN arm only
    cli("train", "smollm2-135m-cpu", "--arm", "preln", "--out", work / "run", f"--set=source={tiny_llama}",
        f"--set=max_tokens={4 * SEQ_LEN}", "--set=precision=fp32", "--set=heal.tokens=0")
    figures["train"] = json.loads((work / "run" / "preln" / "summary.json").read_text())
    cli("heal", converted, "--teacher", tiny_llama, "--tokens", 4 * SEQ_LEN, "--out", work / "healed")
    figures["heal"] = json.loads((work / "healed" / "config.json").read_text())["mixln_provenance"]["heal"]
    return figures


def test_every_command_gives_the_original_one_perplexity(default_figures):
    f = default_figures
    measured = [f["eval"]["perplexity"], f["analyze"]["perplexity"], f["train"]["initial_val_ppl"],
                f["heal"]["perplexity"]["teacher"]]
    assert measured == pytest.approx([measured[0]] * 4, rel=1e-5)
    assert 1 < measured[0] < 1e6


def test_every_result_says_what_it_was_measured_on(default_figures):
    f = default_figures
    scored = EVAL_TOKENS // SEQ_LEN * (SEQ_LEN - 1)  # every window's first token is not predicted
    described = [(f["eval"]["data"], f["eval"]["tokens"], f["eval"]["seq_len"]),
                 (f["analyze"]["data"], f["analyze"]["tokens"], f["analyze"]["seq_len"]),
                 tuple(f["train"]["validation"][k] for k in ("data", "tokens", "seq_len")),
                 tuple(f["heal"]["evaluation"][k] for k in ("data", "tokens", "seq_len"))]
    assert described == [(EVAL_DATA, scored, SEQ_LEN)] * 4


def test_per_window_values_reproduce_the_figures(default_figures):
    """The per-window values an interval is bootstrapped from give back the figures themselves."""
    analysis, train = default_figures["analyze"], default_figures["train"]
    per_window = analysis["per_window"]
    windows = EVAL_TOKENS // SEQ_LEN
    assert (len(per_window["loss"]) == len(per_window["loss_without_layer"]) == len(per_window["angular_distance"])
            == windows)
    loss = sum(per_window["loss"]) / windows
    assert math.exp(loss) == pytest.approx(analysis["perplexity"], rel=1e-9)
    for layer, drop in enumerate(analysis["layer_drop"]):
        without = sum(row[layer] for row in per_window["loss_without_layer"]) / windows
        assert math.exp(without) - analysis["perplexity"] == pytest.approx(drop, rel=1e-6, abs=1e-9)
    for layer, distance in enumerate(analysis["angular_distance"]):  # span 1
        assert sum(row[layer] for row in per_window["angular_distance"]) / windows == pytest.approx(distance, rel=1e-6)
    batches = per_window["grad_norm_per_layer"]
    assert len(batches) == windows // 4  # --batch-size 4
    for layer, norm in enumerate(analysis["grad_norm_per_layer"]):
        assert sum(row[layer] for row in batches) / len(batches) == pytest.approx(norm, rel=1e-9)
    assert train["initial_val_window_losses"] == pytest.approx(per_window["loss"], rel=1e-5)


def test_gradient_norms_are_those_of_each_batch_alone(tiny_llama):
    model, tokenizer = load_model(tiny_llama), load_tokenizer(tiny_llama)
    windows = token_windows(tokenizer, read_texts(None, split="validation"), 64, 8 * 64, source=EVAL_DATA)
    norms = grad_norm_per_layer(model, windows, batch_size=4)
    assert len(norms) == 2 and norms[0] != norms[1]
    assert all(p.grad is None for p in model.parameters())  # none left behind
    second = windows[4:8]
    model(input_ids=second, labels=second).loss.backward()
    reference = [torch.cat([p.grad.flatten() for p in layer.parameters()]).norm().item() for layer in model.model.layers]
    assert norms[1] == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("damage, message", [
    ({"metrics": {"acc": "0.5"}}, "tasks.arc.metrics.acc: must be a finite number, got '0.5'"),
    ({"stderr": {"acc": "n/a"}}, "tasks.arc.stderr.acc: must be a finite number, got 'n/a'"),
    ({"higher_is_better": {"acc": 1}}, "tasks.arc.higher_is_better.acc: must be true or false, got 1"),
    ({"metrics": [0.5]}, "tasks.arc.metrics: must be an object, each a finite number, got [0.5]"),
    ({}, None),
])
def test_a_task_result_reads_back_its_figures_by_name_and_a_damaged_one_is_refused(damage, message, tmp_path):
    from mixln_convert.errors import MixLNError
    from mixln_convert.evaluation.result import TaskScores

    task = {"metrics": {"acc": 0.5, "acc_norm": 0.25}, "stderr": {"acc": 0.01, "acc_norm": None},
            "higher_is_better": {"acc": True, "acc_norm": True}, "samples": 10, "output_type": "multiple_choice"}
    record = {"checkpoint": "model", "batch_size": 8, "tasks": {"arc": {**task, **damage}}, "limit": 10,
              "lm_eval_version": "0.4.13"}
    saved = tmp_path / "eval.json"
    saved.write_text(json.dumps(record))
    if message is None:
        assert TaskScores.read(saved).to_dict() == record
        return
    with pytest.raises(MixLNError, match="^" + re.escape(f"{saved}: {message}")):
        TaskScores.read(saved)
