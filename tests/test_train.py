"""`mixln-convert train`: recipes, both arms, outputs, exact resume after SIGKILL, 2 processes = 1."""

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import warnings
import time
from pathlib import Path

import pytest
import torch
import yaml

from mixln_convert.errors import MixLNError
from mixln_convert.fetch import cache_dir
from mixln_convert.workflows.train import train
from mixln_convert.training import load_recipe
from mixln_convert.training.recipe import FIELDS, RECIPES as RECIPES_DIR, _flatten, shipped_recipes

REPO = Path(__file__).parent.parent
RECIPES = sorted((REPO / "mixln_convert" / "recipes").glob("*.yaml"))
WORDS = ("the of model layer norm residual stream token block attention gradient data learning rate step "
         "train loss value function return list item order quick brown fox jumps over lazy dog").split()


@pytest.fixture(scope="module", autouse=True)
def environment(tmp_path_factory):
    """A temporary user cache (token caches), and one thread: tiny models gain nothing from more, and
    a resumed run must do the same arithmetic as the subprocess it continues. Subprocesses inherit both."""
    threads, models, cache = torch.get_num_threads(), cache_dir() / "models", tmp_path_factory.mktemp("cache")
    torch.set_num_threads(1)
    if models.is_dir():  # the real-model test finds the cached GGUF instead of fetching it again
        (cache / "models").symlink_to(models)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIXLN_CONVERT_CACHE", str(cache))
        mp.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "corpus.jsonl"
    with open(path, "w") as f:
        for _ in range(300):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(30, 80))) + "."}) + "\n")
    return path


def tiny(source, corpus, steps=4, **extra) -> list[str]:
    """--set overrides that make any recipe a tiny run: seq 32, 4 sequences per step, `steps` steps, no heal."""
    values = {"source": source, "data.train": corpus, "data.validation": None, "seq_len": 32,
              "micro_batch_size": 2, "global_batch_size": 4, "max_tokens": steps * 4 * 32, "data.eval_tokens": 256,
              "precision": "fp32", "schedule.warmup_steps": 1, "eval_interval": 2, "checkpoint_interval": 2,
              "grad_norm_interval": 2, "heal.tokens": 0, **extra}
    return [f"{k}={'null' if v is None else v}" for k, v in values.items()]


def metrics(out: Path, arm: str) -> list[dict]:
    return [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]


def assert_same_curve(a: list[dict], b: list[dict], tol: float):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("loss", "val_loss", "lr"):
            assert (key in ra) == (key in rb)
            assert ra.get(key, 0) == pytest.approx(rb.get(key, 0), abs=tol), (ra["step"], key)


# ---- recipes -------------------------------------------------------------------------------


def test_four_recipes_are_shipped():
    assert {p.name for p in RECIPES} == {"smollm2-135m-cpu.yaml", "smollm2-135m.yaml", "llama-1b.yaml",
                                         "llama-7b-fsdp.yaml"}
    assert {p.name for p in (REPO / "mixln_convert" / "recipes" / "accelerate").glob("*.yaml")} == {
        "single_gpu.yaml", "multi_gpu_ddp.yaml", "fsdp.yaml"}
    for recipe in RECIPES:  # each lists only what differs from the defaults, which live once, in Recipe
        for key, value in _flatten(yaml.safe_load(recipe.read_text())).items():
            assert key in FIELDS and value != FIELDS[key][1], (recipe.name, key)


def test_recipes_by_name_and_listed(cli):
    listed = cli("train", "--list")
    assert listed.exit_code == 0 and all(p.stem in listed.stdout for p in RECIPES)
    assert "fsdp" in listed.stdout and "multi_gpu_ddp" in listed.stdout
    for description in [*shipped_recipes().values(), *shipped_recipes(RECIPES_DIR / "accelerate").values()]:
        assert description.endswith(".") and "Sized for" not in description, description  # a sentence, whole
    assert "both arms 30 steps on the embedded corpus" in listed.stdout
    path = cli("recipes", "--path", "fsdp").stdout.strip()
    assert Path(path).is_file() and Path(path).name == "fsdp.yaml"
    cpu = load_recipe("smollm2-135m-cpu", [f"source={RECIPES[0]}"])
    # the demo's advice: heal before training, at the heal's lr (1e-4 made the Mix-LN arm loop)
    assert (cpu.max_tokens, cpu.heal.tokens, cpu.optim.lr) == (30720, 16384, 3e-5)


# (the CPU recipe's dry run is the `finished` fixture below)
@pytest.mark.parametrize("recipe", [p for p in RECIPES if p.name != "smollm2-135m-cpu.yaml"], ids=lambda p: p.stem)
def test_shipped_recipe_dry_run(recipe, tiny_llama_tied, corpus, tmp_path):
    # one process: a recipe's fsdp is off here (the two-process tests below run the sharded path),
    # and so is compile (a minute of CPU compilation per arm; test_speed_and_memory_levers_keep_the_losses covers it)
    resolved = load_recipe(recipe, tiny(tiny_llama_tied, corpus, steps=2, fsdp="false") + ["compile=false"])
    summaries = train(resolved, tmp_path / "run", progress=False)
    assert [s.steps for s in summaries.values()] == [2, 2]
    assert all((tmp_path / "run" / arm / "final" / "config.json").is_file() for arm in ("mixln", "preln"))


def test_set_overrides_and_types(tiny_llama_tied, corpus):
    recipe = load_recipe(REPO / "mixln_convert" / "recipes" / "llama-1b.yaml",
                         tiny(tiny_llama_tied, corpus, max_tokens="2e3") + ["optim.lr=3e-4", "optim.betas=[0.8, 0.9]"])
    assert recipe.optim.lr == 3e-4 and recipe.max_tokens == 2000 and recipe.optim.betas == (0.8, 0.9)
    assert recipe.source == str(tiny_llama_tied.absolute()) and recipe.conversion.alpha == 0.25


