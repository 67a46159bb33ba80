"""The heal at scale: on every process of a launch (2 CPU processes over gloo = 1), resumed after SIGKILL
exactly, refused when what it continues changed, and fed from a `tokenize` folder."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mixln_convert.conversion.converter import convert
from mixln_convert.data import tokenize
from mixln_convert.errors import MixLNWarning
from mixln_convert.healing import heal

REPO = Path(__file__).parent.parent
SEQ_LEN, BATCH, EVAL_TOKENS = 32, 4, 256
STEPS = 12
# a heal's command line (residual loss, no whole-model perplexity: the tiny model's speed sets the test's)
ARGS = ["--tokens", STEPS * BATCH * SEQ_LEN, "--seq-len", SEQ_LEN, "--batch-size", BATCH, "--eval-tokens",
        EVAL_TOKENS, "--lr", 0.05, "--loss", "residual", "--no-perplexity"]


@pytest.fixture(scope="module", autouse=True)
def one_thread(tmp_path_factory):
    """One thread here and in every subprocess: a resumed heal must do the arithmetic of the one it continues."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("MIXLN_CONVERT_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def moved(tiny_llama, tmp_path_factory):
    return convert(tiny_llama, tmp_path_factory.mktemp("moved") / "out", alpha=0.25, strategy="move", progress=False)


def _command(moved, teacher, out, *extra, processes: int = 1) -> list[str]:
    launch = [sys.executable]
    if processes > 1:  # torchrun with accelerate's CPU flag: the gloo setup `accelerate launch --cpu` makes
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launch += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port", str(port)]
    return [*launch, "-m", "mixln_convert.cli", "heal", str(moved), "--teacher", str(teacher), "--out", str(out),
            *map(str, ARGS), *map(str, extra)]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "ACCELERATE_USE_CPU": "1"}


def _heal(*command_args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(_command(*command_args, **kwargs), env=_env(), capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _records(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "heal_metrics.jsonl").read_text().splitlines()]


def _weights(out: Path) -> dict:
    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def whole(moved, tiny_llama, tmp_path_factory):
    """The uninterrupted one-process heal every other heal here is compared with."""
    out = tmp_path_factory.mktemp("whole") / "healed"
    _heal(moved, tiny_llama, out)
    return out


def test_two_processes_heal_like_one(whole, moved, tiny_llama, tmp_path):
    out = tmp_path / "two"
    _heal(moved, tiny_llama, out, processes=2)
    provenance = json.loads((out / "config.json").read_text())["mixln_provenance"]["heal"]
    assert provenance["processes"] == 2
    two, one = _records(out), _records(whole)
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(STEPS + 1))
    for a, b in zip(two, one):
        assert a.keys() == b.keys()
        for key in ("loss", "lr", "val_relative_error"):
            assert a.get(key, 0) == pytest.approx(b.get(key, 0), rel=1e-4, abs=1e-6), (a["step"], key)
    healed, reference = _weights(out), _weights(whole)
    assert healed.keys() == reference.keys()
    changed = 0
    for name, tensor in healed.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-4, rtol=1e-3, msg=name)  # as train's
        changed += not torch.equal(tensor, _weights(moved)[name])
    assert changed  # the heal moved the Post-LN blocks: the comparison compares something
    assert not list(tmp_path.glob(".two*"))  # no lock, scratch or work folder left


def test_two_sharded_processes_heal_like_one(moved, tiny_llama, tmp_path):
    """FSDP2 (teacher and student sharded per block, as the trainer shards) over gloo: the one-process heal."""
    # a lower lr than ARGS': AdamW's steps of about lr on weights whose gradient is near 0 turn the float noise
    # of another reduction order into lr-sized differences
    kl = ["--loss", "kl", "--checkpoint-interval", 5, "--lr", 0.005]
    _heal(moved, tiny_llama, tmp_path / "one", *kl)
    _heal(moved, tiny_llama, tmp_path / "two", *kl, "--fsdp", processes=2)
    two, one = _records(tmp_path / "two"), _records(tmp_path / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(STEPS + 1))
    for a, b in zip(two, one):
        for key in ("loss", "lr", "grad_norm", "val_relative_error"):
            assert a.get(key, 0) == pytest.approx(b.get(key, 0), rel=1e-4, abs=1e-6), (a["step"], key)
    healed, reference = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert healed.keys() == reference.keys()
    for name, tensor in healed.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-4, rtol=1e-3, msg=name)


