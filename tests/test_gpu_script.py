"""benchmarks/gpu.sh, the one prepared device call: the same script at tiny scale on CPU
(--smoke), so the GPU call cannot fail on a typo, and its plan B on a non-finite step."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import tiny_tokenizer

from mixln_convert.errors import MixLNError
from mixln_convert.training.loop import NonFiniteStep

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_mission  # noqa: E402

STAGES = {"pretrained", "converted", "healed", "mixln-trained", "preln-trained"}


def test_gpu_script_smoke_run_records_every_figure(tmp_path):
    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke", "--tokenizer", str(tmp_path / "tokenizer"),
                           "--work", str(tmp_path / "work")], env={**os.environ, "OUT": str(out), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() for f in files)  # what the device tool brings back
    summary = json.loads((out / "summary.json").read_text())
    assert [(p["phase"], p["ok"]) for p in summary["phases"]] == [
        ("prepare", True), ("pretrain", True), ("preln", True), ("mixln", True), ("analyze", True)]
    assert summary["environment"]["device"] == "cpu" and summary["text"]["train_tokens"] > 0
    for name, post_ln in (("pretrain", 0), ("mixln", 2), ("preln", 0)):
        run = summary["runs"][name]
        assert run["post_ln_layers"] == post_ln and run["peak_gpu_memory_bytes"] is None
        for key in ("tokens_per_s_median", "mfu_6n_measured_790", "mfu_6n_attention_spec_989",
                    "estimated_gpu_memory_bytes", "initial_val_ppl", "final_val_ppl"):
            assert math.isfinite(run[key]) and run[key] > 0, (name, key)
        assert len(run["validation_curve"]) > 2
        assert all(len(norms) == run["num_layers"] for norms in run["grad_norm_per_layer_first_last"])
        assert (out / f"{name}.metrics.jsonl").is_file()
    assert set(summary["analysis"]) == STAGES
    for stage in summary["analysis"].values():
        assert len(stage["layer_drop"]) == len(stage["grad_norm_per_layer"]) == 8
    assert summary["comparison"]["summary"] and (out / "report.md").is_file()
    text = (out / "summary.txt").read_text()
    for figure in ("tokens/s", "MFU", "peak GPU memory n/a", "val ppl", "layer drop", "grad norms"):
        assert figure in text


def test_a_child_reports_a_nonfinite_step_with_its_full_traceback(tmp_path, monkeypatch, capsys):
    def fit():  # as the trainer raises it: the guard's error re-raised in one line, `from None`
        try:
            raise NonFiniteStep("gradient norm is nan at step 7 (non-finite gradients in 2 of 8 blocks, the first "
                                "block 0, Post-LN); its samples are 48..55 of the seeded order")
        except MixLNError as e:
            raise MixLNError(f"mixln: {e}; training stopped") from None

    monkeypatch.setitem(gpu_mission.CHILDREN, "fit", fit)
    with pytest.raises(SystemExit) as exited:
        gpu_mission.run_child("fit", {}, tmp_path / "status.json")
    assert exited.value.code == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["nonfinite"] and status["step"] == 7 and status["error"].startswith("mixln: gradient norm is nan")
    assert "NonFiniteStep" in capsys.readouterr().err  # the guard's own frame, not only the re-raise


def test_a_nonfinite_arm_is_rerun_in_fp32_and_with_eager_attention(tmp_path, monkeypatch):
    mission = gpu_mission.Mission(gpu_mission.SCALES["smoke"], tmp_path, tmp_path, "tokenizer", ["seed=3"])
    calls = []

    def phase(name, kind, kwargs, estimate_s, needed=True):
        calls.append((name, kwargs["overrides"], kwargs["out"], needed))
        if name == "mixln":
            return {"ok": False, "error": "mixln: loss is nan at step 3", "nonfinite": True, "step": 3}
        return {"ok": name.endswith("fp32"), "error": "mixln: loss is nan at step 3"}  # fp32 gets past it

    monkeypatch.setattr(mission, "phase", phase)
    assert not mission.train("mixln", "main.yaml", "mixln", tmp_path / "main", 60)
    cut = f"max_tokens={8 * 8 * 64}"  # 5 steps past step 3, of 8 x 64 tokens
    assert calls[1:] == [("mixln-fp32", ["seed=3", cut, "precision=fp32"], str(tmp_path / "mixln-fp32"), False),
                         ("mixln-eager", ["seed=3", cut, "attention=eager"], str(tmp_path / "mixln-eager"), False)]
    assert mission.bisect == {"mixln": {"error": "mixln: loss is nan at step 3", "fp32": "passed",
                                        "eager": "mixln: loss is nan at step 3"}}
    assert list(mission.runs) == ["mixln-fp32"]


def test_attention_is_a_recipe_key_the_mixln_model_honours(converted):
    import torch

    from mixln_convert.surgery.loading import load_model
    from mixln_convert.training import load_recipe

    with pytest.raises(MixLNError, match="attention must be one of sdpa, eager"):
        load_recipe("smollm2-135m-cpu", ["source=" + str(converted), "attention=flash"])
    batch = torch.randint(0, 320, (2, 32))
    losses = {}
    for attention in ("sdpa", "eager"):
        model = load_model(converted, dtype=torch.float32)
        model.set_attn_implementation(attention)  # what the trainer does with the recipe's key
        assert model.model.layers[0].self_attn.config._attn_implementation == attention
        losses[attention] = model(input_ids=batch, labels=batch).loss.item()
    assert losses["sdpa"] == pytest.approx(losses["eager"], rel=1e-5)


def test_gpu_script_throughput_smoke_run_times_eager_compiled_and_profiles(tmp_path):
    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke", "--throughput", "--tokenizer",
                           str(tmp_path / "tokenizer"), "--work", str(tmp_path / "work")],
                          env={**os.environ, "OUT": str(out), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [(p["phase"], p["ok"]) for p in summary["phases"]] == [
        ("prepare", True), ("eager", True), ("compiled", True), ("profile", True)]
    eager, compiled = summary["runs"]["eager"], summary["runs"]["compiled"]
    assert eager["steps"] == compiled["steps"] == gpu_mission.SCALES["smoke-throughput"]["steps"]
    # one seed, one data order: compiling changes the kernels, not the run
    assert math.isclose(eager["final_val_ppl"], compiled["final_val_ppl"], rel_tol=1e-3)
    assert all(math.isfinite(run["mfu_6n_measured_790"]) and run["mfu_6n_measured_790"] > 0 for run in (eager, compiled))
    profile = summary["profile"]
    assert math.isclose(sum(profile["share_by_kind"].values()), 1.0, rel_tol=1e-6)
    assert profile["share_by_kind"]["matmul"] > 0 and profile["top_kernels"]
    text = (out / "summary.txt").read_text()
    assert "compiled:" in text and "profile (micro-batch" in text