def test_orchestrators_replace_typed_fields(tiny_llama_tied, corpus):
    """demo, sweep and study change a loaded recipe by field, checked like --set, naming who changed it."""
    recipe = load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus))
    seeded = recipe.replace("--seeds", seed=3, optim=dataclasses.replace(recipe.optim, lr="3e-4"), arms=["lns"])
    assert (seeded.seed, seeded.optim.lr, seeded.arms) == (3, 3e-4, ("lns",)) and recipe.seed == 0
    assert seeded.replace(seed=0, optim=recipe.optim, arms=recipe.arms) == recipe
    for changes, message in (({"seed": -1}, "--seeds: seed: must be an integer in [0, 2^32)"),
                             ({"optim.lrr": 1.0}, "--seeds: unknown key 'optim.lrr'"),
                             ({"optim": 1.0}, "--seeds: 'optim' is a section, not a key"),
                             ({"max_tokens": 1}, "--seeds: max_tokens 1 is less than one optimizer step")):
        with pytest.raises(MixLNError, match=re.escape(message)):
            recipe.replace("--seeds", **changes)
    with pytest.raises(MixLNError, match="^demo: heal.tokens: 1 is less than one heal step"):
        load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus), {"heal.tokens": 1}, "demo")


def test_a_recipe_may_alias_single_values(tiny_llama_tied, corpus, tmp_path):
    file = tmp_path / "aliased.yaml"
    file.write_text("optim: {lr: &lr 2.0e-4}\nheal: {lr: *lr}\n")
    recipe = load_recipe(file, tiny(tiny_llama_tied, corpus))
    assert recipe.optim.lr == recipe.heal.lr == 2e-4


@pytest.mark.parametrize("content, extra, message", [
    ({"optim": {"lrr": 1}}, [], "unknown key 'optim.lrr'"),
    ({}, ["--set=optim.post_ln_lr_scale=0"], "optim.post_ln_lr_scale: must be in (0, 10]"),
    ({}, ["--set=optim.post_ln_lr_scale=11"], "optim.post_ln_lr_scale: must be in (0, 10]"),
    ({}, ["--set=guard.spike_factor=0.5"], "guard.spike_factor: must be 0 (off) or in (1, 1000]"),
    ({}, ["--set=heal.spike_factor=1e9"], "heal.spike_factor: must be 0 (off) or in (1, 1000]"),
    ({}, ["--set=guard.spike_window=100001"], "guard.spike_window: must be an integer in [1, 10000]"),
    ({}, ["--set=guard.max_skips=-1"], "guard.max_skips: must be an integer in [0, 10000]"),
    ({}, ["--set=fsdp=maybe"], "fsdp: must be true or false"),
    ({}, ["--set=compile=2"], "compile: must be true or false"),
    ({}, ["--set=warmup=3"], "unknown key 'warmup'"),
    ({}, ["--set=optim.lr=fast"], "optim.lr: must be a number > 0, got 'fast'"),
    ({}, ["--set=source=/no/such/model"], "source: /no/such/model does not exist"),
    ({}, ["--set=data.train=/no/such/*.jsonl"], "data.train: /no/such/*.jsonl does not exist"),
    ({}, ["--set=max_tokens=100"], "max_tokens 100 is less than one optimizer step"),
    ({}, ["--set=global_batch_size=5"], "global_batch_size 5 is not a multiple of micro_batch_size 2"),
    ({}, ["--set=precision=fp8"], "precision: unknown value 'fp8'"),
    ({}, ["--set=nokey"], "expected KEY=VALUE"),
])
def test_bad_recipe_fails_before_any_work(content, extra, message, cli, tiny_llama_tied, corpus, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(content))
    given = {item.removeprefix("--set=").split("=")[0] for item in extra}  # a key is set once (twice is refused)
    sets = [item for item in tiny(tiny_llama_tied, corpus) if item.split("=")[0] not in given]
    result = cli("train", recipe, *(f"--set={s}" for s in sets), *extra, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "out").exists()


# ---- data ----------------------------------------------------------------------------------


def test_packed_windows_visit_every_window_once_per_pass():
    import numpy as np

    from mixln_convert.data import PackedWindows

    windows = np.arange(40).reshape(10, 4)
    rows = [tuple(PackedWindows(windows, 25, seed=3)[i].tolist()) for i in range(25)]
    assert sorted(rows[:10]) == sorted(rows[10:20]) == sorted(map(tuple, windows.tolist()))
    assert rows[:10] != rows[10:20]  # each pass reshuffles
    assert rows == [tuple(PackedWindows(windows, 25, seed=3)[i].tolist()) for i in reversed(range(25))][::-1]


