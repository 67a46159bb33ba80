"""The one runner of multi-stage work (workflows/runs.py's Stages), which the demo, sweep and study use:
a stage's result is kept with its sha256, read back on resume instead of running it again, an
interrupted atomic stage leaves nothing, and each stage is timed."""

import pytest

from mixln_convert.errors import MixLNError
from mixln_convert.workflows.runs import STAGE_RESULT, Stages, timed


def test_a_finished_stage_is_read_back_not_run_again(tmp_path):
    calls = []

    def work(folder):
        calls.append(folder)
        (folder / "made.txt").write_text("x")
        return {"figure": 1.5, "rows": [1, 2]}

    first = Stages(resume=False)
    assert first.run("a", tmp_path / "a", work) == {"figure": 1.5, "rows": [1, 2]}
    assert (tmp_path / "a" / "made.txt").is_file() and (tmp_path / "a" / STAGE_RESULT).is_file()
    assert set(first.times) == {"a"} and first.times["a"] >= 0
    again = Stages(resume=True)
    assert again.run("a", tmp_path / "a", work) == {"figure": 1.5, "rows": [1, 2]}
    assert len(calls) == 1 and again.times == {}  # read back: not run, not timed
    assert Stages(resume=False).run("a", tmp_path / "a", work) and len(calls) == 2  # without resume: run again


def test_an_interrupted_atomic_stage_leaves_nothing_and_a_resumed_one_works_in_place(tmp_path):
    def killed(folder):
        (folder / "half.bin").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Stages(resume=False).run("a", tmp_path / "a", killed)
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(KeyboardInterrupt):
        Stages(resume=False).run("b", tmp_path / "b", killed, atomic=False)
    assert (tmp_path / "b" / "half.bin").is_file() and not (tmp_path / "b" / STAGE_RESULT).exists()
    seen = []
    result = Stages(resume=True).run("b", tmp_path / "b", lambda f: seen.append(sorted(p.name for p in f.iterdir()))
                                     or {"done": True}, atomic=False)
    assert result == {"done": True} and seen == [["half.bin"]]  # it finds what it left, as training resumes


def test_an_edited_result_is_refused_in_one_line(tmp_path):
    Stages(resume=False).run("a", tmp_path / "a", lambda folder: {"figure": 1.5})
    result = tmp_path / "a" / STAGE_RESULT
    result.write_text(result.read_text().replace("1.5", "2.5"))
    with pytest.raises(MixLNError, match=f"^{result}: damaged; remove {tmp_path / 'a'} to run this stage again$"):
        Stages(resume=True).run("a", tmp_path / "a", lambda folder: {"figure": 0})


def test_a_damaged_result_or_run_record_is_refused_in_one_line_naming_file_and_key(tmp_path):
    from mixln_convert.workflows.runs import RECORD, claim_run

    Stages(resume=False).run("a", tmp_path / "a", lambda folder: {"figure": 1.5})
    result = tmp_path / "a" / STAGE_RESULT
    result.write_text('{"result": {"figure": 1.5}}')
    with pytest.raises(MixLNError, match=f"^{result}: damaged \\(not a stage's result \\(missing sha256\\)\\); remove "):
        Stages(resume=True).run("a", tmp_path / "a", lambda folder: {"figure": 0})
    out = tmp_path / "run"
    with claim_run(out, "train", {"lr": 1}, {}, resume=False) as claim:
        claim.start()
    assert (out / RECORD).read_text() == '{\n "kind": "train",\n "settings": {\n  "lr": 1\n }\n}\n'
    (out / RECORD).write_text('{"kind": "train", "settings": [1]}')
    with pytest.raises(MixLNError, match=f"^{out / RECORD}: damaged \\(settings: must be an object, got \\[1\\]\\); it holds"):
        with claim_run(out, "train", {"lr": 1}, {}, resume=True):
            pass


def test_a_demo_begun_at_another_training_lr_is_not_resumed(tiny_llama, tmp_path, cli):
    """A demo folder from before the demo trained at its own lr holds arms trained at the recipe's:
    --resume refuses it in one line rather than reporting them as this demo's."""
    import json
    from pathlib import Path

    from mixln_convert.conversion.options import ALPHA
    from mixln_convert.workflows.options import DemoOptions

    out = tmp_path / "demo"
    out.mkdir()
    earlier = {"--source": str(Path(tiny_llama).absolute()), "--alpha": ALPHA, "--heal-tokens": DemoOptions.heal_tokens,
               "--train-tokens": DemoOptions.train_tokens, "--eval-tokens": DemoOptions.eval_tokens,
               "--prune-curve": True}
    (out / "run.json").write_text(json.dumps({"kind": "demo", "settings": earlier}))
    result = cli("demo", "--source", tiny_llama, "--out", out, "--resume")
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1
    assert "started with optim.lr null, not 3e-05" in result.output
    assert [p.name for p in out.iterdir()] == ["run.json"]


def test_a_demo_with_a_source_that_is_no_checkpoint_leaves_a_forced_out_as_it_was(tmp_path, cli):
    """--source is opened before --force empties --out: a text file given as the model is refused in
    one line and the folder keeps what it held (it used to be emptied and left with a half-begun run)."""
    (tmp_path / "notes.txt").write_text("not a model")
    out = tmp_path / "demo"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    result = cli("demo", "--source", tmp_path / "notes.txt", "--out", out, "--force")
    assert result.exit_code != 0 and "expected a checkpoint folder or a .gguf file" in result.output
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep"


def test_timed_records_a_block_that_finished_only():
    times = {}
    with timed(times, "finished"):
        pass
    with pytest.raises(ValueError), timed(times, "failed"):
        raise ValueError("a stage that fails has no time")
    assert list(times) == ["finished"] and 0 <= times["finished"] < 1
