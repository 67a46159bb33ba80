"""The recipe key ``trackers``: accelerate's trackers (tensorboard, wandb, mlflow) or none, default tensorboard
where installed; each arm a run named after it, its config the resolved recipe; an unknown name or a tracker
not installed refused in one line before any output exists. Offline: TensorBoard's own event reader."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from mixln_convert.workflows.train import train
from mixln_convert.training import load_recipe
from mixln_convert.training.trainer import tracked_config

WORDS = "the of model layer norm residual stream token block attention gradient data step loss value".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(30, 80))) + "."}) + "\n"
                            for _ in range(200)))
    return path


def tiny(source, corpus, **extra) -> list[str]:
    """--set items making the CPU recipe a 4-step run of seq 32 (tests/test_train.py's ``tiny``), no heal."""
    values = {"source": source, "data.train": corpus, "data.validation": "null", "seq_len": 32, "micro_batch_size": 2,
              "global_batch_size": 4, "max_tokens": 4 * 4 * 32, "data.eval_tokens": 256, "precision": "fp32",
              "schedule.warmup_steps": 1, "eval_interval": 2, "checkpoint_interval": 2, "grad_norm_interval": 2,
              "heal.tokens": 0, **extra}
    return [f"{key}={value}" for key, value in values.items()]


def event_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("events.out.tfevents*"))


def test_tensorboard_runs_are_the_arms_and_hold_the_logged_losses(tiny_llama_tied, corpus, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    recipe = load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus))
    assert recipe.trackers == ("tensorboard",)  # the default, where tensorboard is installed, resolved at load
    out = tmp_path / "run"
    train(recipe, out, arms=("preln", "mixln"), progress=False)
    assert yaml.safe_load((out / "recipe.yaml").read_text())["trackers"] == ["tensorboard"]
    runs = EventMultiplexer().AddRunsFromDirectory(str(out)).Runs()  # TensorBoard's run: its folder's path
    for arm in ("preln", "mixln"):
        assert arm in runs, sorted(runs)
        events = EventAccumulator(str(out / arm))
        events.Reload()
        logged = [(e.step, e.value) for e in events.Scalars("loss")]
        records = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert logged == [(r["step"], float(np.float32(r["loss"]))) for r in records] and len(logged) == 4
        assert [e.step for e in events.Scalars("val_loss")] == [2, 4]
        # the run's config: the resolved recipe, flat, as accelerate's TensorBoard tracker stores it
        (hparams,) = (out / arm).glob("*/hparams.yml")
        stored = yaml.safe_load(hparams.read_text())
        assert stored == tracked_config(recipe) and stored["trackers"] == '["tensorboard"]'
        assert stored["source"] == recipe.source and stored["optim.lr"] == recipe.optim.lr


def test_trackers_none_writes_no_event_files(tiny_llama_tied, corpus, tmp_path):
    recipe = load_recipe("smollm2-135m-cpu", tiny(tiny_llama_tied, corpus, trackers="none"))
    assert recipe.trackers == ()
    out = tmp_path / "run"
    train(recipe, out, arms=("preln",), progress=False)
    assert (out / "preln" / "summary.json").is_file() and event_files(out) == []
    assert yaml.safe_load((out / "recipe.yaml").read_text())["trackers"] == []  # what a rerun of it reads as none
    assert load_recipe(out / "recipe.yaml").trackers == ()


@pytest.mark.parametrize("value, message", [
    ("[nosuch]", "trackers: unknown tracker 'nosuch' (choose from tensorboard, wandb, mlflow, none)"),
    ("nosuch", "trackers: unknown tracker 'nosuch'"),
    ("[wandb]", "trackers: wandb is not installed (pip install wandb), or set trackers: none"),
    ("[tensorboard, tensorboard]", "trackers: 'tensorboard' is given twice"),
    ("[tensorboard, none]", "trackers: none logs to no tracker, so it comes alone"),
    ("3", "trackers: must be a list of names, got 3"),
])
def test_a_bad_tracker_is_refused_in_one_line_before_any_output(value, message, cli, tiny_llama_tied, corpus, tmp_path,
                                                                monkeypatch):
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "is_wandb_available", lambda: False)  # as where wandb is not installed
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"trackers: {value}\n")
    sets = [f"--set={item}" for item in tiny(tiny_llama_tied, corpus)]
    result = cli("train", recipe, *sets, "--out", tmp_path / "out")
    assert result.exit_code == 1 and message in result.output, result.output
    assert result.output.strip().startswith(f"Error: {recipe}: "), result.output  # the file that set the key
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "out").exists()
    result = cli("train", "smollm2-135m-cpu", *sets, f"--set=trackers={value}", "--out", tmp_path / "out")
    assert result.exit_code == 1 and message in result.output and f"--set trackers={value}" in result.output
    assert not (tmp_path / "out").exists()