# ---- one full tiny run ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tiny_llama_tied, corpus, tmp_path_factory):
    """The CPU recipe made tiny, run through the CLI: (out, overrides, CLI output)."""
    from click.testing import CliRunner

    from mixln_convert.cli import main

    out, sets = tmp_path_factory.mktemp("run") / "out", tiny(tiny_llama_tied, corpus)
    args = ["train", "smollm2-135m-cpu", *(f"--set={s}" for s in sets), "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out, sets, result.output


def test_run_writes_the_output_contract(finished):
    out, sets, output = finished
    recipe = load_recipe("smollm2-135m-cpu", sets)
    assert yaml.safe_load((out / "recipe.yaml").read_text()) == recipe.to_dict()
    # what --resume compares: every recipe key, and the sha256 of the data file's content
    data = Path(recipe.data.train)
    assert json.loads((out / "run.json").read_text()) == {"kind": "training run", "settings": json.loads(json.dumps(
        {**recipe.flat(), f"data {data.resolve()}": hashlib.sha256(data.read_bytes()).hexdigest()}))}
    assert "mixln: 4 steps, 512 tokens" in output and "preln: 4 steps" in output
    for arm, post_ln in (("mixln", 2), ("preln", 0)):
        records = metrics(out, arm)
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        assert all({"step", "tokens", "loss", "lr", "tokens_per_s"} <= r.keys() for r in records)
        assert [r["tokens"] for r in records] == [128, 256, 384, 512]
        for r in records[1::2]:  # steps 2 and 4: evaluation and per-layer gradient norms
            assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
            assert len(r["grad_norm_per_layer"]) == 8 and all(g > 0 for g in r["grad_norm_per_layer"])
        assert "val_loss" not in records[0] and "grad_norm_per_layer" not in records[0]
        summary = json.loads((out / arm / "summary.json").read_text())
        assert summary["arm"] == arm and summary["steps"] == 4 and summary["tokens"] == 512
        assert summary["final_val_loss"] == records[-1]["val_loss"] and summary["post_ln_layers"] == post_ln
        assert summary["wall_time_s"] > 0 and summary["source"]
        # keep_checkpoints: 1 in the CPU recipe; the last step writes final/, not a checkpoint
        assert [p.name for p in (out / arm / "checkpoints").iterdir()] == ["step-2"]
    assert json.loads((out / "mixln" / "summary.json").read_text())["source"] == str(out / "mixln" / "converted")


def test_final_folder_is_the_trained_model(finished):
    from transformers import AutoModelForCausalLM

    from mixln_convert.evaluation.perplexity import evaluate_perplexity
    from mixln_convert.surgery.loading import load_tokenizer
    from mixln_convert.data import load_splits, windows

    out, sets, _ = finished
    recipe = load_recipe(out / "recipe.yaml")
    stream = load_splits(recipe.data, load_tokenizer(recipe.source), 1).validation
    validation = windows(stream, recipe.seq_len, "validation")
    for arm, kind in (("mixln", "mixln_llama"), ("preln", "llama")):
        model = AutoModelForCausalLM.from_pretrained(out / arm / "final")
        assert model.config.model_type == kind
        assert model._no_split_modules == {type(model.model.layers[0]).__name__}  # what FSDP wraps
        loss = evaluate_perplexity(model, torch.from_numpy(validation.astype("int64")), 2, progress=False).loss
        assert loss == pytest.approx(json.loads((out / arm / "summary.json").read_text())["final_val_loss"], abs=1e-5)


def test_existing_run_is_not_overwritten(finished, cli):
    out, sets, _ = finished
    before = (out / "mixln" / "metrics.jsonl").read_text()
    recipe = "smollm2-135m-cpu"
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", out)
    assert result.exit_code == 1 and "--resume continues the training run it holds" in result.output
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--set=optim.lr=1e-2", "--out", out, "--resume")
    assert result.exit_code == 1 and "started with optim.lr 3e-05, not 0.01" in result.output
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", out, "--resume")  # finished: nothing to do
    assert result.exit_code == 0 and (out / "mixln" / "metrics.jsonl").read_text() == before


# ---- reliability ----------------------------------------------------------------------------


def test_a_refused_run_leaves_the_empty_out_it_was_given_empty(converted, corpus, cli, tmp_path):
    """A source that cannot be converted is refused after the run has begun writing: what it wrote
    goes, the user's folder stays, and the corrected run can use it."""
    out = tmp_path / "run"
    out.mkdir()
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(converted, corpus)), "--out", out)
    assert result.exit_code == 1 and "already a Mix-LN checkpoint" in result.output
    assert out.is_dir() and list(out.iterdir()) == []


def test_a_source_with_a_damaged_record_is_refused_before_the_run_claims_its_folder(tiny_llama, corpus, cli,
                                                                                     tmp_path):
    """The records a trained arm's card carries on are read before any work: a damaged one is one line naming
    the source's config.json and the key, and --out is not made."""
    source = tmp_path / "source"
    shutil.copytree(tiny_llama, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "pruned": [{"removed_layers": "6"}]}))
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(source, corpus)), "--out",
                 tmp_path / "run")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"{source / 'config.json'}: pruned[0].removed_layers: must be a list of numbers" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["converted-source", "too-little-text", "accelerate-fsdp-config"])
def test_a_refusal_after_the_claim_leaves_nothing_and_the_corrected_run_goes(case, converted, tiny_llama_tied, corpus,
                                                                           cli, tmp_path, monkeypatch):
    """Each check that can refuse a run once it holds --out (a folder absent, under a folder absent too):
    the refusal leaves nothing, so the corrected command is not refused as 'exists and is not empty'."""
    out = tmp_path / "new" / "run"
    short = tmp_path / "short.txt"
    short.write_text("too few words")
    bad = {"converted-source": tiny(converted, corpus), "too-little-text": tiny(tiny_llama_tied, short),
           "accelerate-fsdp-config": tiny(tiny_llama_tied, corpus)}[case]
    with monkeypatch.context() as env:
        if case == "accelerate-fsdp-config":
            env.setenv("ACCELERATE_USE_FSDP", "true")
        result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in bad), "--out", out)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "new").exists()
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(tiny_llama_tied, corpus, steps=1)),
                 "--out", out, "--arm", "preln")
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.joinpath("new").iterdir()] == ["run"]  # no lock file left beside it


