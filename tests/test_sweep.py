"""mixln-convert sweep: every alpha's conversion from one calibration pass, the report, the rule,
resume after a kill."""

import json
from types import SimpleNamespace

import pytest
import torch
from matplotlib.image import imread
from safetensors.torch import load_file

from mixln_convert.conversion.converter import convert
from mixln_convert.workflows.sweep import Rule, gradient_figures, recommend
from tiny import check_result_file

# 8 blocks: alphas 0, 0.25 and 0.3 (both 2 blocks: run once), 0.5
ALPHAS = "0,0.25,0.3,0.5"
BUDGET = ["--heal-tokens", 1024, "--train-tokens", 1024, "--eval-tokens", 512, "--lns"]


@pytest.fixture(scope="module")
def swept(tiny_llama, tmp_path_factory):
    from click.testing import CliRunner

    from mixln_convert.cli import main

    out = tmp_path_factory.mktemp("sweep") / "out"
    result = CliRunner().invoke(main, [str(a) for a in ["sweep", tiny_llama, "--out", out, "--alphas", ALPHAS, *BUDGET]])
    assert result.exit_code == 0, result.output
    return out, result.stdout


def test_sweep_writes_one_row_for_each_post_ln_block_count_and_a_report(swept):
    out, stdout = swept
    result = json.loads((out / "sweep.json").read_text())
    rows = result["rows"]
    assert [row["post_ln_layers"] for row in rows] == [0, 2, 4]
    assert rows[1]["alphas"] == [0.25, 0.3]
    for row in rows:
        for stage in ("converted", "healed"):
            assert row[stage]["perplexity"] > 1 and row[stage]["per_document_perplexity"] > 1
        assert row["trained"][0]["tokens"] == 1024
        assert len(row["analysis"]["layer_drop"]) == 8
        assert row["grad_norm_cv"] > 0
        assert (row["post_pre_grad_ratio"] is None) == (row["post_ln_layers"] == 0)
    assert rows[0]["converted"]["perplexity"] == pytest.approx(result["original"]["scores"]["perplexity"], rel=1e-6)
    assert rows[0]["trained"] == result["control"]  # alpha 0 is the original's weights: the control
    # --lns: the LNS retrofit trained like the control, from the original's function
    assert [run["tokens"] for run in result["lns"]] == [1024]
    assert result["lns"][0]["initial_val_ppl"] == pytest.approx(result["control"][0]["initial_val_ppl"], rel=1e-5)
    assert result["lns"][0]["final_val_ppl"] != result["control"][0]["final_val_ppl"]
    report = (out / "report" / "report.md").read_text()
    assert report.count("\n| 0") + report.count("\n| 0.25, 0.3") >= 2 and "| 0.5 | 4 / 8 |" in report
    assert "Rule: the largest alpha whose healed perplexity is at most 10% above" in report
    assert ("No alpha beats the Pre-LN control" in report) != ("beat the Pre-LN control" in report)
    assert "The LNS retrofit" in report and "too close to call" in report  # one seed: no spread to judge by
    for name in ("sweep_perplexity.png", "sweep_layer_drop.png", "sweep_gradients.png"):
        assert imread(out / "report" / name).ndim == 3
    assert "calibration_s" in result["times"] and "time: calibration" in stdout
    for row in rows[1:]:  # each Post-LN count's own split: converted, healed, trained, analyzed
        assert set(result["times"][f"post-ln-{row['post_ln_layers']}"]) == {"convert_s", "heal_s", "train_s",
                                                                           "analysis_s"}
    assert not list(out.glob(".*tmp-*"))


@pytest.mark.parametrize("path, value, error", [
    (["rows", 1, "converted", "perplexity"], "high", "rows[1].converted.perplexity: must be a number > 0, got 'high'"),
    (["control", 0, "seed"], -1, "control[0].seed: must be an integer in [0, 2^32), got -1"),
    (["rows", 2, "trained"], {}, "rows[2].trained: must be a list, each a training run, got {}"),
    (["recommendation"], [], "recommendation: not a recommendation (not a JSON object)"),
])
def test_sweep_json_reads_back_as_written_and_a_damaged_one_is_refused(swept, tmp_path, path, value, error):
    from mixln_convert.report.sweep import SweepResult

    check_result_file(SweepResult, swept[0] / "sweep.json", tmp_path, path, value, error)


