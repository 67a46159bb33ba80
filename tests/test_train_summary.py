"""A trained arm's summary.json as one typed record: written and read back equal, each field checked by its
declared kind where the file is read, in one line naming the file and key."""

import json

import pytest

from mixln_convert.errors import MixLNError
from mixln_convert.evaluation.options import Measured
from mixln_convert.training.summary import TrainSummary

FINISHED = {"arm": "mixln", "steps": 4, "tokens": 512, "wall_time_s": 1.5, "initial_val_ppl": 30.0,
            "final_val_ppl": 20.0}


def written(tmp_path, record: dict):
    file = tmp_path / "summary.json"
    file.write_text(json.dumps(record))
    return file


def test_a_summary_reads_back_as_written(tmp_path):
    summary = TrainSummary(**FINISHED, source="src", final_val_loss=3.0, initial_val_loss=3.4, num_layers=8,
                           post_ln_layers=2, layernorm_scaling=False, heal_tokens=0, final_val_window_losses=[3.0, 3.1],
                           validation=Measured(data="embedded:validation", tokens=62, seq_len=32))
    summary.write(tmp_path)
    assert TrainSummary.read(tmp_path / "summary.json") == summary
    assert list(json.loads((tmp_path / "summary.json").read_text()))[:3] == ["arm", "source", "steps"]  # the file's order


def test_an_older_summary_reads_with_what_it_lacks_unknown(tmp_path):
    """A summary written before heal_tokens (or a field of a newer version) existed still reads."""
    summary = TrainSummary.read(written(tmp_path, {**FINISHED, "a_newer_field": 1}))
    assert summary.heal_tokens is None and summary.validation is None and summary.final_val_ppl == 20.0


@pytest.mark.parametrize("change, said", [
    ({"final_val_ppl": "x"}, "final_val_ppl: must be a number > 0, got 'x'"),
    ({"final_val_ppl": float("nan")}, "final_val_ppl: must be a number > 0"),
    ({"steps": -1}, "steps: must be an integer in [0, 10^13], got -1"),
    ({"steps": 1.5}, "steps: must be an integer"),
    ({"arm": 3}, "arm: must be a string, got 3"),
    ({"layernorm_scaling": "no"}, "layernorm_scaling: must be true or false"),
    ({"final_val_window_losses": []}, "final_val_window_losses: give 1 to"),
    ({"final_val_window_losses": [1.0, "x"]}, "final_val_window_losses: 'x' is not a finite number"),
    ({"validation": {"data": "d", "tokens": 3, "seq_len": 1}},
     "validation.seq_len: must be an integer in [2, 10^13], got 1"),
    ({"validation": {"data": "d", "tokens": -1, "seq_len": 32}}, "validation.tokens: must be an integer in [0, 10^13]"),
    ({"validation": {"data": 3, "tokens": 3, "seq_len": 32}}, "validation.data: must be a string, got 3"),
    ({"validation": {"data": "d", "tokens": 3, "seq_len": "unknown length"}}, "validation.seq_len: must be an integer"),
    ({"validation": {"data": "d", "seq_len": 32}}, "validation: not what a figure was measured on (missing tokens)"),
    ({"validation": [1]}, "validation: not what a figure was measured on (not a JSON object)"),
    ({"num_layers": 2, "post_ln_layers": 3}, "post_ln_layers 3 exceeds num_layers 2"),
])
def test_a_bad_field_is_one_line_naming_the_file_and_key(change, said, tmp_path):
    file = written(tmp_path, {**FINISHED, **change})
    with pytest.raises(MixLNError, match="^" + str(file).replace(".", r"\.") + ": ") as raised:
        TrainSummary.read(file)
    assert said in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("text, said", [("[]", "not a JSON object"), ("{", "unreadable JSON"),
                                        (json.dumps({"arm": "mixln", "steps": 1}), "missing tokens, wall_time_s")])
def test_a_summary_that_is_not_one_is_refused(text, said, tmp_path):
    file = tmp_path / "summary.json"
    file.write_text(text)
    with pytest.raises(MixLNError, match=said):
        TrainSummary.read(file)
