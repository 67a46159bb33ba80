"""heal() over one shared tail: the teacher and the converted model hold one copy of what they share."""

import json

import pytest
import torch
from safetensors.torch import load_file

import mixln_convert.healing as healing
from mixln_convert.healing import pair as heal_pair
from mixln_convert.conversion.converter import convert
from mixln_convert.errors import MixLNError
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.surgery.shared_tail import load_pair

SEQ_LEN, BATCH, EVAL_TOKENS = 32, 4, 256
FAST = dict(seq_len=SEQ_LEN, batch_size=BATCH, eval_tokens=EVAL_TOKENS, lr=0.1, progress=False)
STEPS = 3


def old_pair(student_source, teacher_source, arch, k, dtype, device, share=True):
    """The heal's models as they were before the shared tail: both loaded whole, nothing shared."""
    teacher = teacher_source.model(dtype=torch.float32, device=device)
    student = student_source.model(dtype=torch.float32, device=device).requires_grad_(False)
    student.model.layers[:k].requires_grad_(True)
    return student, teacher, []


def checkpoint_tensors(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def unique_elements(*models) -> int:
    """Parameter elements the models hold, each storage counted once."""
    storages = {p.untyped_storage().data_ptr(): p.numel() for m in models for p in m.parameters()}
    return sum(storages.values())


@pytest.fixture(scope="module", params=["untied", "tied"])
def pair(request, tiny_llama, tiny_llama_tied, tmp_path_factory):
    """(converted, teacher): ``move``, alpha 0.25 (2 of 8 blocks Post-LN), untied and tied embeddings."""
    teacher = tiny_llama if request.param == "untied" else tiny_llama_tied
    out = tmp_path_factory.mktemp("moved") / request.param
    return convert(teacher, out, alpha=0.25, strategy="move", progress=False), teacher


@pytest.fixture
def captured(monkeypatch):
    """The models of every heal() this test runs, as load_pair returned them."""
    models = []

    def capture(*args):
        models.append(load_pair(*args))
        return models[-1]

    monkeypatch.setattr(heal_pair, "load_pair", capture)
    return models


def test_the_teacher_holds_the_students_tail_itself(pair):
    converted, teacher_path = pair
    student_source, teacher_source = open_checkpoint(converted), open_checkpoint(teacher_path)
    arch, k = student_source.arch, student_source.config["post_ln_layers"]
    student, teacher, unshared = load_pair(student_source, teacher_source, arch, k)
    assert unshared == []
    student_params = dict(student.named_parameters(remove_duplicate=False))
    for name, param in teacher.named_parameters(remove_duplicate=False):
        layer = arch.layer_of(name)
        if layer is None or layer >= k:  # the tail: the very Parameter, frozen
            assert param is student_params[name] and not param.requires_grad, name
        else:
            assert name not in student_params or param is not student_params[name]
        assert torch.equal(param, teacher_source.get(name if name in teacher_source.names() else arch.embed)), name
    trained = {name for name, p in student.named_parameters() if p.requires_grad}
    assert trained == {name for name in student_params if arch.layer_of(name) is not None and arch.layer_of(name) < k}


def test_a_heal_holds_the_tail_once_and_it_does_not_drift(pair, captured, tmp_path):
    converted, teacher_path = pair
    healing.heal(converted, teacher_path, tmp_path / "out", tokens=STEPS * BATCH * SEQ_LEN, **FAST)
    (student, teacher, _), = captured
    config = open_checkpoint(converted).config
    layers, k = config["num_hidden_layers"], config["post_ln_layers"]
    params = sum(p.numel() for p in student.parameters())
    bound = (layers + k) / layers * params
    assert unique_elements(student, teacher) <= bound
    assert unique_elements(*old_pair(open_checkpoint(converted), open_checkpoint(teacher_path), None, k, None,
                                     "cpu")[:2]) > bound  # the count can fail: the old heal held two models
    original = checkpoint_tensors(teacher_path)
    healed = checkpoint_tensors(tmp_path / "out")
    for name, param in teacher.named_parameters():
        layer = open_checkpoint(converted).arch.layer_of(name)
        if name in original and (layer is None or layer >= k):  # after the heal, still the teacher's bit for bit
            assert torch.equal(param, original[name]) and torch.equal(healed[name], original[name]), name


def test_unshared_the_teacher_holds_copies_of_its_own(pair):
    """What a sharded heal loads: two models, each a root of its own shards, with equal values."""
    converted, teacher_path = pair
    student_source, teacher_source = open_checkpoint(converted), open_checkpoint(teacher_path)
    arch, k = student_source.arch, student_source.config["post_ln_layers"]
    student, teacher, unshared = load_pair(student_source, teacher_source, arch, k, share=False)
    shared = load_pair(student_source, teacher_source, arch, k)[:2]
    assert unshared == [] and unique_elements(student, teacher) > unique_elements(*shared)
    storages = {p.untyped_storage().data_ptr() for p in student.parameters()}
    assert not any(p.untyped_storage().data_ptr() in storages for p in teacher.parameters())
    for name, param in teacher.named_parameters():
        assert torch.equal(param, teacher_source.get(name if name in teacher_source.names() else arch.embed)), name


@pytest.mark.parametrize("dtype", [None, "bf16"], ids=["shared", "converted-to-bf16"])
def test_the_shared_tail_heal_measures_what_the_old_one_did(tiny_llama, dtype, monkeypatch, recwarn, tmp_path):
    """Old (both models whole) and new give the same losses and metrics; a conversion to bf16 changes
    every tail tensor, so nothing is shared and the teacher keeps its own (with a warning)."""
    converted = convert(tiny_llama, tmp_path / "converted", alpha=0.25, strategy="move", dtype=dtype,
                        progress=False)
    new = healing.heal(converted, tiny_llama, tmp_path / "new", tokens=STEPS * BATCH * SEQ_LEN, **FAST)
    warned = " ".join(str(w.message) for w in recwarn)
    monkeypatch.setattr(heal_pair, "load_pair", old_pair)
    old = healing.heal(converted, tiny_llama, tmp_path / "old", tokens=STEPS * BATCH * SEQ_LEN, **FAST)
    assert ("the teacher keeps its own copies" in warned) == (dtype == "bf16")
    rows = {run: [json.loads(line) for line in (tmp_path / run / "heal_metrics.jsonl").read_text().splitlines()]
            for run in ("old", "new")}
    assert len(rows["new"]) == STEPS + 1
    for old_row, new_row in zip(rows["old"], rows["new"]):
        for key in set(old_row) - {"seconds"}:
            assert new_row[key] == pytest.approx(old_row[key], rel=1e-5, abs=1e-7), key
    for key in ("relative_error", "perplexity", "per_document_perplexity"):
        for when, value in old.record()[key].items():
            assert new.record()[key][when] == pytest.approx(value, rel=1e-5), (key, when)


def test_bf16_freezes_in_bf16_and_trains_in_fp32(tiny_llama, captured, tmp_path):
    converted = convert(tiny_llama, tmp_path / "converted", alpha=0.25, strategy="move", progress=False)
    result = healing.heal(converted, tiny_llama, tmp_path / "out", tokens=8 * BATCH * SEQ_LEN, dtype="bf16",
                          **FAST)
    (student, teacher, unshared), = captured
    assert unshared == []
    k = result.post_ln_layers
    for name, param in [*student.named_parameters(), *teacher.named_parameters()]:
        assert param.dtype == (torch.float32 if param.requires_grad else torch.bfloat16), name
    assert {p.requires_grad for p in student.model.layers[:k].parameters()} == {True}
    assert result.perplexity.after < result.perplexity.before
    before, after = checkpoint_tensors(converted), checkpoint_tensors(tmp_path / "out")
    assert all(after[n].dtype == t.dtype and (not n.startswith("model.layers.") or int(n.split(".")[2]) < k
                                               or torch.equal(after[n], t)) for n, t in before.items())


def test_an_unknown_dtype_is_refused(tiny_llama, tmp_path):
    with pytest.raises(MixLNError, match=r"^--dtype: unknown dtype 'fp8' \(choose from fp32, bf16\)$"):
        healing.heal(tmp_path / "any", tiny_llama, tmp_path / "out", dtype="fp8")
