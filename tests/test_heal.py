"""heal(): distilling the Post-LN blocks of a converted model against its original."""

import json
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny import make_tiny_llama
from transformers import AutoModelForCausalLM

from mixln_convert.conversion.converter import convert
from mixln_convert.data import read_texts, token_windows
from mixln_convert.errors import MixLNError, MixLNWarning
from mixln_convert.evaluation.perplexity import evaluate_documents, evaluate_perplexity
from mixln_convert.fetch import cache_dir
from mixln_convert.healing import heal, losses, metrics
from mixln_convert.healing import run as heal_run
from mixln_convert.healing.state import HealState
from mixln_convert.io.records import MetricRecord
from mixln_convert.model.modeling_mixln import MixLNForCausalLM
from mixln_convert.surgery.loading import load_tokenizer
from mixln_convert.schema import flag, key_in

SEQ_LEN, BATCH, EVAL_TOKENS = 32, 4, 512
FAST = dict(seq_len=SEQ_LEN, batch_size=BATCH, eval_tokens=EVAL_TOKENS, progress=False)
STEPS = 20
LR = 0.05  # large: the tiny stream is ~30x smaller than the moved Post-LN gains make it (0.1 overshoots the
# held-out loss of this random model once warmup starts at lr/warmup instead of 0)