@pytest.mark.parametrize("command", ["demo", "sweep", "study"])
def test_an_accelerate_fsdp_launch_is_refused_before_a_run_folder_is_claimed(command, tiny_llama_tied, cli, tmp_path,
                                                                           monkeypatch):
    """A sweep refused this only after its first stage had finished, leaving a folder a corrected rerun called
    'not empty'."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    out = tmp_path / "out"
    args = {"demo": ["demo", "--source", tiny_llama_tied], "sweep": ["sweep", tiny_llama_tied, "--alphas", "0.25"],
            "study": ["study", tiny_llama_tied]}[command]
    result = cli(*args, "--out", out)
    assert result.exit_code == 1 and "the trainer shards the model itself" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_two_runs_into_one_out_at_once_train_it_once(cache, tiny_llama_tied, corpus, tmp_path_factory):
    """Two real processes started together on one --out (a cold token cache, then a warm one): one trains,
    the other is refused in one line naming the folder (and the process holding it, while it does: on 2 busy
    cores a warm run can finish before the second process has imported torch, which then finds the folder
    trained); every step is written once."""
    caches = tmp_path_factory.getbasetemp() / "concurrent-cache"  # the warm case finds the cold case's tokens
    tmp_path = tmp_path_factory.mktemp(cache)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mixln_convert.cli", "train", "smollm2-135m-cpu",
           *(f"--set={s}" for s in tiny(tiny_llama_tied, corpus, steps=6)), "--out", str(out), "--arm", "preln"]
    env = {**_env(), "MIXLN_CONVERT_CACHE": str(caches)}
    runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, err in results if code == 1).strip().splitlines()
    held, trained = (f"--out {out}: in use by another mixln-convert run (pid ",
                     f"--out {out}: exists and is not empty; --resume continues the training run it holds")
    assert len(refused) == 1 and (held in refused[0] or trained in refused[0]), refused
    assert [r["step"] for r in metrics(out, "preln")] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_two_converts_into_one_dst_at_once_write_it_once(tiny_llama, tmp_path):
    dst = tmp_path / "dst"
    cmd = [sys.executable, "-m", "mixln_convert.cli", "convert", str(tiny_llama), str(dst), "--strategy", "move"]
    runs = [subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    assert sorted(code for code, _ in results) == [0, 1], results
    refused = next(err for code, err in results if code == 1).strip()
    # the second is refused by the lock while the first writes, or by the folder the first filled
    assert f"{dst}: in use by another mixln-convert run (pid " in refused or "exists and is not empty" in refused, refused
    assert (dst / "config.json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["dst"]


def test_sigkill_then_resume_gives_the_uninterrupted_losses(cli, tiny_llama_tied, corpus, tmp_path):
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=16, checkpoint_interval=4, eval_interval=4, keep_checkpoints=0)
    train(load_recipe(recipe, sets), tmp_path / "whole", arms=("mixln",), progress=False)

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "mixln_convert.cli", "train", str(recipe), *(f"--set={s}" for s in sets),
           "--out", str(out), "--arm", "mixln"]
    log = (tmp_path / "stderr.txt").open("w+")  # a pipe nobody reads would fill and block the child
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=log)
    deadline, steps = time.time() + 180, []
    while time.time() < deadline and proc.poll() is None:  # kill once a step after a checkpoint is logged
        steps = [int(p.name[5:]) for p in (out / "mixln" / "checkpoints").glob("step-*")]
        logged = (out / "mixln" / "metrics.jsonl").read_text().split("\n")[:-1] if steps else []
        if steps and logged and json.loads(logged[-1])["step"] > max(steps):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, (log.seek(0), log.read()[-2000:])
    assert steps and max(steps) < 16 and not (out / "mixln" / "final").exists()

    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", out, "--arm", "mixln", "--resume")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "mixln" / "summary.json").read_text())["resumed_from_step"] == max(steps)
    assert_same_curve(metrics(out, "mixln"), metrics(tmp_path / "whole", "mixln"), tol=1e-6)


def test_a_heal_killed_inside_train_resumes_with_train(cli, tiny_llama_tied, corpus, tmp_path):
    """`train --resume` continues the Mix-LN arm's heal from its last checkpoint, to the uninterrupted heal."""
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=2, **{"heal.tokens": 16 * 2 * 32, "heal.seq_len": 32,
                                                     "heal.batch_size": 2, "heal.checkpoint_interval": 3})
    train(load_recipe(recipe, sets), tmp_path / "whole", arms=("mixln",), progress=False)
    out = tmp_path / "killed"
    work = out / "mixln" / ".healed.heal"
    cmd = [sys.executable, "-m", "mixln_convert.cli", "train", recipe, *(f"--set={s}" for s in sets), "--out", str(out),
           "--arm", "mixln"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and not list(work.glob("step-*.pt")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and list(work.glob("step-*.pt")) and not (out / "mixln" / "healed").exists()
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", out, "--arm", "mixln", "--resume")
    assert result.exit_code == 0, result.output
    healed = [(out / "mixln" / "healed" / "heal_metrics.jsonl"), tmp_path / "whole" / "mixln" / "healed" / "heal_metrics.jsonl"]
    a, b = ([{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in f.read_text().splitlines()]
            for f in healed)
    assert a == b and len(a) == 17 and not work.exists()
    assert_same_curve(metrics(out, "mixln"), metrics(tmp_path / "whole", "mixln"), tol=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_match_one(tiny_llama_tied, corpus, tmp_path):
    """Both arms, and the Mix-LN arm's heal, shared by two processes: the one-process figures."""
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=6, global_batch_size=8, max_tokens=6 * 8 * 32,
                **{"heal.tokens": 6 * 2 * 32, "heal.seq_len": 32, "heal.batch_size": 2})
    train(load_recipe(recipe, sets), tmp_path / "one", progress=False)
    # accelerate launch --cpu starts one process without MPI; torchrun + ACCELERATE_USE_CPU is the gloo setup.
    # Both arms: the second one must find the process group the first one used still alive.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           "-m", "mixln_convert.cli", "train", str(recipe), *(f"--set={s}" for s in sets),
           "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, env={**_env(), "ACCELERATE_USE_CPU": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for arm in ("mixln", "preln"):
        assert json.loads((tmp_path / "two" / arm / "summary.json").read_text())["processes"] == 2
        assert_same_curve(metrics(tmp_path / "two", arm), metrics(tmp_path / "one", arm), tol=1e-5)
    healed = [json.loads((tmp_path / run / "mixln" / "healed" / "config.json").read_text())["mixln_provenance"]["heal"]
              for run in ("two", "one")]
    assert [h["processes"] for h in healed] == [2, 1]
    assert healed[0]["relative_error"] == pytest.approx(healed[1]["relative_error"], rel=1e-5)


def test_nonfinite_loss_stops_naming_the_step(cli, tiny_llama_tied, corpus, tmp_path):
    sets = tiny(tiny_llama_tied, corpus, steps=6, checkpoint_interval=1, keep_checkpoints=0, grad_clip=0,
                **{"optim.lr": 1e10, "schedule.warmup_steps": 0})
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in sets),
                 "--out", tmp_path / "out", "--arm", "preln")
    error = result.output.strip().splitlines()[-1]  # the lines before it are progress bars
    assert result.exit_code == 1 and error.startswith("Error: preln: "), result.output
    step = int(re.search(r"(?:loss|grad norm) is -?(?:nan|inf) at step (\d+)", error).group(1))
    last = tmp_path / "out" / "preln" / "checkpoints" / f"step-{step - 1}"
    assert step > 1 and error.endswith(f"(last good checkpoint: {last})") and (last / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "preln" / "final").exists()


def test_nonfinite_message_names_the_first_block_with_nonfinite_gradients(converted):
    from mixln_convert.surgery.loading import load_model
    from mixln_convert.training.loop import nonfinite_blocks

    layers = load_model(converted).model.layers
    norms = [1.0] * len(layers)
    assert nonfinite_blocks(norms, layers) == ""
    norms[1] = norms[3] = math.nan
    assert layers[1].is_post_ln and not layers[3].is_post_ln
    assert nonfinite_blocks(norms, layers) == (f" (non-finite gradients in 2 of {len(layers)} blocks, "
                                               "the first block 1, Post-LN)")


def test_recipe_errors_are_mixln_errors(tmp_path):
    with pytest.raises(MixLNError, match="cannot read the recipe"):
        load_recipe(tmp_path / "missing.yaml")


@pytest.mark.real_model
def test_smollm2_cpu_recipe_runs_on_the_real_model(tmp_path):
    """The shipped CPU recipe as is (source: smollm2, the GGUF; embedded corpus), one heal step, one short step."""
    recipe = load_recipe("smollm2-135m-cpu",
                         ["seq_len=64", "max_tokens=256", "data.eval_tokens=128", "micro_batch_size=2", "heal.tokens=1024"])
    summaries = train(recipe, tmp_path / "run", progress=False)
    assert summaries["mixln"].post_ln_layers == 7 and summaries["preln"].post_ln_layers == 0
    assert summaries["mixln"].heal_tokens == 1024 and (tmp_path / "run" / "mixln" / "healed").is_dir()
    # the calibrated conversion keeps the model usable: perplexity within a few times the original
    assert summaries["mixln"].initial_val_ppl < 4 * summaries["preln"].initial_val_ppl


def test_heal_section_heals_the_converted_model_before_training(tiny_llama_tied, corpus, tmp_path):
    sets = tiny(tiny_llama_tied, corpus, steps=2, **{"heal.tokens": 2 * 4 * 32, "heal.seq_len": 32,
                                                     "heal.loss": "residual", "conversion.strategy": "move"})
    summary = train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run",
                    arms=("mixln",), progress=False)["mixln"]
    healed = tmp_path / "run" / "mixln" / "healed"
    assert summary.source == str(healed) and (healed / "heal_metrics.jsonl").is_file()
    heal_record = json.loads((healed / "config.json").read_text())["mixln_provenance"]["heal"]
    assert heal_record["tokens"] == 2 * 4 * 32


