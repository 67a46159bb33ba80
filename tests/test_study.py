"""`mixln-convert study`: the from-scratch comparison through train/analyze, and its verdicts."""

import json
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from mixln_convert.analysis.measures import verdict
from mixln_convert.workflows.study import verdicts
from tiny import check_result_file

TINY = ["seq_len=32", "micro_batch_size=2", "global_batch_size=4", f"max_tokens={4 * 4 * 32}",
        "data.eval_tokens=256", "precision=fp32", "schedule.warmup_steps=1", "eval_interval=2",
        "checkpoint_interval=4", "grad_norm_interval=2"]


def test_verdicts_decide_only_beyond_the_spread_between_seeds():
    assert verdict([10.0, 10.2], [12.0, 12.1], "lower").outcome == "reproduced"
    assert verdict([12.0, 12.1], [10.0, 10.2], "lower").outcome == "not reproduced"
    assert verdict([0.3, 0.31], [0.1, 0.12], "higher").outcome == "reproduced"
    close = verdict([10.0, 11.5], [10.5, 10.6], "lower")  # gap 0.2, spread 1.5
    assert close.outcome == "too close to call"
    assert close.gap == pytest.approx(0.2) and close.spread == pytest.approx(1.5)
    assert verdict([10.0], [12.0], "lower").outcome == "too close to call"  # one seed: no spread to judge by


def test_scaled_init_is_judged_for_each_arm_when_both_schemes_ran():
    runs = [{"scheme": scheme, "seed": seed, "arm": arm, "final_val_ppl": ppl, "deep_layer_drop": 0.1,
             "grad_norm_cv": 0.5}
            for scheme, arm, ppls in [("scaled", "Pre-LN", (100, 101)), ("plain", "Pre-LN", (120, 121)),
                                      ("scaled", "Mix-LN (alpha 0.25)", (110, 111)),
                                      ("plain", "Mix-LN (alpha 0.25)", (110, 112))]
            for seed, ppl in enumerate(ppls)]
    found = verdicts(SimpleNamespace(arms=["Pre-LN", "Mix-LN (alpha 0.25)"], schemes=["scaled", "plain"],
                                     runs=[SimpleNamespace(**run) for run in runs]))
    assert found["scaled"]["perplexity"].outcome == "not reproduced"  # 110.5 vs 100.5, spread 1
    assert found["plain"]["perplexity"].outcome == "reproduced"
    assert found["scaled init helps Pre-LN"].outcome == "reproduced"
    assert found["scaled init helps Mix-LN"].outcome == "too close to call"
    assert found["scaled"]["deep blocks matter more"].outcome == "too close to call"


@pytest.fixture(scope="module")
def finished(tiny_llama_tied, tmp_path_factory):
    from mixln_convert.workflows.study import study

    out = tmp_path_factory.mktemp("study") / "run"
    return out, study(tiny_llama_tied, out, overrides=TINY, seeds=2, schemes=("scaled",), post_ln=False, lns=True,
                      eval_tokens=256, progress=False)


def test_study_trains_every_arm_and_seed_and_writes_its_report(finished):
    out, result = finished
    assert [(r.arm, r.seed) for r in result.runs] == [
        ("Pre-LN", 0), ("Mix-LN (alpha 0.25)", 0), ("LNS", 0), ("Pre-LN", 1), ("Mix-LN (alpha 0.25)", 1), ("LNS", 1)]
    for run in result.runs:
        assert run.tokens == 4 * 4 * 32 and len(run.validation_curve) >= 2
        assert len(run.relative_layer_drop) == len(run.grad_norm_per_layer) == 8
    assert type(result).read(out / "study.json").verdicts == result.verdicts
    assert set(result.verdicts["scaled"]) == {"perplexity", "deep blocks matter more",
                                                 "more uniform gradient norms"}
    report = (out / "report" / "report.md").read_text()
    assert all(f.outcome in report for f in result.verdicts["scaled"].values())
    assert set(result.lns_verdicts["scaled"]) == {"perplexity", "deep blocks matter more"}
    assert "(LNS, scaled init)" in report and "the LNS paper" in report and "| scaled | LNS |" in report
    assert (out / "report" / "study_curves.png").stat().st_size > 0
    # the arms of one seed trained on the same tokens from the same initialization; seeds differ
    config = json.loads((out / "scaled" / "seed-0" / "preln" / "preln" / "initialized" / "config.json").read_text())
    assert config["post_ln_layers"] == 0 and config["mixln_provenance"]["scaled_init"] is True
    # the LNS arm: the same plan (its gains 1, as Pre-LN's), the scaling on
    seed = out / "scaled" / "seed-0"
    pre, lns = (load_file(seed / arm / arm / folder / "model.safetensors")
                for arm, folder in (("preln", "initialized"), ("lns", "converted")))
    assert pre.keys() == lns.keys() and all(torch.equal(pre[n], lns[n]) for n in pre)
    assert json.loads((seed / "lns" / "lns" / "final" / "config.json").read_text())["layernorm_scaling"] is True
    assert json.loads((out / "run.json").read_text())["settings"]["--lns"] is True
    first = [r.final_val_ppl for r in result.runs if r.seed == 0]
    second = [r.final_val_ppl for r in result.runs if r.seed == 1]
    assert first != second