def tensors(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def moved(tiny_llama, tmp_path_factory):
    """``tiny_llama`` converted with ``move`` (norms moved, gains kept): badly mis-scaled, much to heal."""
    return convert(tiny_llama, tmp_path_factory.mktemp("moved") / "out", alpha=0.25, strategy="move", progress=False)


@pytest.fixture(scope="module")
def healed(moved, tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("healed") / "out"
    return out, heal(moved, tiny_llama, out, tokens=STEPS * BATCH * SEQ_LEN, lr=LR, loss="residual", **FAST)


def test_healing_reduces_residual_error_and_held_out_loss(healed):
    out, result = healed
    assert result.steps == STEPS and result.tokens == STEPS * BATCH * SEQ_LEN
    assert result.relative_error.after < 0.5 * result.relative_error.before
    assert result.perplexity.after < result.perplexity.before
    rows = [json.loads(line) for line in (out / "heal_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert all({"step", "tokens", "loss", "lr"} <= set(r) for r in rows[1:])
    assert rows[-1]["val_ppl"] == result.perplexity.after


def test_only_the_post_ln_blocks_change(healed, moved):
    before, after = tensors(moved), tensors(healed[0])
    assert before.keys() == after.keys()
    n_post = healed[1].post_ln_layers
    assert n_post == 2
    for name, tensor in before.items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if layer is None or layer >= n_post:  # embeddings, final norm, head and Pre-LN blocks: bit for bit
            assert torch.equal(after[name], tensor) and after[name].dtype == tensor.dtype, name
    assert all(not torch.equal(after[f"model.layers.{i}.{t}"], before[f"model.layers.{i}.{t}"])
               for i in range(n_post) for t in ("self_attn.q_proj.weight", "post_feedforward_layernorm.weight"))


def test_output_reloads_and_measures_what_heal_reported(healed, tiny_llama):
    out, result = healed
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model) is MixLNForCausalLM
    assert {"configuration_mixln.py", "modeling_mixln.py", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    record = model.config.mixln_provenance["heal"]
    assert record["steps"] == STEPS and record["loss"] == "residual"
    assert record["relative_error"] == result.record()["relative_error"]
    assert model.config.mixln_provenance["strategy"] == "move"  # the conversion's provenance is kept
    windows = token_windows(load_tokenizer(out), read_texts(None, split="validation"), SEQ_LEN, EVAL_TOKENS)
    measured = evaluate_perplexity(model.eval(), windows, BATCH, progress=False).perplexity
    assert measured == pytest.approx(result.perplexity.after, rel=1e-4)


def test_kl_loss_heals_through_the_whole_model(moved, tiny_llama, tmp_path):
    result = heal(moved, tiny_llama, tmp_path / "out", tokens=10 * BATCH * SEQ_LEN, lr=LR, loss="kl", **FAST)
    assert result.perplexity.after < result.perplexity.before
    assert json.loads((tmp_path / "out" / "config.json").read_text())["mixln_provenance"]["heal"]["loss"] == "kl"


def test_a_teacher_with_a_tied_head_saved_anyway_heals(tiny_llama_tied, tmp_path):
    """A tied config over weights that also hold the head (equal to the embeddings) converts (test_convert.py),
    and the heal against it as teacher runs (it once ended in an IndexError where the pair was built)."""
    from safetensors.torch import save_file

    teacher = tmp_path / "head-saved"
    shutil.copytree(tiny_llama_tied, teacher)
    state = load_file(teacher / "model.safetensors")
    save_file({**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}, teacher / "model.safetensors")
    converted = convert(teacher, tmp_path / "mixln", alpha=0.25, strategy="move", progress=False)
    result = heal(converted, teacher, tmp_path / "healed", tokens=STEPS * BATCH * SEQ_LEN, lr=LR, loss="kl", **FAST)
    assert result.perplexity.after < result.perplexity.before
    assert (tmp_path / "healed" / "config.json").is_file()


def test_eval_data_is_what_heal_scores_packed_and_per_document(moved, tiny_llama, tmp_path):
    documents = ["The licence grants every recipient the same freedoms. " * 6, "Copies may be sold or given away. " * 9]
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    result = heal(moved, tiny_llama, tmp_path / "out", tokens=BATCH * SEQ_LEN, lr=LR, loss="residual",
                  eval_data=held_out, **{**FAST, "eval_tokens": 64})
    assert result.evaluation.data == str(held_out)
    teacher = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    tokenizer = load_tokenizer(tiny_llama)
    packed = evaluate_perplexity(teacher, token_windows(tokenizer, documents, SEQ_LEN, 64), BATCH, progress=False)
    assert result.perplexity.teacher == pytest.approx(packed.perplexity, rel=1e-4)
    per_document = evaluate_documents(teacher, tokenizer, documents, SEQ_LEN, BATCH, 64, progress=False)
    assert result.per_document_perplexity.teacher == pytest.approx(per_document.token_perplexity, rel=1e-4)
    default = token_windows(tokenizer, read_texts(None, split="validation"), SEQ_LEN, 64)
    assert evaluate_perplexity(teacher, default, BATCH, progress=False).perplexity != pytest.approx(
        packed.perplexity, rel=1e-3)  # the default text would have given another figure


def test_teacher_figures_are_measured_once_across_runs(moved, tiny_llama, tmp_path, monkeypatch):
    scored = []  # models evaluate_documents scored: the teacher once per distinct key, the student twice a run
    measure = heal_run.evaluate_documents
    monkeypatch.setattr(heal_run, "evaluate_documents", lambda model, *a, **k: scored.append(model) or measure(model, *a, **k))

    def run(name, teacher=tiny_llama):
        return heal(moved, teacher, tmp_path / name, tokens=BATCH * SEQ_LEN, lr=LR, loss="residual",
                    **{**FAST, "eval_tokens": 96})  # 96: no other test's key

    first = run("first")
    assert len(scored) == 3
    second = run("second")
    assert len(scored) == 5 and second.perplexity.teacher == first.perplexity.teacher
    assert second.per_document_perplexity.teacher == first.per_document_perplexity.teacher
    run("other-teacher", shutil.copytree(tiny_llama, tmp_path / "teacher-copy"))  # other files: measured again
    assert len(scored) == 8
    for entry in (cache_dir() / "teacher-metrics").iterdir():
        entry.write_text("{damaged")
    assert run("damaged").perplexity.teacher == first.perplexity.teacher and len(scored) == 11
    entries = list((cache_dir() / "teacher-metrics").iterdir())
    kept = [json.loads(text) for entry in entries if (text := entry.read_text()) != "{damaged"]
    assert [set(figures) for figures in kept] == [{"packed", "per_document"}]  # the damaged run's, kept again
    for entry in entries:  # JSON, but no positive perplexities: measured again too
        entry.write_text(json.dumps({"packed": -1.0, "per_document": "2"}))
    assert run("wrong-kinds").perplexity.teacher == first.perplexity.teacher and len(scored) == 14


def _other_tokenizer(tiny_llama, tmp_path):
    folder = shutil.copytree(tiny_llama, tmp_path / "other-tokenizer")
    tokenizer = load_tokenizer(folder)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(folder)
    return folder


BAD_INPUTS = {
    "teacher-other-tokenizer": (lambda src, moved, tmp: (moved, _other_tokenizer(src, tmp)), "tokenizer differs"),
    "teacher-other-hidden-size": (lambda src, moved, tmp: (moved, make_tiny_llama(tmp / "wide", hidden_size=128)),
                                  "hidden_size 128 differs"),
    "teacher-is-mixln": (lambda src, moved, tmp: (moved, moved), "the teacher is the Pre-LN model"),
    "source-not-mixln": (lambda src, moved, tmp: (src, src), "not a Mix-LN checkpoint"),
    "source-without-post-ln": (lambda src, moved, tmp: (convert(src, tmp / "a0", alpha=0.0, strategy="move",
                                                                progress=False), src), "post_ln_layers 0"),
    "bad-loss": (lambda src, moved, tmp: (moved, src, "--loss", "mse"), "'--loss': 'mse' is not one of"),
    "bad-dtype": (lambda src, moved, tmp: (moved, src, "--dtype", "fp16"), "'--dtype': 'fp16' is not one of"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_error_and_no_output(case, tiny_llama, moved, tmp_path, cli):
    make, message = BAD_INPUTS[case]
    converted, teacher, *extra = make(tiny_llama, moved, tmp_path)
    result = cli("heal", converted, "--teacher", teacher, "--out", tmp_path / "healed", *extra)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (1, 2) and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0]
    assert not (tmp_path / "healed").exists()


def test_a_diverged_heal_names_the_lr_as_its_caller_did():
    """train's heal takes its lr from the recipe's heal.lr: the message names that key, heal's own a flag."""
    record = MetricRecord(step=3, tokens=96, val_ppl=float("nan"))
    for named, lr in ((key_in("heal"), "heal.lr"), (flag, "--lr")):
        run = heal_run.HealRun("CONVERTED", "ORIGINAL", "OUT", named=named)
        with pytest.raises(MixLNError, match=rf"^{re.escape(lr)}: .*try a smaller {re.escape(lr)}$"):
            metrics.check_record_finite(record, 1.0, run._name)


def test_heal_metrics_read_back_typed_and_a_damaged_field_is_named(tmp_path):
    """A resumed heal reads its heal_metrics.jsonl back as MetricRecords: written and read, a line is the same; a
    damaged figure is refused in one line naming the file, the line and the key."""
    state = HealState(tmp_path / "out")
    before = MetricRecord(step=0, tokens=0, val_relative_error=0.5, val_ppl=30.0)
    state.start({"lr": 1.0}, before)
    state.log(MetricRecord(step=1, tokens=64, loss=2.5, lr=1e-4, grad_norm=0.3, skipped=True, seconds=1.0))
    lines = (state.folder / "heal_metrics.jsonl").read_text().splitlines()
    assert lines[0] == '{"step": 0, "tokens": 0, "val_relative_error": 0.5, "val_ppl": 30.0}'
    assert list(json.loads(lines[1])) == ["step", "tokens", "loss", "lr", "grad_norm", "skipped", "seconds"]
    assert state.records() == [before, MetricRecord(step=1, tokens=64, loss=2.5, lr=1e-4, grad_norm=0.3, skipped=True,
                                                  seconds=1.0)]
    (state.folder / "heal_metrics.jsonl").write_text(lines[0] + "\n" + lines[1].replace("2.5", '"2.5"') + "\n")
    with pytest.raises(MixLNError, match=r"heal_metrics.jsonl: record 2: loss: must be a finite number, got '2.5'$"):
        state.records()


def test_the_work_folders_record_is_read_typed_and_a_damaged_one_is_named(tmp_path):
    """run.json is written as before (its kind, then the settings) and read back as a record: a heal's record whose
    settings are damaged is refused for --resume in one line naming the file and the key (--force still removes it);
    one of another kind, or no JSON, makes the folder no heal's, never removed."""
    out = tmp_path / "out"
    state = HealState(out)
    state.start({"lr": 1.0}, MetricRecord(step=0, tokens=0))
    record = state.folder / "run.json"
    assert record.read_text() == '{\n "kind": "mixln-convert heal",\n "settings": {\n  "lr": 1.0\n }\n}\n'
    (state.folder / "step-3.pt").write_bytes(b"checkpoint")
    assert HealState(out).check({"lr": 1.0}, True, False, out, {}) is True
    with pytest.raises(MixLNError, match=r"--resume: the heal in .* started with lr 1.0, not 2.0"):
        HealState(out).check({"lr": 2.0}, True, False, out, {})
    record.write_text('{"kind": "mixln-convert heal", "settings": 3}')
    damaged = (rf"^{re.escape(str(record))}: damaged \(settings: must be an object, got 3\); it holds the settings "
               r"--resume must match: --force starts afresh$")
    with pytest.raises(MixLNError, match=damaged):
        HealState(out).check({"lr": 1.0}, True, False, out, {})
    record.write_text('{"kind": "mixln-convert heal"}')
    with pytest.raises(MixLNError, match=r"run.json: damaged \(not a heal's record \(missing settings\)\)"):
        HealState(out).check({"lr": 1.0}, True, False, out, {})
    with pytest.raises(MixLNError, match="a heal of it was interrupted at step 3"):
        HealState(out).check({"lr": 1.0}, False, False, out, {})
    assert HealState(out).check({"lr": 1.0}, True, True, out, {}) is False and not state.folder.exists()
    for foreign in ('{"kind": "mixln-convert train", "settings": {"lr": 1.0}}', "{not json"):
        state.folder.mkdir()
        record.write_text(foreign)
        for force in (False, True):
            with pytest.raises(MixLNError, match="exists and is not a heal's work folder"):
                HealState(out).check({"lr": 1.0}, True, force, out, {})
        assert record.read_text() == foreign
        shutil.rmtree(state.folder)


def test_a_heal_that_makes_the_model_worse_says_so(moved, tiny_llama, tmp_path, cli, recwarn):
    # a tiny random model sits at chance perplexity, so no lr reliably makes it worse: the rule itself
    metrics.warn_if_worse([1.0, 2.0, 3.0], 300.0, 310.0, 30.0)
    warned = str(recwarn.pop(MixLNWarning).message)
    assert warned.startswith("the heal made the model worse") and "try 1e+01" in warned
    assert "above the first step's: 1 to 3 (+200.0%)" in warned and "rose from 300 to 310 (+3.3%)" in warned
    healthy = cli("heal", moved, "--teacher", tiny_llama, "--out", tmp_path / "healed", "--tokens", 8 * BATCH * SEQ_LEN,
                  "--seq-len", SEQ_LEN, "--eval-tokens", EVAL_TOKENS, "--lr", LR)
    assert healthy.exit_code == 0 and "made the model worse" not in healthy.stderr


def test_cli_heal_reports_before_and_after(moved, tiny_llama, tmp_path, cli):
    out = tmp_path / "healed"
    result = cli("heal", moved, "--teacher", tiny_llama, "--out", out, "--tokens", 2 * BATCH * SEQ_LEN,
                 "--seq-len", SEQ_LEN, "--eval-tokens", EVAL_TOKENS)
    assert result.exit_code == 0, result.output
    assert "held-out perplexity (embedded:validation, " in result.stdout and f"wrote {out}" in result.stdout
    assert "each document from its first token: teacher" in result.stdout
    assert (out / "model.safetensors").is_file() and (out / "heal_metrics.jsonl").is_file()


def test_convert_heals_in_the_same_run(tiny_llama, tmp_path, cli):
    dst = tmp_path / "dst"
    result = cli("convert", tiny_llama, dst, "--calibration-tokens", 512, "--calibration-seq-len", 32,
                 "--heal-tokens", 2 * BATCH * 256)
    assert result.exit_code == 0, result.output
    assert "converted and healed 2 Post-LN blocks" in result.stdout and "each document from its first token" in result.stdout
    provenance = json.loads((dst / "config.json").read_text())["mixln_provenance"]
    assert provenance["strategy"] == "calibrated" and provenance["heal"]["steps"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # the unhealed conversion is gone


class _Held:
    """A tensor autograd saved for the backward, and the bytes all such tensors hold at once (live, peak)."""
    live = peak = 0

    def __init__(self, tensor):
        self.tensor, self.bytes = tensor, tensor.numel() * tensor.element_size()
        _Held.live += self.bytes
        _Held.peak = max(_Held.peak, _Held.live)

    def __del__(self):
        _Held.live -= self.bytes


@pytest.mark.parametrize("loss", ["kl", "residual"])
def test_activation_checkpointing_holds_less_and_heals_alike(moved, tiny_llama, tmp_path, loss):
    def run(name, checkpointing):
        _Held.live = _Held.peak = 0
        with torch.autograd.graph.saved_tensors_hooks(_Held, lambda held: held.tensor):
            result = heal(moved, tiny_llama, tmp_path / name, tokens=3 * BATCH * SEQ_LEN, lr=LR, loss=loss,
                          activation_checkpointing=checkpointing, **FAST)
        return tensors(tmp_path / name), _Held.peak, result

    kept, kept_peak, _ = run("kept", False)
    recomputed, recomputed_peak, result = run("recomputed", True)
    assert result.activation_checkpointing is True
    assert recomputed.keys() == kept.keys()
    for name, tensor in kept.items():
        torch.testing.assert_close(recomputed[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert any(not torch.equal(kept[name], tensors(moved)[name]) for name in kept)  # it did train
    print(f"peak saved bytes: {kept_peak} kept, {recomputed_peak} recomputed")
    assert recomputed_peak < 0.6 * kept_peak


def test_chunked_kl_is_the_kl_and_its_gradient():
    torch.manual_seed(0)
    student_head, teacher_head = torch.nn.Linear(16, 50, bias=False), torch.nn.Linear(16, 50, bias=False)
    hidden, teacher_hidden = torch.randn(3, 37, 16, requires_grad=True), torch.randn(3, 37, 16)
    whole = losses.distribution_kl(student_head(hidden), teacher_head(teacher_hidden))
    (expected,) = torch.autograd.grad(whole, hidden)
    chunked = losses.chunked_kl(hidden, teacher_hidden, student_head, teacher_head, chunk_tokens=8)  # 111 = 13 x 8 + 7
    (gradient,) = torch.autograd.grad(chunked, hidden)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(gradient, expected, rtol=1e-5, atol=1e-9)


def test_a_heal_that_helps_packed_but_hurts_per_document_says_so(recwarn):
    metrics.warn_if_worse([1.0, 0.5], 30.0, 25.0, 3e-5, 20.0, 38.0)
    err = str(recwarn.pop(MixLNWarning).message)
    assert "made per-document perplexity worse (from 20 to 38 (+90.0%)" in err and "heal on more --tokens" in err
    metrics.warn_if_worse([1.0, 0.5], 30.0, 25.0, 3e-5, 20.0, 19.0)  # both better: nothing to say
    assert not recwarn.list
    metrics.warn_if_worse([1.0, 0.5], 30.0, 35.0, 3e-5, 20.0, 38.0)  # packed worse too: the divergence warning
    err = str(recwarn.pop(MixLNWarning).message)
    assert "held-out perplexity rose" in err and "per-document" not in err


@pytest.mark.parametrize("before, after", [(261.4123, 261.4321), (261.4, 261.40004), (5.0, 5.0 + 1e-9),
                                           (300.0, 310.0)])
def test_a_small_rise_prints_digits_enough_to_show_it(before, after, recwarn):
    """A rise that 4 significant digits round away ('261.4 -> 261.4') prints as many as tell the two apart,
    and the relative change."""
    metrics.warn_if_worse([1.0, 0.5], before, after, 3e-5)
    warned = str(recwarn.pop(MixLNWarning).message)
    shown = re.search(r"held-out perplexity rose from (\S+) to (\S+) \(\+(\S+)%\)", warned)
    assert shown, warned
    low, high, percent = (float(x) for x in shown.groups())
    assert low < high  # the two printed figures show the rise
    assert low == pytest.approx(before, rel=5e-4) and high == pytest.approx(after, rel=5e-4)  # 4 digits at least
    assert percent == pytest.approx(100 * (after / before - 1), rel=0.05)


def test_a_nonfinite_gradient_with_a_finite_loss_stops_the_heal_before_any_update(moved, tiny_llama, tmp_path,
                                                                                   monkeypatch):
    """The first GPU run's "NaN at step 2": clipping turns an infinite gradient into NaN gradients,
    and AdamW writes NaN weights even at lr 0. The heal must stop first, naming where."""
    clip = heal_run.clip_gradients
    steps = []

    def overflowing(parameters, max_norm):
        parameters = list(parameters)
        steps.append(len(steps) + 1)
        if len(steps) == 2:  # a finite loss, one infinite gradient entry in a Post-LN block
            next(p for p in parameters if p.ndim == 2).grad[0, 0] = math.inf
        return clip(parameters, max_norm)

    monkeypatch.setattr(heal_run, "clip_gradients", overflowing)
    with pytest.raises(MixLNError, match=r"--lr: the heal's kl gradient norm is (inf|nan) at step 2 \(non-finite "
                                         r"gradients in 1 of 2 blocks, the first block \d, Post-LN\); its samples "
                                         r"are 4\.\.7 of the seeded order"):
        heal(moved, tiny_llama, tmp_path / "out", tokens=4 * BATCH * SEQ_LEN, **FAST)
    assert steps == [1, 2] and not (tmp_path / "out").exists()
