"""The compare report, from synthesized analysis.json files and train output folders (no model)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

L = 8


def write_analysis(folder, *, perplexity=20.0, post_ln_layers=0, deep_drop=0.1, grad_norms=None, vocab=320,
                   prune=None):
    """An analysis.json of an L-block model whose deeper-half blocks each cost ``deep_drop`` perplexity."""
    analysis = {
        "checkpoint": str(folder.parent / f"ckpt-{folder.name}"),
        "num_layers": L,
        "post_ln_layers": post_ln_layers,
        "layout": ["Post-LN" if i < post_ln_layers else "Pre-LN" for i in range(L)],
        "data": "embedded:validation",
        "seq_len": 256,
        "tokens": 2048,
        "perplexity": perplexity,
        "layer_drop": [50.0 / (i + 1) if i < L // 2 else deep_drop for i in range(L)],
        "angular_distance": [0.3 - 0.02 * i for i in range(L)],
        "angular_distance_matrix": [[0.3 - 0.02 * l + 0.05 * n for n in range(L - l)] for l in range(L)],
        "span": 1,
        "block_influence": [0.1] * L,
        "grad_norm_per_layer": grad_norms or [3.0 / (i + 1) for i in range(L)],
        "tokenizer_vocab_size": vocab,
    }
    if prune:
        analysis["prune_curve"] = {"method": "angular", "removed": list(range(1, L // 2 + 1)),
                                   "perplexity": [perplexity * r for r in prune],
                                   "layers": [list(range(L - n, L)) for n in range(1, L // 2 + 1)]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "analysis.json").write_text(json.dumps(analysis))
    return folder


def write_arm(run, arm, *, initial, final, tokens=1_000_000, wall_time_s=750.0, summary=True):
    folder = run / arm
    folder.mkdir(parents=True)
    steps, per_step = 4, tokens // 4
    records = [{"step": s, "tokens": s * per_step, "loss": 4.0 - 0.2 * s, "lr": 1e-3, "tokens_per_s": 1000.0}
               for s in range(1, steps + 1)]
    records[1].update(val_loss=3.4, val_ppl=30.0, grad_norm_per_layer=[2.0] * L)
    records[-1].update(val_loss=3.2, val_ppl=final, grad_norm_per_layer=[0.5 + 0.1 * i for i in range(L)])
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary:
        (folder / "summary.json").write_text(json.dumps({
            "arm": arm, "source": "src", "steps": steps, "tokens": tokens, "wall_time_s": wall_time_s,
            "final_val_loss": 3.2, "final_val_ppl": final, "initial_val_loss": 3.6, "initial_val_ppl": initial,
            "num_layers": L, "post_ln_layers": 2 if arm == "mixln" else 0}))
    return folder


def write_run(path, *, mixln_final=22.8, preln_final=24.0):
    """A train output folder: Pre-LN starts at 25.0 (the original), Mix-LN at 31.2 (converted)."""
    path.mkdir(parents=True)
    (path / "recipe.yaml").write_text("source: src\n")
    write_arm(path, "mixln", initial=31.2, final=mixln_final)
    write_arm(path, "preln", initial=25.0, final=preln_final, wall_time_s=9000.0)
    return path


def summary_of(report_md: str) -> str:
    """The summary's sentences (not the note on how they call differences)."""
    section = report_md.split("## Summary")[1].split("## Perplexity")[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("- "))


def assert_one_line_error(result, *fragments):
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_full_report(cli, tmp_path):
    run = write_run(tmp_path / "run")
    # Mix-LN's deep blocks matter more, its gradients are more uniform, and it loses more under pruning
    write_analysis(run / "mixln" / "analysis", perplexity=23.0, post_ln_layers=2, deep_drop=2.3,
                   grad_norms=[1.0, 1.1] * 4, prune=[1.1, 1.5, 2.0, 3.0])
    write_analysis(run / "preln" / "analysis", perplexity=24.0, deep_drop=0.24,
                   grad_norms=[4.0 / (i + 1) for i in range(L)], prune=[1.05, 1.1, 1.2, 1.4])
    original = write_analysis(tmp_path / "analysis-original", perplexity=25.5)
    out = tmp_path / "report"

    result = cli("compare", run, original, "--out", out)
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()

    rows = {tuple(c.strip() for c in line.strip("|").split("|")) for line in md.splitlines() if line.startswith("| ")}
    mixln = ("run/mixln", "Mix-LN (2 of 8 blocks Post-LN)")
    measured = "embedded:validation, 2,048 tokens scored in windows of 256"  # what each analysis records (no whole number of windows)
    # a summary written before heal_tokens was recorded: whether the start was healed is not known
    assert (*mixln, "before training (converted, healed if the run healed: not recorded)", "31.20", "—", "—", "—", "0",
            "—") in rows
    assert (*mixln, "after training", "22.80", "—", "23.00", measured, "1,000,000", "12.5 min") in rows
    assert ("run/preln", "Pre-LN", "before training (original)", "25.00", "—", "—", "—", "0", "—") in rows
    assert ("run/preln", "Pre-LN", "after training", "24.00", "—", "24.00", measured, "1,000,000", "2.5 h") in rows
    assert ("analysis-original", "Pre-LN", f"analysed: {tmp_path.name}/ckpt-analysis-original", "—", "—", "25.50",
            measured, "—", "—") in rows
    # pruning table at N = L/8, L/4, L/2 = 1, 2, 4
    assert ("run/mixln", "angular", "23.00", "25.30 (N=1, 1.10x)", "34.50 (N=2, 1.50x)", "69.00 (N=4, 3.00x)") in rows

    summary = summary_of(md)
    # inputs without per-window values have no interval: differences beyond the threshold are not called
    no_interval = "are too close to call (no per-window values to bootstrap an interval from)"
    assert ("Mix-LN (run/mixln) 22.80 vs Pre-LN (run/preln) 24.00 (-5.0%): too close to call (no per-window values "
            "to bootstrap an interval from)") in summary
    assert "from 25.00 (original) to 31.20 (1.25x)" in summary
    assert "+2.3 (+10.0%; median +2.3)" in summary and "+0.24 (+1.0%; median +0.24)" in summary
    assert "run/mixln, run/preln and analysis-original " + no_interval in summary  # layer drop 10% vs 1%
    assert "wins" not in summary and "most" not in summary.replace("the most of its quality", "")
    assert "1% of perplexity" in md  # the practical threshold is stated

    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert set(images) == {"training_curves.png", "layer_drop.png", "angular_distance.png",
                           "grad_norm_per_layer.png", "prune_curves.png"}
    for name in images:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(out / name).ndim == 3
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(images)
    saved = json.loads((out / "comparison.json").read_text())
    assert [m["label"] for m in saved["models"]] == ["run/mixln", "run/preln", "analysis-original"]