def test_three_arms_train_from_one_source_on_identical_data(tiny_llama_tied, corpus, tmp_path, monkeypatch, cli):
    """--arm both --arm lns: Mix-LN, Pre-LN and the LNS retrofit read the same batches in the same
    order; LNS starts where Pre-LN does (the retrofit is exact) and trains differently; analyze and
    compare name the three arms and compare each pair."""
    from mixln_convert.training import trainer

    seen, micro_step = [], trainer._micro_step
    monkeypatch.setattr(trainer, "_micro_step", lambda run, batch, last: seen.append(batch.clone()) or micro_step(
        run, batch, last))
    out = tmp_path / "run"
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(tiny_llama_tied, corpus)),
                 "--arm", "both", "--arm", "lns", "--out", out)
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.stdout.strip().splitlines()] == ["mixln", "preln", "lns"]
    per_arm = len(seen) // 3
    assert len(seen) == 3 * per_arm == 3 * 4 * 2  # 4 steps of 2 micro-batches each
    for arm in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(seen[:per_arm], seen[arm * per_arm:(arm + 1) * per_arm]))
    summaries = {arm: json.loads((out / arm / "summary.json").read_text()) for arm in ("mixln", "preln", "lns")}
    assert [summaries[arm]["layernorm_scaling"] for arm in ("mixln", "preln", "lns")] == [False, False, True]
    assert summaries["lns"]["source"] == str(out / "lns" / "converted")
    assert summaries["lns"]["initial_val_loss"] == pytest.approx(summaries["preln"]["initial_val_loss"], abs=1e-5)
    assert abs(summaries["lns"]["final_val_loss"] - summaries["preln"]["final_val_loss"]) > 1e-6
    assert json.loads((out / "lns" / "final" / "config.json").read_text())["layernorm_scaling"] is True
    for arm in ("preln", "lns"):
        analyzed = cli("analyze", out / arm / "final", "--out", out / arm / "analysis", "--seq-len", 32,
                       "--max-tokens", 256)
        assert analyzed.exit_code == 0, analyzed.output
    assert json.loads((out / "lns" / "analysis" / "analysis.json").read_text())["layernorm_scaling"] is True
    compared = cli("compare", out, "--out", tmp_path / "report")
    assert compared.exit_code == 0, compared.output
    report = (tmp_path / "report" / "report.md").read_text()
    assert "run/lns, LNS (Pre-LN, block l's norm outputs x 1/sqrt(l)):" in report
    for pair in ("LNS (run/lns)", "Mix-LN (run/mixln)"), ("LNS (run/lns)", "Pre-LN (run/preln)"):
        assert re.search(re.escape(pair[0]) + r" [\d.]+ vs " + re.escape(pair[1]), report), pair
    assert re.search(r"Before training LNS scored ([\d.]+) and Pre-LN \1 \(1\.0000x", report)
    deep_blocks = next(line for line in report.splitlines() if line.startswith("- Removing one block of the deeper"))
    assert "run/lns " in deep_blocks and "run/preln " in deep_blocks


