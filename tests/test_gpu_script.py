"""benchmarks/gpu.sh, the one prepared device call: the same script at tiny scale on CPU
(--smoke), so the GPU call cannot fail on a typo, and its plan B on a non-finite step."""

import importlib.util
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
import gpu_real  # noqa: E402

STAGES = {"pretrained", "converted", "healed", "mixln-trained", "preln-trained"}


def run_gpu_script(tmp_path, *args) -> dict:
    """``bash benchmarks/gpu.sh ARGS`` as the device call runs it, its OUT in ``tmp_path``: the summary, once
    the script passed and left what the device tool brings back (at most 8 plain files)."""
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args, "--work", str(tmp_path / "work")],
                          env={**os.environ, "OUT": str(out), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() for f in files)
    return json.loads((out / "summary.json").read_text())


def test_gpu_script_smoke_run_records_every_figure(tmp_path):
    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    summary, out = run_gpu_script(tmp_path, "--smoke", "--tokenizer", str(tmp_path / "tokenizer")), tmp_path / "out"
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

    def phase(name, kind, kwargs, estimate_s, needed=True, cap_s=None):
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

    with pytest.raises(MixLNError, match=r"attention: unknown value 'flash' \(choose from sdpa, eager\)"):
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
    summary = run_gpu_script(tmp_path, "--smoke", "--throughput", "--tokenizer", str(tmp_path / "tokenizer"))
    out = tmp_path / "out"
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


# ---- benchmarks/gpu.sh --real: SmolLM2-135M itself (benchmarks/gpu_real.py), here on a tiny GGUF ----

REAL_PHASES = ["setup", "s0-preln", "s0-mixln", "s0-lns", "analyze", "tasks", "s1-preln", "s1-mixln", "s1-lns",
               "compare"]


@pytest.fixture(scope="module")
def real_parts(tmp_path_factory):
    """A tiny random LLaMA as a GGUF with a byte-level BPE vocabulary (SmolLM2's layout), and the two
    parts `--real --prepare` carries of it."""
    from tiny import VOCAB, make_tiny_llama, write_tiny_gguf

    from mixln_convert.io.loader import open_checkpoint

    root = tmp_path_factory.mktemp("real")
    source = make_tiny_llama(root / "source", vocab_size=VOCAB + 16)  # more rows than tokens, as SmolLM2's GGUF
    gguf = write_tiny_gguf(source, open_checkpoint(source).arch, root / "tiny.gguf")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--real", "--prepare", str(root / "parts"),
                           "--model", str(gguf), "--smoke"], env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return gguf, root / "parts"


def test_real_prepare_splits_the_gguf_in_two_parts_that_each_fit_a_call(real_parts):
    gguf, parts = real_parts
    manifest = json.loads((parts / "part1" / "manifest.json").read_text())
    halves = [parts / part["file"] for part in manifest["gguf"]["parts"]]
    assert [h.parent.name for h in halves] == ["part0", "part1"]
    assert b"".join(h.read_bytes() for h in halves) == gguf.read_bytes()
    assert (parts / "part0" / "site" / "gguf" / "__init__.py").is_file()  # gguf-py, which the device lacks
    assert list((parts / "part0" / "site").glob("gguf-*.dist-info/METADATA"))
    assert (parts / "part1" / "data" / "tokens" / "mixln-tokens.json").is_file()
    carry = manifest["carry"]
    for part in ("part0", "part1"):
        assert 0 < carry[f"{part}_bytes"] and carry[f"{part}_bytes"] + carry["working_tree_bytes"] < 64 * 2**20
    data = manifest["data"]
    assert data["train"]["tokens"] > 0 and data["validation"]["tokens"] > 0
    # held out: no validation document is a train document
    train = set(gpu_real.english("train") + gpu_real.english("calibration"))
    assert train and not train & set(gpu_real.english("validation"))


