"""The compare report, from synthesized analysis.json files and train output folders (no model)."""

import json
import re

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
    return report_md.split("## Summary")[1].split("## Perplexity")[0]


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
    measured = "embedded:validation, 2,048 tokens in windows of 256"  # what each analysis records
    assert (*mixln, "before training (converted)", "31.20", "—", "—", "—", "0", "—") in rows
    assert (*mixln, "after training", "22.80", "—", "23.00", measured, "1,000,000", "12.5 min") in rows
    assert ("run/preln", "Pre-LN", "before training (original)", "25.00", "—", "—", "—", "0", "—") in rows
    assert ("run/preln", "Pre-LN", "after training", "24.00", "—", "24.00", measured, "1,000,000", "2.5 h") in rows
    assert ("analysis-original", "Pre-LN", "analysed: ckpt-analysis-original", "—", "—", "25.50", measured, "—",
            "—") in rows
    # pruning table at N = L/8, L/4, L/2 = 1, 2, 4
    assert ("run/mixln", "angular", "23.00", "25.30 (N=1, 1.10x)", "34.50 (N=2, 1.50x)", "69.00 (N=4, 3.00x)") in rows

    summary = summary_of(md)
    assert "Mix-LN (run/mixln) 22.80 vs Pre-LN (run/preln) 24.00 (-5.0%): Mix-LN wins by 5.0%" in summary
    assert "from 25.00 (original) to 31.20 (1.25x)" in summary
    assert "+2.3 (+10.0%; median +2.3)" in summary and "+0.24 (+1.0%; median +0.24)" in summary
    assert "the deep blocks matter most in run/mixln" in summary
    assert "most uniform in run/mixln" in summary
    assert "run/preln keeps the most of its quality" in summary  # 1.10x vs 1.50x at N = L/4

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
    (22.8, 24.0, "Mix-LN wins by 5.0%"),
    (25.0, 24.0, "Pre-LN wins by 4.2%"),
    (24.05, 24.0, "a tie (within 0.5%; no per-window values to bootstrap an interval from)"),
])
def test_summary_names_the_winner(mixln_final, preln_final, verdict, cli, tmp_path):
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
    assert "a and b are too close to call (within 0.5%" in summary  # identical layer drop, no per-window values
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
    assert "| light | Pre-LN | analysed: ckpt-light | — | — | 31.00 |" in md
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