@pytest.mark.parametrize("scaled", [True, False])
def test_from_scratch_both_arms_start_from_the_same_initialization(tiny_llama_tied, corpus, tmp_path, scaled):
    """strategy scratch: the Pre-LN arm is not the source as transformers initialized it but the
    same seeded plan at alpha 0, so every tensor the layouts share starts bitwise equal."""
    from safetensors.torch import load_file

    sets = tiny(tiny_llama_tied, corpus, steps=1, **{"conversion.strategy": "scratch",
                                                     "conversion.scaled_init": scaled, "seed": 3})
    summaries = train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run", progress=False)
    pre = tmp_path / "run" / "preln" / "initialized"
    assert summaries["preln"].source == str(pre)
    pre_tensors = load_file(pre / "model.safetensors")
    mix_tensors = load_file(tmp_path / "run" / "mixln" / "converted" / "model.safetensors")
    shared = pre_tensors.keys() & mix_tensors.keys()
    assert len(shared) >= len(pre_tensors) - 2  # the Post-LN blocks' input norms alone are missing
    assert all(torch.equal(pre_tensors[n], mix_tensors[n]) for n in shared)
    source = load_file(tiny_llama_tied / "model.safetensors")
    assert not torch.equal(pre_tensors["model.layers.3.mlp.down_proj.weight"],
                           source["model.layers.3.mlp.down_proj.weight"])
    layers = json.loads((pre / "config.json").read_text())["num_hidden_layers"]
    expected = 0.02 / math.sqrt(2 * layers) if scaled else 0.02
    std = pre_tensors["model.layers.3.mlp.down_proj.weight"].std().item()
    assert std == pytest.approx(expected, rel=0.1)
    assert json.loads((pre / "config.json").read_text())["post_ln_layers"] == 0


def _as_if_killed_after(run: Path, arm: str, step: int) -> None:
    """Make the finished ``run`` look killed a while after ``step``: no summary or final model, and
    metrics.jsonl ending in a line cut short."""
    folder = run / arm
    (folder / "summary.json").unlink()
    shutil.rmtree(folder / "final")
    kept = [line for line in (folder / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= step + 1]
    (folder / "metrics.jsonl").write_text("\n".join(kept) + '\n{"step": ' + str(step + 2) + ', "lo')


def test_resume_skips_a_damaged_checkpoint_and_a_cut_metrics_line(cli, tiny_llama_tied, corpus, tmp_path):
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=12, checkpoint_interval=4, eval_interval=4, keep_checkpoints=0)
    train(load_recipe(recipe, sets), tmp_path / "whole", arms=("mixln",), progress=False)
    legacy = tmp_path / "legacy"  # checkpoints saved before they carried checksums still resume
    shutil.copytree(tmp_path / "whole", legacy)
    _as_if_killed_after(legacy, "mixln", 8)
    for checksums in (legacy / "mixln" / "checkpoints").glob("step-*/mixln-checksums.json"):
        checksums.unlink()
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", legacy, "--arm", "mixln", "--resume")
    assert result.exit_code == 0 and "step-8 has no mixln-checksums.json" in result.stderr, result.output
    assert json.loads((legacy / "mixln" / "summary.json").read_text())["resumed_from_step"] == 8

    run = tmp_path / "damaged"
    shutil.copytree(tmp_path / "whole", run)
    _as_if_killed_after(run, "mixln", 8)
    shard = run / "mixln" / "checkpoints" / "step-8" / "model.safetensors"
    data = shard.read_bytes()  # damaged in place: its second half zeroed, its size kept (it would still load)
    shard.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    shutil.copytree(run / "mixln" / "checkpoints" / "step-4", run / "mixln" / "checkpoints" / "step-4.bak")  # not one

    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", run, "--arm", "mixln", "--resume")
    assert result.exit_code == 0, result.output
    assert "step-8 is damaged (model.safetensors is not the file that was saved)" in result.stderr
    assert json.loads((run / "mixln" / "summary.json").read_text())["resumed_from_step"] == 4
    assert_same_curve(metrics(run, "mixln"), metrics(tmp_path / "whole", "mixln"), tol=1e-6)

    summary = run / "mixln" / "summary.json"  # a finished arm's summary edited: refused naming file and key
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_val_ppl": "low"}))
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", run, "--arm", "mixln", "--resume")
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert f"{summary}: final_val_ppl: must be a number > 0" in errors[0] and "train the mixln arm again" in errors[0]

    _as_if_killed_after(run, "mixln", 8)  # now every checkpoint is damaged: a one-line refusal
    shutil.rmtree(run / "mixln" / "checkpoints" / "step-4")
    shard.write_bytes(shard.read_bytes()[:100])
    result = cli("train", recipe, *(f"--set={s}" for s in sets), "--out", run, "--arm", "mixln", "--resume")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "step-8: damaged, and no earlier checkpoint loads" in errors[0], result.stderr


def test_checkpoint_damage_checks_every_size_before_reading_any_file(tmp_path, monkeypatch):
    from mixln_convert.training import trainer

    checkpoint = tmp_path / "step-4"
    (checkpoint / "sub").mkdir(parents=True)
    for name, size in (("model.safetensors", 4096), ("optimizer.bin", 2048), ("sub/rng.pkl", 64)):
        (checkpoint / name).write_bytes(os.urandom(size))
    (checkpoint / trainer.CHECKSUMS).write_text(json.dumps(trainer._file_digests(checkpoint)))
    assert trainer._damage(checkpoint) is None
    model = checkpoint / "model.safetensors"
    saved = model.read_bytes()
    model.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))  # one bit flipped, size kept: found by its hash
    assert trainer._damage(checkpoint) == "model.safetensors is not the file that was saved"
    model.write_bytes(saved)

    optimizer = checkpoint / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # truncated: found by its size, no file hashed
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "file_sha256", lambda path: pytest.fail(f"hashed {path} before comparing sizes"))
        assert trainer._damage(checkpoint) == "optimizer.bin is not the file that was saved"
    optimizer.unlink()
    assert trainer._damage(checkpoint) == "optimizer.bin is missing"
    (checkpoint / "extra.bin").write_bytes(b"x")
    assert trainer._damage(checkpoint) == "extra.bin was not saved there"