def test_the_shared_calibration_gives_the_separate_conversion_bitwise(swept, tiny_llama, tmp_path):
    out, _ = swept
    for n in (2, 4):
        alone = convert(tiny_llama, tmp_path / f"alone-{n}", post_ln_layers=n, progress=False)
        shared = load_file(out / f"post-ln-{n:02d}" / "converted" / "model.safetensors")
        separate = load_file(alone / "model.safetensors")
        assert shared.keys() == separate.keys()
        assert all(torch.equal(shared[k], separate[k]) for k in shared)


def row(n, healed, grad_ratio):
    """What the rule reads of a sweep's row."""
    return SimpleNamespace(post_ln_layers=n, alphas=[n / 8], healed=SimpleNamespace(perplexity=healed),
                           post_pre_grad_ratio=grad_ratio)


def test_the_rule_picks_the_largest_passing_alpha():
    rows = [row(0, 10.0, None), row(1, 10.5, 1.5), row(2, 10.9, 2.0), row(4, 10.8, 4.0), row(6, 12.0, 1.0)]
    picked = recommend(rows, 10.0, Rule(max_ppl_increase=0.10, max_grad_ratio=3.0), "healed")
    assert picked.post_ln_layers == 2  # 4 fails the gradient test, 6 the perplexity test
    assert picked.failures["4"] == ["Post-LN gradient norm 4.00x the Pre-LN blocks'"]
    assert picked.failures["6"] == ["healed perplexity 1.200x the original's"]
    strict = recommend(rows[1:], 10.0, Rule(max_ppl_increase=0.01, max_grad_ratio=3.0), "healed")
    assert strict.post_ln_layers is None


def test_gradient_figures_on_hand_made_norms():
    steps = [[4.0, 1.0, 1.0, 2.0], [2.0, 1.0, 3.0, 1.0]]
    figures = gradient_figures(steps, post_ln_layers=1)
    assert figures["post_pre_grad_ratio"] == pytest.approx(max(4 / (4 / 3), 2 / (5 / 3)))
    assert figures["grad_steps"] == 2
    assert gradient_figures(steps, post_ln_layers=0)["post_pre_grad_ratio"] is None


def test_a_killed_sweep_resumes_where_it_stopped(tiny_llama, tmp_path, cli, monkeypatch):
    import mixln_convert.workflows.sweep as sweep_module

    out, budget = tmp_path / "out", ["--alphas", "0,0.25,0.5", "--eval-tokens", 512]
    real, calls = sweep_module._analysis, []

    def killed_at_the_second(*args, **kwargs):  # the original (alpha 0 reuses it), then alpha 0.25: killed
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "_analysis", killed_at_the_second)
    assert cli("sweep", tiny_llama, "--out", out, *budget).exit_code != 0
    finished = out / "post-ln-00" / "result.json"
    assert finished.is_file() and not (out / "post-ln-02").exists()
    assert not list(out.glob(".*tmp-*"))  # the interrupted alpha left no temporary folder
    stamp = finished.stat().st_mtime_ns

    monkeypatch.setattr(sweep_module, "_analysis", real)
    refused = cli("sweep", tiny_llama, "--out", out, *budget)
    assert refused.exit_code != 0 and "--resume" in refused.output  # a non-empty --out needs --resume or --force
    resumed = cli("sweep", tiny_llama, "--out", out, *budget, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert finished.stat().st_mtime_ns == stamp  # kept, not redone
    assert [r["post_ln_layers"] for r in json.loads((out / "sweep.json").read_text())["rows"]] == [0, 2, 4]

    # a finished stage's result edited (valid JSON, wrong content): refused naming it, nothing rerun
    finished.write_text(json.dumps({"sha256": "0" * 64, "result": {}}))
    edited = cli("sweep", tiny_llama, "--out", out, *budget, "--resume")
    errors = [line for line in edited.stderr.splitlines() if line.startswith("Error:")]
    assert edited.exit_code == 1 and len(errors) == 1, edited.output
    assert f"{finished}: damaged; remove {out / 'post-ln-00'}" in errors[0]