def _killed_at(moved, teacher, out, step: int, *extra, processes: int = 1) -> Path:
    """A heal checkpointing every 3 steps, every process of it SIGKILLed once its metrics reach ``step``."""
    work = out.with_name(f".{out.name}.heal")
    proc = subprocess.Popen(_command(moved, teacher, out, "--checkpoint-interval", 3, *extra, processes=processes),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        lines = (work / "heal_metrics.jsonl").read_text().splitlines() if (work / "heal_metrics.jsonl").exists() else []
        if lines and json.loads(lines[-1])["step"] >= step:
            break
        time.sleep(0.01)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):  # torchrun starts its workers in sessions of their own
        try:
            if str(out) in cmdline.read_bytes().decode(errors="replace"):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile
            pass
    proc.wait()
    assert not out.exists() and work.is_dir(), "the heal finished before it was killed"
    return work


@pytest.mark.parametrize("step", [1, 4, 8])
def test_killed_heal_resumes_to_the_uninterrupted_result_exactly(step, whole, moved, tiny_llama, tmp_path, cli):
    out = tmp_path / "healed"
    work = _killed_at(moved, tiny_llama, out, step)
    saved = sorted(int(f.stem[5:]) for f in work.glob("step-*.pt"))
    again = cli("heal", moved, "--teacher", tiny_llama, "--out", out, *ARGS, "--checkpoint-interval", 3)
    if saved:  # refused: only --resume (or --force) continues what a checkpoint holds
        assert again.exit_code == 1 and f"was interrupted at step {saved[-1]} " in again.stderr, again.output
        assert "--resume continues it, --force starts afresh" in again.stderr
        again = cli("heal", moved, "--teacher", tiny_llama, "--out", out, *ARGS, "--checkpoint-interval", 3, "--resume")
    resumed = again
    assert resumed.exit_code == 0, resumed.output
    assert _records(out) == _records(whole)
    healed, reference = _weights(out), _weights(whole)
    assert healed.keys() == reference.keys() and all(torch.equal(healed[k], reference[k]) for k in healed)
    assert not (tmp_path / ".healed.heal").exists()


def test_a_sharded_heal_killed_resumes_to_the_uninterrupted_result(moved, tiny_llama, tmp_path):
    sharded = ["--loss", "kl", "--fsdp"]
    _heal(moved, tiny_llama, tmp_path / "whole", "--checkpoint-interval", 3, *sharded, processes=2)
    out = tmp_path / "healed"
    work = _killed_at(moved, tiny_llama, out, 5, *sharded, processes=2)
    assert list(work.glob("step-*.pt")), "killed before its first checkpoint"
    _heal(moved, tiny_llama, out, "--checkpoint-interval", 3, *sharded, "--resume", processes=2)
    resumed, whole = _records(out), _records(tmp_path / "whole")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    for a, b in zip(resumed, whole):
        for key in ("loss", "lr", "val_relative_error"):
            assert a.get(key, 0) == pytest.approx(b.get(key, 0), rel=1e-6, abs=1e-9), (a["step"], key)
    healed, reference = _weights(out), _weights(tmp_path / "whole")
    for name, tensor in healed.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-6, rtol=1e-6, msg=name)


