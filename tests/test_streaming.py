"""Streaming conversion: bounded memory, atomic output under SIGKILL, safe .bin loading."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mixln_convert.errors import MixLNError
from tiny import make_tiny_llama

REPO = Path(__file__).parent.parent
MiB = 2**20
# Peak memory allowed above the conversion's baseline (the process once torch, safetensors and
# the converter are imported) besides one source shard: a tensor in flight (3 MiB here) and
# glibc's slack after freeing buffers (reinit-post, whose fresh layers are buffered, measured
# ~30 MiB above its shard; move ~8 MiB). The source below is 105 MiB in ~19 MiB shards, so a
# conversion that held the whole model would overshoot by ~45 MiB. (At real scale the bound
# is a shard + 1 GiB.)
MARGIN = 40 * MiB

# The peak is VmHWM, this process image's own high-water mark: ru_maxrss would report pytest's
# when larger (Linux carries it over the fork and exec that start a subprocess).
MEASURE = """
import json, sys
from mixln_convert.conversion.converter import convert

def status(field):
    return int(open("/proc/self/status").read().split(field + ":")[1].split()[0]) * 1024

baseline = status("VmRSS")
convert(sys.argv[1], sys.argv[2], progress=False, **json.loads(sys.argv[3]))
print(json.dumps({"baseline": baseline, "peak": status("VmHWM")}))
"""

# Runs a conversion that SIGKILLs itself once its first output shard is on disk.
KILLED = """
import os, signal, sys
from mixln_convert.io import writer
from mixln_convert.conversion.converter import convert

write = writer.write_safetensors
def write_once_then_die(path, tensors, metadata):
    if path.name != "shard-00000.partial":
        os.kill(os.getpid(), signal.SIGKILL)
    write(path, tensors, metadata)