@pytest.mark.parametrize("record, damage", [
    ("{", "mixln-checksums.json is unreadable"),
    ("[]", "mixln-checksums.json is unreadable"),
    ('{"model.safetensors": 4}', "mixln-checksums.json: model.safetensors: not a file's size and sha256 "
                                 "(not a JSON object)"),
    ('{"model.safetensors": {"bytes": 4}}', "mixln-checksums.json: model.safetensors: not a file's size and sha256 "
                                            "(missing sha256)"),
    ('{"model.safetensors": {"bytes": "4", "sha256": "0"}}',
     "mixln-checksums.json: model.safetensors.bytes: must be an integer in [0, 2^63), got '4'"),
    ('{"model.safetensors": {"bytes": 4, "sha256": null}}',
     "mixln-checksums.json: model.safetensors.sha256: must be a string, got None"),
])
def test_a_damaged_checksum_record_skips_to_the_checkpoint_before_it(record, damage, tmp_path):
    from types import SimpleNamespace

    from mixln_convert.training import trainer

    loaded = []
    accelerator = SimpleNamespace(is_main_process=True, num_processes=1, load_state=loaded.append,
                                  wait_for_everyone=lambda: None)
    run = SimpleNamespace(accelerator=accelerator, sharded=False)
    for step in (4, 8):
        checkpoint = tmp_path / "checkpoints" / f"step-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "model.safetensors").write_bytes(os.urandom(64))
        (checkpoint / trainer.CHECKSUMS).write_text(json.dumps(trainer._file_digests(checkpoint), indent=1) + "\n")
    step_8 = tmp_path / "checkpoints" / "step-8"
    assert json.loads((step_8 / trainer.CHECKSUMS).read_text())["model.safetensors"] == {
        "bytes": 64, "sha256": hashlib.sha256((step_8 / "model.safetensors").read_bytes()).hexdigest()}
    (step_8 / trainer.CHECKSUMS).write_text(record)
    assert trainer._damage(step_8) == damage
    with pytest.warns(Warning, match=re.escape(f"{step_8} is damaged ({damage})")):
        assert trainer._restore(run, tmp_path) == 4
    assert loaded == [tmp_path / "checkpoints" / "step-4"]

    (tmp_path / "checkpoints" / "step-4" / trainer.CHECKSUMS).write_text(record)  # none loads: refused
    with pytest.warns(Warning), pytest.raises(MixLNError, match="step-8: damaged, and no earlier checkpoint loads"):
        trainer._restore(run, tmp_path)


def test_a_run_with_a_heal_opens_each_checkpoint_once(tiny_llama_tied, corpus, tmp_path, monkeypatch):
    """One train run (convert, heal, both arms): the source and the converted model are each
    opened and validated once, and each tokenizer is loaded once."""
    from transformers import AutoTokenizer

    from mixln_convert.io import loader

    loader._open.cache_clear()
    opened, tokenizers = [], []
    init, from_pretrained = loader.FolderCheckpoint.__init__, AutoTokenizer.from_pretrained.__func__

    def counting_init(self, path):
        opened.append(Path(path).name)
        init(self, path)

    def counting_tokenizer(cls, path, *args, **kwargs):
        tokenizers.append(Path(path).name)
        return from_pretrained(cls, path, *args, **kwargs)

    monkeypatch.setattr(loader.FolderCheckpoint, "__init__", counting_init)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counting_tokenizer))
    sets = tiny(tiny_llama_tied, corpus, steps=2, **{"heal.tokens": 256, "heal.seq_len": 32, "heal.batch_size": 2})
    train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run", progress=False)
    source = tiny_llama_tied.name
    assert sorted(opened) == sorted([source, "converted", "healed"]), opened
    assert sorted(tokenizers) == sorted([source, "converted"]), tokenizers


def _launch_two(recipe: str, sets: list[str], out: Path, *extra: str, **popen) -> list[str]:
    """The command that trains on two CPU processes (gloo): torchrun with accelerate's CPU flag."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
            "-m", "mixln_convert.cli", "train", recipe, *(f"--set={s}" for s in sets), "--out", str(out), *extra]


def test_fsdp_on_two_cpu_processes_trains_both_arms_like_one_process(tiny_llama_tied, corpus, tmp_path):
    """The sharding GPUs use (FSDP2, each arm wrapping its own blocks), over gloo: both arms in one
    launch (an accelerate FSDP plugin kept from the Mix-LN arm failed the Pre-LN one), the same
    losses as one unsharded process, sharded checkpoints, a final folder that loads."""
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=6, global_batch_size=8, max_tokens=6 * 8 * 32, checkpoint_interval=3,
                **{"heal.tokens": 6 * 2 * 32, "heal.seq_len": 32, "heal.batch_size": 2})
    train(load_recipe(recipe, sets), tmp_path / "one", progress=False)
    done = subprocess.run(_launch_two(recipe, [*sets, "fsdp=true"], tmp_path / "two"),
                          env={**_env(), "ACCELERATE_USE_CPU": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for arm in ("mixln", "preln"):
        assert json.loads((tmp_path / "two" / arm / "summary.json").read_text())["processes"] == 2
        assert_same_curve(metrics(tmp_path / "two", arm), metrics(tmp_path / "one", arm), tol=1e-4)
        shards = sorted(p.name for p in (tmp_path / "two" / arm / "checkpoints" / "step-3").glob("*.distcp"))
        assert shards == ["__0_0.distcp", "__1_0.distcp"]
        from mixln_convert.surgery.loading import load_model

        trained, reference = load_model(tmp_path / "two" / arm / "final"), load_model(tmp_path / "one" / arm / "final")
        for (name, a), (_, b) in zip(trained.state_dict().items(), reference.state_dict().items()):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=name)
    # the Mix-LN arm's heal, sharded as the run trains (the one-process run's is not)
    healed = [json.loads((tmp_path / run / "mixln" / "healed" / "config.json").read_text())["mixln_provenance"]["heal"]
              for run in ("two", "one")]
    assert [h["processes"] for h in healed] == [2, 1]
    assert healed[0]["relative_error"] == pytest.approx(healed[1]["relative_error"], rel=1e-4)


def _kill_every_process_of(marker: str) -> None:
    """SIGKILL every process whose command line holds ``marker``, at once."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile
            pass