def per_window_values(perplexity, deep_drop, *, seed, spread=0.3, angle=0.2):
    """per_window of an analysis (see analysis.analyze.layer_metrics) around ``perplexity``, its deep
    blocks each costing ``deep_drop``; window losses vary by ``spread`` nats between windows."""
    rng = np.random.default_rng(seed)
    loss = np.log(perplexity) + spread * rng.standard_normal(WINDOWS)
    drops = [50.0 / (i + 1) if i < L // 2 else deep_drop for i in range(L)]
    without = loss[:, None] + np.log1p(np.array(drops) / perplexity)[None] + 0.01 * rng.standard_normal((WINDOWS, L))
    return {"loss": loss.tolist(), "loss_without_layer": without.tolist(),
            "angular_distance": (angle + 0.02 * rng.standard_normal((WINDOWS, L))).tolist(),
            "grad_norm_per_layer": (1 + 0.1 * rng.random((WINDOWS // 4, L))).tolist()}


def with_per_window(folder, per_window):
    file = folder / "analysis.json"
    analysis = json.loads(file.read_text())
    loss, without = np.asarray(per_window["loss"]), np.asarray(per_window["loss_without_layer"])
    analysis.update(perplexity=float(np.exp(loss.mean())), per_window=per_window,
                    grad_norm_per_layer=np.mean(per_window["grad_norm_per_layer"], axis=0).tolist(),
                    layer_drop=(np.exp(without.mean(0)) - np.exp(loss.mean())).tolist())
    file.write_text(json.dumps(analysis))
    return folder


def test_interval_holds_the_figure_and_equal_windows_resample_alike():
    from mixln_convert.report.uncertainty import differs, estimate, perplexity

    rng = np.random.default_rng(0)
    losses = 3 + 0.5 * rng.standard_normal(WINDOWS)
    a = estimate(perplexity, losses, "text, 8,192 tokens")
    assert a.value == pytest.approx(np.exp(losses.mean()))
    low, high = a.interval
    assert low < a.value < high
    # the interval of the mean loss is about +-1.96 standard errors
    half_width = (np.log(high) - np.log(low)) / 2
    assert half_width == pytest.approx(1.96 * losses.std() / np.sqrt(WINDOWS), rel=0.2)
    shifted = estimate(perplexity, losses + 0.01, "text, 8,192 tokens")  # the same windows, a model 1% worse
    assert differs(shifted, a)  # paired: the same resamples, so a small consistent gap is resolved
    unpaired = estimate(perplexity, losses + 0.01, "other text, 8,192 tokens")
    assert not differs(unpaired, a)  # other windows: 1% is inside the window-to-window spread


@pytest.mark.parametrize("deep_drop_b, verdict", [
    (0.30, "are too close to call (the 95% bootstrap interval of their difference"),
    (3.0, "the deep blocks matter most in b"),
])
def test_analysis_differences_inside_the_interval_are_not_called(deep_drop_b, verdict, cli, tmp_path):
    a = with_per_window(write_analysis(tmp_path / "a"), per_window_values(20.0, 0.28, seed=1))
    b = with_per_window(write_analysis(tmp_path / "b", post_ln_layers=2), per_window_values(20.0, deep_drop_b, seed=2))
    result = cli("compare", a, b, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    summary = summary_of((tmp_path / "report" / "report.md").read_text())
    drop_sentence = next(s for s in summary.splitlines() if "deeper half raises perplexity" in s)
    assert verdict in drop_sentence
    assert re.search(r"\(\+\d\.\d%; median", drop_sentence) is None  # every figure has its interval
    assert re.search(r"\[[+-]\d+\.\d%, [+-]\d+\.\d%\]; median", drop_sentence)
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


@pytest.mark.parametrize("gap, verdict", [
    (0.0, re.escape("too close to call: 1,000,000 training tokens per arm and 8,160 validation tokens cannot decide")),
    (0.05, r"\+[4-8]\.\d%, 95% bootstrap interval \[\+\d\.\d%, \+\d\.\d%\] over the validation windows\): Pre-LN wins"),
])
def test_training_verdict_needs_the_gap_outside_the_interval(gap, verdict, cli, tmp_path):
    run = write_run(tmp_path / "run")
    rng = np.random.default_rng(0)
    preln = 3.2 + 0.3 * rng.standard_normal(WINDOWS)
    mixln = preln + gap + 0.05 * rng.standard_normal(WINDOWS)  # the same windows, scored by both arms
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
    assert "(embedded:validation, 8,160 tokens in windows of 256)" in summary  # each arm says what it was measured on


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
    measured = "embedded:validation, 8,160 tokens in windows of 256"
    assert ("run/lns", layout, "before training (converted)", "25.00", measured, "—", "—", "0", "—") in rows
    summary = summary_of(md)
    interval = (r" [\d.]+ \([+-][\d.]+%, 95% bootstrap interval \[[+-][\d.]+%, [+-][\d.]+%\] "
                r"over the validation windows\): ")
    assert re.search(r"LNS \(run/lns\) [\d.]+ vs Pre-LN \(run/preln\)" + interval + verdict, summary), summary
    assert re.search(r"LNS \(run/lns\) [\d.]+ vs Mix-LN \(run/mixln\)" + interval, summary), summary
    assert re.search(r"Mix-LN \(run/mixln\) [\d.]+ vs Pre-LN \(run/preln\)" + interval + "Pre-LN wins", summary)
    assert "Before training LNS scored 25.00 and Pre-LN 25.00 (1.0000x" in summary
    assert f"run/lns, {layout}: validation perplexity 25.00 before training" in summary