def test_a_rerun_with_resume_trains_nothing_again(finished, tiny_llama_tied):
    from mixln_convert.workflows.study import study

    out, result = finished
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    again = study(tiny_llama_tied, out, overrides=TINY, seeds=2, schemes=("scaled",), post_ln=False, lns=True,
                  eval_tokens=256, resume=True, progress=False)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == stamps
    assert [r.final_val_ppl for r in again.runs] == [r.final_val_ppl for r in result.runs]


def test_a_run_interrupted_after_its_analysis_keeps_it(finished, tiny_llama_tied):
    """A run whose stage did not record its end (killed after analyzing) trains and analyzes nothing again."""
    from mixln_convert.workflows.runs import STAGE_RESULT
    from mixln_convert.workflows.study import study

    out, result = finished
    run = out / "scaled" / "seed-1" / "mixln"
    (run / STAGE_RESULT).unlink()
    analysis = run / "analysis" / "analysis.json"
    stamp = analysis.stat().st_mtime_ns
    again = study(tiny_llama_tied, out, overrides=TINY, seeds=2, schemes=("scaled",), post_ln=False, lns=True,
                  eval_tokens=256, resume=True, progress=False)
    assert analysis.stat().st_mtime_ns == stamp and (run / STAGE_RESULT).is_file()
    assert json.loads(json.dumps(again.to_dict()["runs"])) == json.loads(json.dumps(result.to_dict()["runs"]))
    assert list(again.times_s) == ["scaled/seed-1/mixln"]  # the one stage run again, its analysis read back


@pytest.mark.parametrize("path, value, error", [
    (["runs", 2, "final_val_ppl"], None, "runs[2].final_val_ppl: must be a number > 0, got None"),
    (["runs", 0, "validation_curve"], [[1, 2, 3]], "runs[0].validation_curve: must be a list of [tokens, perplexity] "
                                                   "points, got [[1, 2, 3]]"),
    (["runs"], {}, "runs: must be a list, each a study's run, got {}"),
    (["arms"], "Pre-LN", "arms: must be a list of strings, got 'Pre-LN'"),
])
def test_study_json_reads_back_as_written_and_a_damaged_one_is_refused(finished, tmp_path, path, value, error):
    from mixln_convert.report.study import StudyResult

    check_result_file(StudyResult, finished[0] / "study.json", tmp_path, path, value, error)


@pytest.mark.parametrize("argv, fragment", [
    (["--init", "warm"], "--init: unknown scheme 'warm'"),
    (["--alpha", "1"], "--alpha"),
    (["--set", "max_tokens=0"], "max_tokens: must be an integer in [1, 10^13]"),
])
def test_bad_settings_are_refused_before_any_run(argv, fragment, cli, tiny_llama_tied, tmp_path):
    result = cli("study", tiny_llama_tied, "--out", tmp_path / "study", *argv)
    assert result.exit_code != 0 and fragment in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "study").exists()


def test_an_existing_study_folder_needs_resume(cli, finished, tiny_llama_tied):
    out, _ = finished
    result = cli("study", tiny_llama_tied, "--out", out)
    assert result.exit_code != 0 and "--out" in result.output and "Traceback" not in result.output


def test_study_verdicts_read_back_as_records_and_a_damaged_one_is_named_by_key():
    from mixln_convert.analysis.measures import Verdict
    from mixln_convert.errors import MixLNError
    from mixln_convert.report.study import BY_SCHEME, VERDICTS

    found = {"scaled": {"perplexity": verdict([10.0, 10.2], [12.0, 12.1], "lower").to_dict()},
             "scaled init helps Pre-LN": verdict([10.0], [12.0], "lower").to_dict()}
    read = VERDICTS.record(json.loads(json.dumps(found)), "study.json", "verdicts")
    assert read["scaled"]["perplexity"] == Verdict(**found["scaled"]["perplexity"])
    assert read["scaled init helps Pre-LN"].outcome == "too close to call"
    assert BY_SCHEME.record({"plain": {}}, "study.json", "lns_verdicts") == {"plain": {}}
    for damaged, message in [
            ({"scaled": {"perplexity": {**found["scaled"]["perplexity"], "outcome": "maybe"}}},
             "verdicts.scaled.perplexity.outcome: unknown outcome 'maybe'"),
            ({"scaled init helps LNS": {"outcome": "reproduced"}}, "verdicts.scaled init helps LNS: not a verdict"),
            ({"scaled": [1]}, "verdicts.scaled: must be an object, each a verdict"),
            ([], "verdicts: must be an object of verdicts")]:
        with pytest.raises(MixLNError, match="^" + re.escape(f"study.json: {message}")):
            VERDICTS.record(damaged, "study.json", "verdicts")