writer.write_safetensors = write_once_then_die
convert(sys.argv[1], sys.argv[2], strategy="move", max_shard_size="100KB", progress=False)
"""


def run_python(code: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def shard_sizes(folder: Path) -> list[int]:
    return [p.stat().st_size for p in folder.glob("*.safetensors")]


@pytest.fixture(scope="module")
def big_sharded(tmp_path_factory) -> Path:
    """105 MiB of float32 weights in 6 shards of at most 19 MiB: a whole-model load would show."""
    return make_tiny_llama(tmp_path_factory.mktemp("src") / "big", hidden_size=512, intermediate_size=1536,
                           num_attention_heads=8, num_key_value_heads=8, max_shard_size="20MB")


@pytest.mark.skipif(sys.platform != "linux", reason="reads memory use from /proc")
@pytest.mark.parametrize("options", [dict(strategy="move", alpha=0.25), dict(strategy="move", alpha=0.0),
                                     dict(strategy="reinit-post", alpha=1.0)], ids=["move", "alpha-0", "reinit-post"])
def test_peak_memory_stays_within_one_shard(big_sharded, tmp_path, options):
    largest = max(shard_sizes(big_sharded))
    assert sum(shard_sizes(big_sharded)) > largest + MARGIN + 40 * MiB  # holding the model: 40 MiB over the bound
    result = run_python(MEASURE, big_sharded, tmp_path / "out", json.dumps(options))
    assert result.returncode == 0, result.stderr
    memory = json.loads(result.stdout)
    assert memory["peak"] - memory["baseline"] < largest + MARGIN, (memory, largest)
    assert max(shard_sizes(tmp_path / "out")) < largest + 10_000  # default shard size: the source's largest, + header


def test_shards_follow_max_size_and_the_index_comes_last(tiny_llama_sharded, tmp_path, monkeypatch):
    from mixln_convert.conversion.converter import convert
    from mixln_convert.io import writer

    index_existed = []
    write = writer.write_safetensors

    def watched_write(path, tensors, metadata):
        index_existed.append((path.parent / "model.safetensors.index.json").exists())
        write(path, tensors, metadata)

    monkeypatch.setattr(writer, "write_safetensors", watched_write)
    out = convert(tiny_llama_sharded, tmp_path / "out", strategy="move", max_shard_size="100KB", progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(index_existed) >= 3 and not any(index_existed)
    assert set(index["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    assert max(shard_sizes(out)) < 100_000 + 10_000  # tensors + header


def test_source_tensors_are_copied_file_to_file_unless_changed(tiny_llama, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from mixln_convert.io.loader import open_checkpoint
    from mixln_convert.io.writer import ShardedWriter

    copies = []
    if hasattr(os, "copy_file_range"):  # Linux: count the kernel copies
        copy = os.copy_file_range
        monkeypatch.setattr(os, "copy_file_range", lambda *args: copies.append(args[2]) or copy(*args))
    source = open_checkpoint(tiny_llama)
    kept, changed = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"
    writer = ShardedWriter(tmp_path, 10**9)
    writer.add(kept, source.stored(kept))
    writer.add(changed, source.get(changed).mul_(2))  # a tensor, not a StoredTensor: written from memory
    writer.close()
    written = load_file(tmp_path / "model.safetensors")
    assert torch.equal(written[kept], source.get(kept))
    assert torch.equal(written[changed], 2 * source.get(changed))
    assert sum(copies) == (source.get(kept).nbytes if hasattr(os, "copy_file_range") else 0)  # the kept one alone


def test_killed_conversion_leaves_no_output_and_the_next_run_cleans_up(tiny_llama_sharded, tmp_path):
    from mixln_convert.conversion.converter import convert

    dst = tmp_path / "dst"
    result = run_python(KILLED, tiny_llama_sharded, dst)
    assert result.returncode == -signal.SIGKILL, result.stderr
    # its temporary folder, and the lock file it held (the kernel dropped the lock with the process)
    lock, tmp = sorted(tmp_path.iterdir())
    assert not dst.exists() and lock.name == ".dst.lock" and tmp.name.startswith(".dst.tmp-")
    assert lock.read_text().startswith("another mixln-convert run (pid ")  # a lock, not locked: the next run takes it
    assert (tmp / "shard-00000.partial").is_file()  # it was killed midway, after one shard
    convert(tiny_llama_sharded, dst, strategy="move", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["dst"]


def test_a_second_writer_of_a_folder_being_written_is_refused_and_leaves_the_first_alone(tmp_path):
    pytest.importorskip("fcntl")
    from mixln_convert.io.atomic import atomic_output_dir

    with atomic_output_dir(tmp_path / "dst") as running:
        with pytest.raises(MixLNError, match=rf"^{tmp_path / 'dst'}: in use by another mixln-convert run \(pid {os.getpid()} on .*: writing dst\)"):
            with atomic_output_dir(tmp_path / "dst"):
                pass
        assert running.is_dir()
    assert list(tmp_path.iterdir()) == [tmp_path / "dst"]


class RunsCode:
    """Pickles as a call of ``os.system``: what a malicious .bin would do on plain unpickling."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("pickler", ["torch.save", "pickle.dump"])
def test_bin_with_code_in_its_pickle_is_refused(tiny_llama, tmp_path, cli, pickler):
    import pickle
    import shutil

    src, marker = tmp_path / "src", tmp_path / "code-ran"
    src.mkdir()
    shutil.copy(tiny_llama / "config.json", src)
    state = {"model.embed_tokens.weight": torch.zeros(4, 4), "payload": RunsCode(marker)}
    with open(src / "pytorch_model.bin", "wb") as f:
        if pickler == "torch.save":
            torch.save(state, f)
        else:
            pickle.dump(state, f)
    result = cli("convert", src, tmp_path / "out", "--strategy", "move")
    assert result.exit_code == 1 and "pytorch_model.bin" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not marker.exists() and not (tmp_path / "out").exists()
    if pickler == "torch.save":  # the zip format is unpickled, with weights_only: the call is named
        assert f"refused to load: its pickle calls {os.system.__module__}.system" in result.output


def test_a_refusal_names_the_holder_even_while_it_is_still_writing_its_name(tmp_path):
    """The holder locks, then writes who it is: a second run that looks in between read an empty file and said
    'another process' (seen in CI, two runs started together)."""
    pytest.importorskip("fcntl")
    from mixln_convert.io.atomic import hold

    lock, locked = tmp_path / ".dst.lock", tmp_path / "locked"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, time
fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
open({str(locked)!r}, "w").close()
time.sleep(0.3)
os.write(fd, b"another mixln-convert run (pid 4242 on host: testing)")
time.sleep(30)
"""])
    try:
        deadline = time.time() + 30
        while not locked.exists() and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(MixLNError, match=r"in use by another mixln-convert run \(pid 4242 on host: testing\)"):
            with hold(tmp_path / "dst", "dst", "testing"):
                pass
    finally:
        holder.kill()
        holder.wait()


def run_cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mixln_convert.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=600)


def refused(done: subprocess.CompletedProcess, fragment: str) -> bool:
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    return done.returncode == 1 and len(errors) == 1 and fragment in errors[0] and "Traceback" not in done.stderr


def test_a_lock_file_that_is_a_symlink_is_refused_and_what_it_points_to_is_kept(tiny_llama, tmp_path):
    """With .OUT.lock a symlink to a user's file, export truncated that file, wrote its holder line into it
    and unlinked the link."""
    pytest.importorskip("fcntl")
    mine, link = tmp_path / "mine.txt", tmp_path / ".plain.lock"
    mine.write_text("my notes\n")
    link.symlink_to(mine)
    done = run_cli("export", tiny_llama, tmp_path / "plain", "--to", "llama")
    assert refused(done, f"{tmp_path / 'plain'}: its lock file {link} is a symlink"), done.stderr
    assert mine.read_text() == "my notes\n" and link.is_symlink() and link.resolve() == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plain.lock", "mine.txt"]


def test_an_input_named_as_the_lock_file_is_refused_and_kept(tiny_llama, tmp_path):
    """Calibration text named .conv.lock for `convert SRC conv`, a recipe named .run.lock for `train --out run`:
    the run locked, emptied and, at its end, deleted that input."""
    pytest.importorskip("fcntl")
    text = " ".join(f"A short sentence about item number {i}." for i in range(400))
    calibration = tmp_path / ".conv.lock"
    calibration.write_text(text)
    done = run_cli("convert", tiny_llama, tmp_path / "conv", "--calibration-data", calibration)
    assert refused(done, f"its lock file {calibration}: is the input --calibration-data"), done.stderr
    recipe, data = tmp_path / ".run.lock", tmp_path / "data.txt"
    recipe.write_text(f"source: {tiny_llama}\nseq_len: 32\nmicro_batch_size: 2\nglobal_batch_size: 2\n"
                      "max_tokens: 128\nheal:\n  tokens: 0\n")
    data.write_text(text)
    done = run_cli("train", recipe, f"--set=data.train={data}", "--set=data.validation=null", "--out", tmp_path / "run")
    assert refused(done, f"--out {tmp_path / 'run'}: its lock file {recipe} exists and is not a mixln-convert lock"), \
        done.stderr
    assert calibration.read_text() == text and recipe.read_text().startswith(f"source: {tiny_llama}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".conv.lock", ".run.lock", "data.txt"]


def test_a_lock_left_by_a_killed_holder_is_taken_over(tiny_llama, tmp_path):
    """The kernel drops a SIGKILLed holder's lock: its .OUT.lock (its holder line in it) is taken over by the
    next run to OUT, and removed when that run ends."""
    pytest.importorskip("fcntl")
    holding = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from mixln_convert.io.atomic import hold
with hold(Path({str(tmp_path / "dst")!r}), "dst", "holding"):
    print("held", flush=True)
    time.sleep(600)
"""], env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline() == "held\n"
        busy = run_cli("convert", tiny_llama, tmp_path / "dst", "--strategy", "move")
        assert refused(busy, f"in use by another mixln-convert run (pid {holding.pid} on "), busy.stderr
    finally:
        holding.kill()
        holding.wait()
    assert (tmp_path / ".dst.lock").read_text().startswith("another mixln-convert run")
    done = run_cli("convert", tiny_llama, tmp_path / "dst", "--strategy", "move")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["dst"]