def test_real_setup_names_a_part_the_machine_lacks(real_parts, tmp_path):
    _, parts = real_parts
    manifest = json.loads((parts / "part1" / "manifest.json").read_text())
    (tmp_path / "part1").symlink_to(parts / "part1")  # part0 not carried (or the machine went back)
    with pytest.raises(FileNotFoundError, match="part0/model.gguf.0 is missing"):
        gpu_real.join_parts(tmp_path, manifest, tmp_path / "joined.gguf")


def test_real_setup_tokenizes_again_where_the_tokenizer_differs(real_parts, tmp_path, monkeypatch):
    import shutil

    _, parts = real_parts
    copy = tmp_path / "parts"
    shutil.copytree(parts, copy)
    tokens = copy / "part1" / "data" / "tokens" / "mixln-tokens.json"
    tokens.write_text(json.dumps({**json.loads(tokens.read_text()), "tokenizer_sha256": "0" * 64}))
    monkeypatch.syspath_prepend(str(copy / "part0" / "site"))
    (tmp_path / "work").mkdir()
    setup = gpu_real.child_setup(str(copy), str(tmp_path / "work"), num_proc=1)
    assert setup["tokens"] == str(tmp_path / "work" / "tokens")
    assert setup["tokens_how"].startswith("made again here") and "ids agree" in setup["tokens_how"]
    assert setup["train_tokens"] == json.loads((copy / "part1" / "manifest.json").read_text())["data"]["train"]["tokens"]


def test_gpu_real_smoke_run_heals_trains_three_arms_for_two_seeds_and_compares(real_parts, tmp_path):
    _, parts = real_parts
    summary, out = run_gpu_script(tmp_path, "--real", "--smoke", "--parts", str(parts)), tmp_path / "out"
    has_lm_eval = importlib.util.find_spec("lm_eval") is not None
    assert [(p["phase"], p["ok"]) for p in summary["phases"]] == [
        (name, True) for name in REAL_PHASES if name != "tasks" or has_lm_eval]
    data = summary["data"]
    assert data["tokens_how"].startswith("carried") and data["gguf_py"].startswith(str(parts / "part0" / "site"))
    scale = gpu_real.SCALES["smoke"]
    plan = summary["plan"]
    assert plan["arm_tokens"] == scale["arm_tokens_cap"] and plan["heal_tokens"] == scale["heal_tokens"]
    assert summary["seeds_run"] == 2
    for seed in (0, 1):
        for arm, post_ln in (("preln", 0), ("mixln", 2), ("lns", 0)):
            run = summary["runs"][f"s{seed}-{arm}"]
            assert run["post_ln_layers"] == post_ln and run["tokens"] == plan["arm_tokens"]
            assert len(run["validation_curve"]) > 2
        assert set(summary["seeds"][f"seed{seed}"]) == {"mixln/preln", "lns/preln"}
    for where in ("validation", "packed"):  # the heal's ratio to the original, with its interval
        found = summary["heal"][where]
        assert found["interval"][0] <= found["ratio"] <= found["interval"][1] and found["n"] >= 5
    assert math.isfinite(summary["heal"]["per_document"]["ratio"])
    assert set(summary["analysis"]) == set(gpu_real.STAGES) == set(summary["per_document"])
    for stage in summary["analysis"].values():
        assert len(stage["layer_drop"]) == len(stage["grad_norm_per_layer"]) == len(stage["angular_distance"]) == 8
    assert summary["comparison"]["runs"] == ["seed0", "seed1"] and (out / "report.md").is_file()
    if has_lm_eval:  # before (original) and after (healed, trained)
        assert set(summary["tasks"]["tasks"]) == {"original", "healed", "preln-trained", "mixln-trained", "lns-trained"}
    else:
        assert "not installed" in summary["tasks"]["skipped"]
    text = (out / "summary.txt").read_text()
    for figure in ("budget: heal", "passes over the train tokens", "healed/original perplexity",
                   "seed1 mixln/preln", "per-document token perplexity", "layer drop", "grad norms", "Pre-LN"):
        assert figure in text, figure