@pytest.mark.parametrize("mixln_final, preln_final, verdict", [
    (22.8, 24.0, "(-5.0%): too close to call (no per-window values to bootstrap an interval from)"),
    (25.0, 24.0, "(+4.2%): too close to call (no per-window values to bootstrap an interval from)"),
    (24.05, 24.0, "(+0.2%): the same within 1% of perplexity (no per-window values to bootstrap an interval from)"),
])
def test_summary_without_intervals_names_no_winner(mixln_final, preln_final, verdict, cli, tmp_path):
    run = write_run(tmp_path / "run", mixln_final=mixln_final, preln_final=preln_final)
    result = cli("compare", run, "--out", tmp_path / "report", "--label", "exp")
    assert result.exit_code == 0, result.output
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    assert f"Mix-LN (exp/mixln) {mixln_final:.2f} vs Pre-LN (exp/preln) {preln_final:.2f}" in summary
    assert verdict in summary
    assert "No analysis given" in summary
    assert {p.name for p in (tmp_path / "report").glob("*.png")} == {"training_curves.png", "grad_norm_per_layer.png"}



@pytest.mark.parametrize("heal_tokens, start", [
    (0, "Conversion took validation perplexity from 25.00 (original) to 31.20 (1.25x)"),
    (16384, "Conversion and a heal on 16,384 tokens took validation perplexity from 25.00 (original) to 31.20"),
])
def test_a_healed_arm_says_its_start_is_after_the_heal(heal_tokens, start, cli, tmp_path):
    run = write_run(tmp_path / "run")
    summary_file = run / "mixln" / "summary.json"
    summary_file.write_text(json.dumps({**json.loads(summary_file.read_text()), "heal_tokens": heal_tokens}))
    result = cli("compare", run, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    assert start in summary_of((tmp_path / "report" / "report.md").read_text())

def test_missing_data_is_said(cli, tmp_path):
    write_analysis(tmp_path / "a", perplexity=20.0, deep_drop=0.2)
    write_analysis(tmp_path / "b", perplexity=20.0, post_ln_layers=2, deep_drop=0.2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("source: src\n")
    write_arm(run, "mixln", initial=31.2, final=23.1, summary=False)  # still training

    result = cli("compare", tmp_path / "a" / "analysis.json", tmp_path / "b", run, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report" / "report.md").read_text()
    summary = summary_of(md)
    assert ("run/mixln, Mix-LN (unfinished: no summary.json yet): validation perplexity not recorded before "
            "training, 23.10 after 1,000,000 tokens.") in summary
    assert "No Pre-LN arm was trained" in summary
    # identical layer drop, no per-window values
    assert "a and b are the same within 1% of perplexity (no per-window values" in summary
    assert "No pruning curves given" in summary
    assert "| run/mixln | Mix-LN | training (unfinished) | 23.10 | — | — | — | 1,000,000 | — |" in md


def test_only_analyses(cli, tmp_path):
    a = write_analysis(tmp_path / "a")
    result = cli("compare", a, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    assert "No trained arms given" in summary and "(only one model to show)" in summary
    assert not (tmp_path / "report" / "training_curves.png").exists()


def without_layer_sweep(folder):
    """``folder``'s analysis as `analyze --no-layer-sweep` writes it: perplexity, no per-layer measures."""
    file = folder / "analysis.json"
    analysis = json.loads(file.read_text())
    for key in ("layer_drop", "angular_distance", "angular_distance_matrix", "block_influence", "grad_norm_per_layer",
                "span"):
        del analysis[key]
    file.write_text(json.dumps(analysis))
    return folder


def test_analyses_without_the_layer_sweep_show_perplexity_only(cli, tmp_path):
    swept = write_analysis(tmp_path / "swept", perplexity=20.0)
    light = without_layer_sweep(write_analysis(tmp_path / "light", perplexity=31.0))
    result = cli("compare", swept, light, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report" / "report.md").read_text()
    summary = summary_of(md)
    assert "Removing one block of the deeper half raises perplexity on average by: swept" in summary
    assert "light" not in summary.split("Removing one block")[1]  # ranked among the swept only
    assert f"| light | Pre-LN | analysed: {tmp_path.name}/ckpt-light | — | — | 31.00 |" in md
    models = {m["label"]: m for m in json.loads((tmp_path / "report" / "comparison.json").read_text())["models"]}
    assert "deep_layer_drop" in models["swept"] and "deep_layer_drop" not in models["light"]
    assert (tmp_path / "report" / "layer_drop.png").is_file()

    result = cli("compare", light, "--out", tmp_path / "alone")
    assert result.exit_code == 0, result.output
    assert "No analysis holds the layer sweep" in summary_of((tmp_path / "alone" / "report.md").read_text())
    assert not (tmp_path / "alone" / "layer_drop.png").exists()


def test_mismatched_tokenizers(cli, tmp_path):
    a = write_analysis(tmp_path / "a", vocab=320)
    b = write_analysis(tmp_path / "b", vocab=49152)
    assert_one_line_error(cli("compare", a, b, "--out", tmp_path / "r1"), "a 320, b 49152", "--allow-mismatch")
    assert not (tmp_path / "r1").exists()

    allowed = cli("compare", a, b, "--out", tmp_path / "r2", "--allow-mismatch")
    assert allowed.exit_code == 0 and "warning: the analyses used different tokenizers" in allowed.stderr
    assert "## Warnings" in (tmp_path / "r2" / "report.md").read_text()


@pytest.mark.parametrize("case, fragments", [
    ("no metrics", ["metrics.jsonl", "no training metrics"]),
    ("empty metrics", ["metrics.jsonl", "no training metrics"]),
    ("no arms", ["without an arm folder"]),
    ("neither", ["neither an analysis", "nor a train output folder"]),
    ("checkpoint", ["run `mixln-convert analyze"]),
    ("missing", ["no such file or folder"]),
    ("bad analysis", ["not layer_drop (a layer analysis has all of them)"]),
    ("unwritable out", ["is not a writable folder"]),
    ("labels", ["--label: 2 labels for 1 inputs"]),
])
def test_bad_input_one_line_error(case, fragments, cli, tmp_path):
    good = write_analysis(tmp_path / "good")
    path, out, extra = tmp_path / "input", tmp_path / "report", []
    path.mkdir()
    if case in ("no metrics", "empty metrics", "no arms"):
        (path / "recipe.yaml").write_text("source: src\n")
        if case != "no arms":
            (path / "mixln").mkdir()
        if case == "empty metrics":
            (path / "mixln" / "metrics.jsonl").write_text("\n")
    elif case == "checkpoint":
        (path / "config.json").write_text("{}")
    elif case == "missing":
        path = tmp_path / "nowhere"
    elif case == "bad analysis":
        analysis = json.loads((good / "analysis.json").read_text())
        del analysis["layer_drop"]
        (path / "analysis.json").write_text(json.dumps(analysis))
    elif case == "unwritable out":
        path, out = good, tmp_path / "a-file" / "report"
        out.parent.write_text("not a folder")
    elif case == "labels":
        path, extra = good, ["--label", "x", "--label", "y"]
    assert_one_line_error(cli("compare", path, "--out", out, *extra), *fragments)
    assert not (tmp_path / "report").exists()


# ---------------------------------------------------------------------------------------------
# intervals: figures with per-window values get a bootstrap interval, and differences inside it are
# called too close to call

WINDOWS = 32


def per_window_values(perplexity, deep_drop, *, seed, spread=0.3, angle=0.2, noise=0.01, batches=WINDOWS // 4,
                      grad_slope=0.0):
    """per_window of an analysis (see analysis.analyze.layer_metrics) around ``perplexity``, its deep
    blocks each costing ``deep_drop``; window losses vary by ``spread`` nats between windows, each
    window's loss without a block by ``noise`` more; ``batches`` gradient batches, the norms falling
    by ``grad_slope`` per block."""
    rng = np.random.default_rng(seed)
    loss = np.log(perplexity) + spread * rng.standard_normal(WINDOWS)
    drops = [50.0 / (i + 1) if i < L // 2 else deep_drop for i in range(L)]
    without = loss[:, None] + np.log1p(np.array(drops) / perplexity)[None] + noise * rng.standard_normal((WINDOWS, L))
    return {"loss": loss.tolist(), "loss_without_layer": without.tolist(),
            "angular_distance": (angle + 0.02 * rng.standard_normal((WINDOWS, L))).tolist(),
            "grad_norm_per_layer": (1 - grad_slope * np.arange(L) + 0.1 * rng.random((batches, L))).tolist()}


def with_per_window(folder, per_window):
    """The analysis of ``folder`` with ``per_window`` values and the figures they give."""
    file = folder / "analysis.json"
    analysis = json.loads(file.read_text())
    loss, without = np.asarray(per_window["loss"]), np.asarray(per_window["loss_without_layer"])
    angles = np.asarray(per_window["angular_distance"]).mean(0)
    analysis.update(perplexity=float(np.exp(loss.mean())), per_window=per_window,
                    grad_norm_per_layer=np.mean(per_window["grad_norm_per_layer"], axis=0).tolist(),
                    layer_drop=(np.exp(without.mean(0)) - np.exp(loss.mean())).tolist(),
                    angular_distance_matrix=[[float(angles[l]), *row[1:]]
                                             for l, row in enumerate(analysis["angular_distance_matrix"])])
    file.write_text(json.dumps(analysis))
    return folder


@pytest.mark.parametrize("change, error", [
    ({"perplexity": "high"}, "models[1].perplexity: must be a number > 0, got 'high'"),
    ({"label": 3}, "models[1].label: must be a string, got 3"),
    ({"intervals": None}, "models[1]: not a model's numbers (missing intervals)"),
    ({"per_document": {"documents": 2, "tokens": 9, "token_perplexity": 0, "word_perplexity": 3.0,
                       "bits_per_byte": 1.0}}, "models[1].per_document.token_perplexity: must be a number > 0, got 0"),
    ({"tasks": {"arc": {"metric": "acc", "value": 0.5, "higher_is_better": "yes", "samples": 10,
                        "deep_layer_drop": 0.0}}}, "models[1].tasks.arc.higher_is_better: must be true or false, got 'yes'"),
    ({"evaluation": {"data": "d", "tokens": 3, "seq_len": "long"}},
     "models[1].evaluation.seq_len: must be an integer in [2, 10^13] or 'unknown length', got 'long'"),
    ({"evaluation": {"data": "d", "seq_len": 256}}, "models[1].evaluation: not what a figure was measured on "
                                                     "(missing tokens)"),
    ({"validation": {"data": "d", "tokens": "3", "seq_len": 256}},
     "models[1].validation.tokens: must be an integer in [0, 10^13], got '3'"),
    ({"validation": {"data": "d", "tokens": 3, "seq_len": "unknown length"}},
     "models[1].validation.seq_len: must be an integer in [2, 10^13], got 'unknown length'"),
    ({"intervals": {"perplexity": [1.0]}}, "models[1].intervals.perplexity: give 2 numbers, got 1"),
    ({"intervals": [[1.0, 2.0]]}, "models[1].intervals: must be an object, each a list of numbers, got [[1.0, 2.0]]"),
    ({"interval_n": {"perplexity": 8}}, "models[1].interval_n.perplexity: must be a string, got 8"),
    ({"prune": {"L/8": [1, "high"]}}, "models[1].prune.L/8: 'high' is not a finite number"),
    ({"prune": {"L/8": None, "L/4": [2, 30.5]}, "prune_method": "angular", "intervals": {"perplexity": [19, 21]},
      "interval_n": {"perplexity": "n=8 windows"}}, None),
])
def test_a_damaged_model_row_of_a_comparison_is_refused_naming_file_and_key(change, error, tmp_path):
    from mixln_convert.errors import MixLNError
    from mixln_convert.report.compare import Comparison

    row = {"label": "a", "kind": "analysis", "layout": "Pre-LN", "source": "a", "perplexity": 20.0,
           "intervals": {}, "interval_n": {}}
    damaged = {key: value for key, value in {**row, **change}.items() if value is not None}
    file = tmp_path / "comparison.json"
    file.write_text(json.dumps({"summary": [], "notes": [], "models": [row, damaged]}))
    if error is None:  # well formed: read back as written
        assert Comparison.read(file).models[1].to_dict() == damaged
        return
    with pytest.raises(MixLNError, match="^" + re.escape(f"{file}: {error}") + "$"):
        Comparison.read(file)


def test_an_analysis_of_unknown_windows_compares_and_its_comparison_reads_back(cli, tmp_path):
    """The oldest analyses record no data, tokens or window length: compare says so, and its comparison.json
    reads back as written."""
    from mixln_convert.report.compare import Comparison

    folder = write_analysis(tmp_path / "old")
    analysis = json.loads((folder / "analysis.json").read_text())
    (folder / "analysis.json").write_text(json.dumps({k: v for k, v in analysis.items()
                                                      if k not in ("data", "tokens", "seq_len")}))
    assert cli("compare", folder, "--out", tmp_path / "report").exit_code == 0
    file = tmp_path / "report" / "comparison.json"
    written = json.loads(file.read_text())
    assert written["models"][0]["evaluation"] == {"data": "unknown data", "tokens": 0, "seq_len": "unknown length"}
    assert Comparison.read(file).to_dict() == written
    md = (tmp_path / "report" / "report.md").read_text()
    assert "unknown data, 0 tokens scored in windows of unknown length" in md


def test_interval_holds_the_figure_and_equal_windows_resample_alike():
    from mixln_convert.report.uncertainty import bootstrap, interval, perplexity

    def differs(x, y):  # the interval of x - y (paired where measured on the same windows) excludes 0
        low, high = interval(x.draws - y.draws)
        return low > 0 or high < 0

    rng = np.random.default_rng(0)
    losses = 3 + 0.5 * rng.standard_normal(WINDOWS)
    a = bootstrap(perplexity, losses, "text, 8,192 tokens")
    assert a.value == pytest.approx(np.exp(losses.mean()))
    low, high = a.interval
    assert low < a.value < high
    # the interval of the mean loss is about +-1.96 standard errors
    half_width = (np.log(high) - np.log(low)) / 2
    assert half_width == pytest.approx(1.96 * losses.std() / np.sqrt(WINDOWS), rel=0.2)
    shifted = bootstrap(perplexity, losses + 0.01, "text, 8,192 tokens")  # the same windows, a model 1% worse
    assert differs(shifted, a)  # paired: the same resamples, so a small consistent gap is resolved
    unpaired = bootstrap(perplexity, losses + 0.01, "other text, 8,192 tokens")
    assert not differs(unpaired, a)  # other windows: 1% is inside the window-to-window spread


@pytest.mark.parametrize("deep_drop_b, noise, verdict", [
    # +1.4% vs +1.5% of perplexity: a difference under the 1% threshold, its interval too
    (0.30, 0.01, "a and b are the same within 1% of perplexity."),
    # +1.4% vs +3.5%: beyond the threshold, but windows this noisy leave 0 inside the interval
    (0.70, 0.3, "a and b are too close to call (the 95% bootstrap interval of their difference over n=32 windows "
                "includes 0)"),
    (3.0, 0.01, "the deep blocks matter most in b"),  # +1.4% vs +15%
])
def test_analysis_differences_inside_the_interval_are_not_called(deep_drop_b, noise, verdict, cli, tmp_path):
    a = with_per_window(write_analysis(tmp_path / "a"), per_window_values(20.0, 0.28, seed=1, noise=noise))
    b = with_per_window(write_analysis(tmp_path / "b", post_ln_layers=2),
                        per_window_values(20.0, deep_drop_b, seed=2, noise=noise))
    result = cli("compare", a, b, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    drop_sentence = next(s for s in summary.splitlines() if "deeper half raises perplexity" in s)
    assert verdict in drop_sentence
    assert re.search(r"\(\+\d\.\d%; median", drop_sentence) is None  # every figure has its interval
    assert len(re.findall(r"\[[+-]\d+\.\d%, [+-]\d+\.\d%; n=32 windows\]; median", drop_sentence)) == 2  # and its n
    saved = json.loads((tmp_path / "report" / "comparison.json").read_text())
    for model in saved["models"]:
        low, high = model["intervals"]["perplexity"]
        assert low < model["perplexity"] < high


def test_a_mean_carried_by_one_block_is_said(cli, tmp_path):
    folder = write_analysis(tmp_path / "a")
    analysis = json.loads((folder / "analysis.json").read_text())
    analysis["layer_drop"][-1] = 10.1  # the last block: 10.1, the other deep blocks 0.1 each
    (folder / "analysis.json").write_text(json.dumps(analysis))
    assert cli("compare", folder, "--out", tmp_path / "report").exit_code == 0
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    assert "+2.6 (+13.0%; median +0.1; block 7 alone gives 97% of the total)" in summary


@pytest.mark.parametrize("gap, noise, verdict", [
    (0.0, 0.05, re.escape("too close to call: 1,000,000 training tokens per arm and 8,160 validation tokens cannot "
                          "decide")),
    (0.05, 0.05, r"\+[4-8]\.\d%, 95% bootstrap interval \[\+\d\.\d%, \+\d\.\d%\] over the 32 validation windows\): "
                 "Pre-LN wins"),
    # a consistent gap of 0.3%: its interval excludes 0, but it is under the 1% threshold (the LNS retrofit's
    # "Pre-LN wins by 0.0017%")
    (0.003, 0.001, r"\+0\.3%, 95% bootstrap interval \[\+0\.\d%, \+0\.\d%\] over the 32 validation windows\): the same "
                   r"within 1% of perplexity\."),
])
def test_training_verdict_needs_the_gap_outside_the_interval(gap, noise, verdict, cli, tmp_path):
    run = write_run(tmp_path / "run")
    rng = np.random.default_rng(0)
    preln = 3.2 + 0.3 * rng.standard_normal(WINDOWS)
    mixln = preln + gap + noise * rng.standard_normal(WINDOWS)  # the same windows, scored by both arms
    for arm, losses in (("mixln", mixln), ("preln", preln)):
        file = run / arm / "summary.json"
        summary = json.loads(file.read_text())
        summary.update(final_val_window_losses=losses.tolist(), final_val_ppl=float(np.exp(losses.mean())),
                       validation={"data": "embedded:validation", "tokens": WINDOWS * 255, "seq_len": 256})
        file.write_text(json.dumps(summary))
    result = cli("compare", run, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    assert re.search(verdict, summary), summary
    assert "95% bootstrap interval [" in summary
    # each arm says what it was measured on
    assert "(embedded:validation, 32 windows of 256 = 8,192 tokens, 8,160 scored)" in summary


def test_what_the_models_write(cli, tmp_path):
    folders = []
    for name, text, share in (("original", "Paris, the city of light.", 0.0), ("converted", "a file a file a file", 0.5)):
        folder = write_analysis(tmp_path / name)
        analysis = json.loads((folder / "analysis.json").read_text())
        analysis["generation"] = {"repeated_4gram_share": share, "new_tokens": 64,
                                  "continuations": [{"prompt": "The capital of France is", "text": text,
                                                     "repeated_4gram_share": share}]}
        (folder / "analysis.json").write_text(json.dumps(analysis))
        folders.append(folder)
    assert cli("compare", *folders, "--out", tmp_path / "report").exit_code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "original 0.0%, converted 50.0% of their 4-grams repeat" in summary_of(md)
    assert "| The capital of France is | Paris, the city of light. | a file a file a file |" in md


@pytest.mark.parametrize("gap, verdict", [
    (0.0, re.escape("too close to call: 1,000,000 training tokens per arm")),
    (-0.05, r"LNS wins by [3-7]\.\d%"),
])
def test_three_arms_each_pair_gets_a_verdict_only_outside_its_interval(gap, verdict, cli, tmp_path):
    run = write_run(tmp_path / "run")
    write_arm(run, "lns", initial=25.0, final=24.0)  # the LNS retrofit starts where Pre-LN does
    rng = np.random.default_rng(0)
    preln = 3.2 + 0.3 * rng.standard_normal(WINDOWS)
    losses = {"preln": preln, "mixln": preln + 0.05 + 0.05 * rng.standard_normal(WINDOWS),
              "lns": preln + gap + 0.05 * rng.standard_normal(WINDOWS)}  # the same windows, scored by every arm
    for arm, arm_losses in losses.items():
        file = run / arm / "summary.json"
        summary = json.loads(file.read_text())
        summary.update(final_val_window_losses=arm_losses.tolist(), final_val_ppl=float(np.exp(arm_losses.mean())),
                       validation={"data": "embedded:validation", "tokens": WINDOWS * 255, "seq_len": 256},
                       layernorm_scaling=arm == "lns")
        file.write_text(json.dumps(summary))
    result = cli("compare", run, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report" / "report.md").read_text()
    rows = {tuple(c.strip() for c in line.strip("|").split("|")) for line in md.splitlines() if line.startswith("| ")}
    layout = "LNS (Pre-LN, block l's norm outputs x 1/sqrt(l))"
    measured = "embedded:validation, 32 windows of 256 = 8,192 tokens, 8,160 scored"
    assert ("run/lns", layout, "before training (converted)", "25.00", measured, "—", "—", "0", "—") in rows
    summary = summary_of(md)
    interval = (r" [\d.]+ \([+-][\d.]+%, 95% bootstrap interval \[[+-][\d.]+%, [+-][\d.]+%\] "
                r"over the 32 validation windows\): ")
    assert re.search(r"LNS \(run/lns\) [\d.]+ vs Pre-LN \(run/preln\)" + interval + verdict, summary), summary
    assert re.search(r"LNS \(run/lns\) [\d.]+ vs Mix-LN \(run/mixln\)" + interval, summary), summary
    assert re.search(r"Mix-LN \(run/mixln\) [\d.]+ vs Pre-LN \(run/preln\)" + interval + "Pre-LN wins", summary)
    assert "Before training LNS scored 25.00 and Pre-LN 25.00 (1.0000x" in summary
    assert f"run/lns, {layout}: validation perplexity 25.00 before training" in summary


# ---------------------------------------------------------------------------------------------
# what a reader needs: a practical threshold besides the interval, n beside every interval, what each
# figure measured, and figures that name their model

def test_the_verdict_needs_both_the_interval_and_the_practical_threshold():
    from mixln_convert.report.compare import POINTS, RATIO, RELATIVE, judge
    from mixln_convert.report.uncertainty import PRACTICAL, call

    rng = np.random.default_rng(0)
    jitter = rng.standard_normal(2000)
    assert PRACTICAL == 0.01
    assert call(0.05, 0.05 + 0.01 * jitter) == "differs"  # beyond 1%, the interval excludes 0
    assert call(0.05, 0.05 + 0.05 * jitter) == "open"  # beyond 1%, but 0 is inside the interval
    assert call(0.003, 0.003 + 0.0005 * jitter) == "same"  # sure of the sign, but under 1%, its interval too
    assert call(0.003, 0.003 + 0.01 * jitter) == "open"  # under 1%, its interval not
    assert call(0.003) == "same" and call(0.05) == "open"  # no interval: the same within 1%, else uncalled

    def found(value, draws, n):
        from mixln_convert.report.uncertainty import Bootstrap
        return Bootstrap(value, np.asarray(draws), n)

    # Pre-LN "won" by 0.0017% on the LNS retrofit's perplexity: the same within 1% of perplexity
    a, b = 24.0004, 24.0
    assert judge(RATIO, a, b, found(a, a + 1e-4 * jitter, 32), found(b, b + 1e-4 * jitter, 32))[0] == "same"
    assert judge(RATIO, 25.0, 24.0, found(25.0, 25 + 0.1 * jitter, 32), found(24.0, 24 + 0.1 * jitter, 32)) == (
        "differs", "")
    # "most in original" rested on 0.1035 vs 0.1031: 0.4% of the larger value
    assert judge(RELATIVE, 0.1035, 0.1031, found(0.1035, 0.1035 + 1e-5 * jitter, 32),
                 found(0.1031, 0.1031 + 1e-5 * jitter, 32))[0] == "same"
    # points of perplexity: +1.4% vs +3.5% of perplexity differ by 2.1 points, beyond the threshold
    assert judge(POINTS, 0.035, 0.014, found(0.035, 0.035 + 1e-3 * jitter, 32),
                 found(0.014, 0.014 + 1e-3 * jitter, 32))[0] == "differs"
    # an interval on 2 batches decides nothing, however far apart the figures
    outcome, why = judge(RELATIVE, 0.37, 0.27, found(0.37, 0.37 + 1e-3 * jitter, 2),
                         found(0.27, 0.27 + 1e-3 * jitter, 2))
    assert outcome == "open" and "n=2 windows, too few" in why


def angular_pair(tmp_path, angle_a, angle_b, **values):
    """Analyses a and b measured on the same windows whose deep blocks' angular distances differ by a constant."""
    return [with_per_window(write_analysis(tmp_path / name, post_ln_layers=2 if name == "b" else 0),
                            per_window_values(20.0, 0.3, seed=1, angle=angle, **values))
            for name, angle in (("a", angle_a), ("b", angle_b))]


@pytest.mark.parametrize("angle_b, verdict", [
    (0.1031, "a and b are the same within 1% of the larger value."),  # 0.4% apart, however sure the sign
    (0.1200, "the deep blocks change the representation most in b."),  # 14% apart
])
def test_most_needs_a_difference_beyond_the_threshold(angle_b, verdict, cli, tmp_path):
    a, b = angular_pair(tmp_path, 0.1035, angle_b)
    assert cli("compare", a, b, "--out", tmp_path / "report").exit_code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    sentence = next(s for s in summary_of(md).splitlines() if "Mean angular distance" in s)
    assert sentence.endswith(verdict), sentence
    # the threshold is stated, by its value
    from mixln_convert.report.uncertainty import PRACTICAL
    assert f"only where it is larger than {PRACTICAL:.0%}" in md


@pytest.mark.parametrize("batches, verdict", [
    (2, "too close to call (the interval rests on n=2 gradient batches, too few (under 5) to decide)"),
    (8, "most uniform in a"),
])
def test_every_interval_says_its_n_and_two_batches_decide_nothing(batches, verdict, cli, tmp_path):
    a = with_per_window(write_analysis(tmp_path / "a"), per_window_values(20.0, 0.3, seed=1, batches=batches))
    b = with_per_window(write_analysis(tmp_path / "b", post_ln_layers=2),
                        per_window_values(20.0, 0.3, seed=2, batches=batches, grad_slope=0.1))  # far less uniform
    assert cli("compare", a, b, "--out", tmp_path / "report").exit_code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    summary = summary_of(md)
    gradient = next(s for s in summary.splitlines() if "gradient norm across blocks" in s)
    assert gradient.count(f"; n={batches} gradient batches]") == 2 and verdict in gradient
    # every interval in the summary and the tables says what it rests on
    intervals = re.findall(r"\[[^\[\]]*, [^\[\]]*\]", summary + md.split("## Perplexity")[1])
    assert intervals and all(re.search(r"; n=\d+ (windows|gradient batches)\]$", i) for i in intervals), intervals


@pytest.mark.parametrize("heal_tokens, stage", [
    (16384, "before training (converted + healed on 16,384 tokens)"),
    (0, "before training (converted)"),
    (None, "before training (converted, healed if the run healed: not recorded)"),
])
def test_the_mixln_start_row_says_whether_it_was_healed(heal_tokens, stage, cli, tmp_path):
    run = write_run(tmp_path / "run")
    if heal_tokens is not None:
        file = run / "mixln" / "summary.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), "heal_tokens": heal_tokens}))
    assert cli("compare", run, "--out", tmp_path / "report").exit_code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    stages = {cells[0]: cells[2] for line in md.splitlines() if line.startswith("| run/")
              for cells in [[c.strip() for c in line.strip("|").split("|")]] if cells[2].startswith("before")}
    assert stages == {"run/mixln": stage, "run/preln": "before training (original)"}


def test_token_counts_say_how_many_windows_and_why_fewer_are_scored(cli, tmp_path):
    """The demo's console said 2,048 tokens (--eval-tokens: the windows hold them), results record 2,040
    (what is scored): one wording, in the console and the report, gives both and why."""
    from mixln_convert.evaluation.options import Measured, measured_on

    seq_len, windows = 256, 8
    where = Measured(data="embedded:validation", tokens=windows * (seq_len - 1), seq_len=seq_len)
    text = measured_on(where)
    shown = re.fullmatch(r"embedded:validation, (\d+) windows of (\d+) = ([\d,]+) tokens, ([\d,]+) scored", text)
    assert shown, text
    w, s, held, scored = (int(g.replace(",", "")) for g in shown.groups())
    assert (w, s) == (windows, seq_len) and held == w * s and scored == w * (s - 1) == where.tokens
    assert "2,048 tokens" in text and "2,040 scored" in text

    folder = with_per_window(write_analysis(tmp_path / "a"), per_window_values(20.0, 0.3, seed=1))
    analysis = json.loads((folder / "analysis.json").read_text())
    (folder / "analysis.json").write_text(json.dumps({**analysis, "tokens": WINDOWS * 255}))
    assert cli("compare", folder, "--out", tmp_path / "report").exit_code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "32 windows of 256 = 8,192 tokens, 8,160 scored" in md
    assert "scores S - 1 next-token predictions" in md


def captured_figures(monkeypatch):
    """{file name: Figure} of every figure saved from now on."""
    from matplotlib.figure import Figure

    saved, savefig = {}, Figure.savefig

    def keep(fig, path, *args, **kwargs):
        saved[Path(path).name] = fig
        return savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def titles(fig) -> list:
    """The title artists of ``fig``: its suptitle, and each panel's title and axis labels."""
    texts = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        texts += [t for t in (ax.title, ax.xaxis.label, ax.yaxis.label) if t.get_text()]
    return texts


def test_figures_name_their_model_keep_one_unit_and_clip_no_title(monkeypatch, tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mixln_convert.analysis.plots import plot_analysis
    from mixln_convert.analysis.result import Analysis
    from mixln_convert.report import compare

    saved = captured_figures(monkeypatch)
    long_data = "HuggingFaceFW/fineweb-edu:sample-10BT:validation-with-a-long-configuration-name"
    arms = {}
    for arm in ("mixln", "preln"):
        folder = with_per_window(write_analysis(tmp_path / f"{arm}-trained", post_ln_layers=2 if arm == "mixln" else 0,
                                                prune=[1.1, 1.2, 1.5, 2.0]),
                                 per_window_values(20.0, 0.3, seed=len(arm)))
        analysis = json.loads((folder / "analysis.json").read_text())
        analysis.update(checkpoint=str(tmp_path / "train" / arm / "final"), data=long_data)
        (folder / "analysis.json").write_text(json.dumps(analysis))
        arms[arm] = Analysis.read(folder / "analysis.json")
    figures = {}
    for arm, analysis in arms.items():  # the per-model figures, as analyze writes them
        (tmp_path / f"plots-{arm}").mkdir()
        plot_analysis(analysis, tmp_path / f"plots-{arm}")
        figures[arm] = dict(saved)
        saved.clear()
    comparison = compare([tmp_path / "mixln-trained", tmp_path / "preln-trained"], tmp_path / "report")
    figures["report"] = dict(saved)
    assert type(comparison).read(tmp_path / "report" / "comparison.json") == comparison  # the file is what it says

    # the trained arms' per-model figures name their arm, not 'final' for both
    for arm in ("mixln", "preln"):
        for name, fig in figures[arm].items():
            assert f"{arm}/final" in " ".join(t.get_text() for t in titles(fig)), name
    # one unit for both layer-drop figures: % of the full model's perplexity, plotted as such
    per_model, compared = figures["mixln"]["layer_drop.png"].axes[0], figures["report"]["layer_drop.png"].axes[0]
    assert per_model.get_ylabel() == compared.get_ylabel() and "%" in per_model.get_ylabel()
    expected = [100 * d / arms["mixln"].perplexity for d in arms["mixln"].layer_drop]
    assert sorted(p.get_height() for p in per_model.patches) == pytest.approx(sorted(expected))
    assert list(compared.lines[0].get_ydata()) == pytest.approx(expected)
    # no title, label or subtitle runs past the figure's edges
    for group, saved_figures in figures.items():
        for name, fig in saved_figures.items():
            canvas = FigureCanvasAgg(fig)
            canvas.draw()  # laid out at the figure's own dpi, as the extents are measured
            renderer = canvas.get_renderer()
            for text in titles(fig):
                box = text.get_window_extent(renderer)
                assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (group, name, text.get_text())


@pytest.mark.parametrize("chars", [40, 50, 60, 80])
def test_a_wrapped_title_keeps_what_a_figure_was_measured_on_whole(chars):
    """Titles wrapped at spaces split '8 windows of 256 =' from '2,048 tokens'; clauses stay whole where they fit."""
    from mixln_convert.analysis.plots import _wrap

    title = "models/SmolLM2-135M-Instruct.Q4_1.gguf: embedded:validation, 8 windows of 256 = 2,048 tokens, 2,040 scored"
    lines = _wrap(title, chars)
    assert all(len(line) <= chars for line in lines) and " ".join(lines) == title
    assert any("8 windows of 256 = 2,048 tokens" in line for line in lines), lines