def test_fsdp_killed_then_resumed_gives_the_uninterrupted_losses(cli, tiny_llama_tied, corpus, tmp_path):
    recipe = "smollm2-135m-cpu"
    sets = tiny(tiny_llama_tied, corpus, steps=12, global_batch_size=8, max_tokens=12 * 8 * 32, checkpoint_interval=4,
                eval_interval=4, keep_checkpoints=0, fsdp="true")
    env = {**_env(), "ACCELERATE_USE_CPU": "1"}
    whole = subprocess.run(_launch_two(recipe, sets, tmp_path / "whole", "--arm", "mixln"), env=env,
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "killed"
    log = (tmp_path / "stderr.txt").open("w+")
    proc = subprocess.Popen(_launch_two(recipe, sets, out, "--arm", "mixln"), env=env, stdout=subprocess.DEVNULL,
                            stderr=log)
    deadline, steps = time.time() + 240, []
    while time.time() < deadline and proc.poll() is None:  # kill every process once a step after a checkpoint is logged
        steps = [int(p.name[5:]) for p in (out / "mixln" / "checkpoints").glob("step-*")]
        logged = (out / "mixln" / "metrics.jsonl").read_text().split("\n")[:-1] if steps else []
        if steps and logged and json.loads(logged[-1])["step"] > max(steps):
            break
        time.sleep(0.02)
    _kill_every_process_of(str(out))  # torchrun starts its workers in sessions of their own
    proc.wait()
    assert steps and max(steps) < 12 and not (out / "mixln" / "final").exists(), (log.seek(0), log.read()[-2000:])
    resumed = subprocess.run(_launch_two(recipe, sets, out, "--arm", "mixln", "--resume"), env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warnings = [line for line in resumed.stderr.splitlines() if "warning" in line]
    assert json.loads((out / "mixln" / "summary.json").read_text())["resumed_from_step"] == max(steps), warnings
    assert_same_curve(metrics(out, "mixln"), metrics(tmp_path / "whole", "mixln"), tol=1e-6)


def test_fsdp_needs_several_processes(cli, tiny_llama_tied, corpus, tmp_path):
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(tiny_llama_tied, corpus, fsdp="true")),
                 "--out", tmp_path / "out")
    assert result.exit_code == 1 and "fsdp: true shards over several processes" in result.output
    assert not (tmp_path / "out").exists()


def test_an_accelerate_fsdp_config_is_refused_for_the_trainers_own(cli, tiny_llama_tied, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    result = cli("train", "smollm2-135m-cpu", *(f"--set={s}" for s in tiny(tiny_llama_tied, corpus)),
                 "--out", tmp_path / "out")
    assert result.exit_code == 1 and "the trainer shards the model itself" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_bf16_runs_convert_heal_and_both_arms(tiny_llama_tied, corpus, tmp_path):
    """precision: bf16 end to end on CPU (autocast, fp32 masters): the heal follows it, every figure is finite."""
    sets = tiny(tiny_llama_tied, corpus, steps=3, precision="bf16", **{"heal.tokens": 2 * 4 * 32, "heal.seq_len": 32})
    summaries = train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "run", progress=False)
    heal_record = json.loads((tmp_path / "run" / "mixln" / "healed" / "config.json").read_text())
    assert heal_record["mixln_provenance"]["heal"]["dtype"] == "bf16"
    for arm, summary in summaries.items():
        assert summary.precision == "bf16"
        assert all(math.isfinite(loss) for loss in (summary.initial_val_loss, summary.final_val_loss))
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in metrics(tmp_path / "run", arm))
        from safetensors.torch import load_file

        masters = load_file(tmp_path / "run" / arm / "checkpoints" / "step-2" / "model.safetensors")
        assert {t.dtype for t in masters.values()} == {torch.float32}
    # the next run in this process chooses its own precision (accelerate's state is per process)
    fp32 = train(load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus, steps=1)), tmp_path / "fp32",
                 arms=("preln",), progress=False)
    assert fp32["preln"].precision == "no"


@pytest.mark.parametrize("key", ["activation_checkpointing", "compile"])
def test_speed_and_memory_levers_keep_the_losses(tiny_llama_tied, corpus, tmp_path, key):
    """Recomputing the blocks' activations, or compiling each block, trains the same model."""
    sets = tiny(tiny_llama_tied, corpus, steps=2, eval_interval=100, checkpoint_interval=100)
    plain = train(load_recipe("smollm2-135m-cpu", sets), tmp_path / "plain", arms=("mixln",), progress=False)
    lever = train(load_recipe("smollm2-135m-cpu", [*sets, f"{key}=true"]), tmp_path / "lever", arms=("mixln",),
                  progress=False)
    tol = 1e-6 if key == "activation_checkpointing" else 1e-4  # compiled kernels may fuse in another order
    assert_same_curve(metrics(tmp_path / "lever", "mixln"), metrics(tmp_path / "plain", "mixln"), tol=tol)
    assert lever["mixln"].final_val_loss == pytest.approx(plain["mixln"].final_val_loss, abs=tol)


@pytest.mark.parametrize("arms, said", [
    ("mixln", "must be a list of names, got 'mixln'"),
    (("postln",), r"unknown arm 'postln' \(choose from mixln, preln, lns\)"),
    ((), "give 1 to 256 names, got 0"),
    (("preln", "preln"), "'preln' is given twice")])
def test_an_api_callers_arms_are_checked_like_the_recipes(arms, said, tiny_llama_tied, corpus, tmp_path):
    """train(arms="mixln") once trained five arms, one per letter; an unknown name trained as Mix-LN."""
    recipe = load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus, steps=2))
    with pytest.raises(MixLNError, match=f"^arms: {said}$"):
        train(recipe, tmp_path / "run", arms=arms, progress=False)
    assert not (tmp_path / "run").exists()


def test_a_warmup_longer_than_the_run_is_said(tiny_llama_tied, corpus, tmp_path):
    """Legal, but the lr never peaks: a huge warmup trained at lr ~0 and changed nothing, exit 0, unsaid."""
    from mixln_convert.errors import MixLNWarning

    recipe = load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus, steps=2, **{"schedule.warmup_steps": 5}))
    with pytest.warns(MixLNWarning, match=r"^schedule.warmup_steps 5 is more than the run's 2 steps: the learning "
                                          r"rate peaks at 0.4 x optim.lr, at the last step$"):
        train(recipe, tmp_path / "long", arms=("preln",), progress=False)
    last = metrics(tmp_path / "long", "preln")[-1]
    assert last["step"] == 2 and last["lr"] == pytest.approx(recipe.optim.lr * 2 / 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixLNWarning)
        train(load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus, steps=2)), tmp_path / "short",
              arms=("preln",), progress=False)