def test_a_damaged_last_checkpoint_is_skipped_for_the_one_before(whole, moved, tiny_llama, tmp_path, cli):
    out = tmp_path / "healed"
    work = _killed_at(moved, tiny_llama, out, 8)
    saved = sorted(work.glob("step-*.pt"), key=lambda f: int(f.stem[5:]))
    # the last two are kept; a kill between saving one and removing the oldest leaves three (saved first: safe)
    assert len(saved) in (2, 3) and int(saved[-1].stem[5:]) >= 6, saved
    saved[-1].write_bytes(saved[-1].read_bytes()[:100])  # cut short, as a full disk might have left it
    resumed = cli("heal", moved, "--teacher", tiny_llama, "--out", out, *ARGS, "--checkpoint-interval", 3, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert f"{saved[-1]} is damaged" in resumed.stderr
    assert _records(out) == _records(whole)


CHANGES = {  # what a resumed heal must find as it was, and how each is changed
    "teacher": (lambda i: ["--teacher", i["other_teacher"]], "teacher"),
    "tokens": (lambda i: ["--tokens", STEPS * BATCH * SEQ_LEN * 2], "tokens"),
    "lr": (lambda i: ["--lr", 0.01], "lr"),
    "data": (lambda i: ["--data", i["text"]], "data"),
}


@pytest.fixture(scope="module")
def interrupted(moved, tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupted")
    work = _killed_at(moved, tiny_llama, root / "healed", 5)
    text = root / "text.txt"
    text.write_text(" ".join(f"Another sentence, number {i}." for i in range(2000)))
    other = tmp_path_factory.mktemp("other") / "teacher"
    import shutil

    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    return {"out": root / "healed", "work": work, "text": text, "other_teacher": other}


@pytest.mark.parametrize("change", CHANGES)
def test_resume_refuses_what_changed_in_one_line(change, interrupted, moved, tiny_llama, cli):
    make, key = CHANGES[change]
    before = sorted(p.name for p in interrupted["work"].iterdir())
    extra = make(interrupted)
    teacher = tiny_llama if "--teacher" not in extra else extra[1]
    extra = extra[2:] if "--teacher" in extra else extra
    result = cli("heal", moved, "--teacher", teacher, "--out", interrupted["out"], *ARGS, *extra,
                 "--checkpoint-interval", 3, "--resume")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: --resume: "), result.output
    assert f"started with {key} " in lines[0]
    assert sorted(p.name for p in interrupted["work"].iterdir()) == before and not interrupted["out"].exists()


def test_force_starts_an_interrupted_heal_afresh(moved, tiny_llama, tmp_path, whole, cli):
    out = tmp_path / "healed"
    _killed_at(moved, tiny_llama, out, 4)
    done = cli("heal", moved, "--teacher", tiny_llama, "--out", out, *ARGS, "--force")
    assert done.exit_code == 0, done.output
    assert _records(out) == _records(whole) and not (tmp_path / ".healed.heal").exists()


def test_a_refused_heal_leaves_no_work_folder(moved, tiny_llama, tmp_path, cli):
    result = cli("heal", moved, "--teacher", tiny_llama, "--out", tmp_path / "healed", *ARGS, "--lr", 1e30)
    assert result.exit_code == 1 and "the heal diverged" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_tokenized_folder_heals_as_its_text_does(moved, tiny_llama, tmp_path):
    """`--data` a tokenize folder: the same windows as its text, nothing tokenized again; passes over it said."""
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": f"Sentence {i} of a short text about norms and blocks, and "
                                                f"the {i % 7}th residual stream."}) + "\n" for i in range(200)))
    tokens = tmp_path / "tokens"
    tokenize(text, moved, tokens, validation_fraction=0.3, progress=False)
    manifest = json.loads((tokens / "mixln-tokens.json").read_text())
    held = manifest["splits"]["train"]["tokens"]
    budget = 3 * (held // (BATCH * SEQ_LEN) + 1) * BATCH * SEQ_LEN  # more than the data holds: several passes
    settings = dict(tokens=budget, seq_len=SEQ_LEN, batch_size=BATCH, eval_tokens=EVAL_TOKENS, lr=0.05,
                    loss="residual", perplexity=False, progress=False)
    with pytest.warns(MixLNWarning, match=r"passes over them \d"):
        result = heal(moved, tiny_llama, tmp_path / "healed", data=str(tokens), eval_data=str(tokens), **settings)
    assert result.data_passes > 2
    provenance = json.loads((tmp_path / "healed" / "config.json").read_text())["mixln_provenance"]["heal"]
    assert provenance["data_passes"] == result.data_passes
    assert f"; {result.data_passes:.3g} passes over that text: it repeated." in (tmp_path / "healed" / "README.md").read_text()
    from mixln_convert.data import open_tokens
    from mixln_convert.io.loader import open_checkpoint

    train_stream = open_tokens(tokens, open_checkpoint(moved).tokenizer)[0]
    again = heal(moved, tiny_llama, tmp_path / "again", data=train_stream, eval_data=str(tokens), **settings)
    assert again.relative_error == result.relative_error  # the folder read as the stream it holds
