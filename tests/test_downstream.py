"""Downstream evaluation: lm-evaluation-harness tasks on the loaded model (eval --tasks), the
task layer drop (analyze --task), the shipped offline tasks, and their place in the report."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixln_convert.analysis.result import Analysis
from mixln_convert.evaluation.downstream import evaluate_tasks, task_manager
from mixln_convert.surgery.loading import load_model, load_tokenizer
from mixln_convert.evaluation.tasks import SHIPPED_TASKS, shipped_tasks_dir

pytest.importorskip("lm_eval")

L = 8  # blocks of the tiny models
OFFLINE = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def write_mc_task(folder: Path, name: str, items: list[dict]) -> Path:
    """A user's own multiple-choice task, as the README shows it: local JSONL, `dataset_path: json`."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    return folder


def continuation_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context), tokenized as lm-eval does: the pair encoded whole, the
    continuation being what follows the context's own tokens."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(len(context_ids), len(whole)))


@pytest.fixture(scope="module")
def half_right_task(converted, tmp_path_factory) -> tuple[Path, str]:
    """Items whose label is the tiny model's own favourite choice for the first half and another
    choice for the second: lm-eval's accuracy must then be exactly 0.5, whatever the random weights."""
    from mixln_convert.evaluation.tasks.langref import next_sentence_items

    model, tokenizer = load_model(converted), load_tokenizer(converted)
    items = []
    for i, row in enumerate(next_sentence_items()["test"].select(range(12))):
        scores = [continuation_logprob(model, tokenizer, row["context"], " " + c) for c in row["choices"]]
        favourite = max(range(len(scores)), key=scores.__getitem__)
        items.append({"context": row["context"], "choices": row["choices"],
                      "label": favourite if i < 6 else (favourite + 1) % len(scores)})
    return write_mc_task(tmp_path_factory.mktemp("tasks"), "half_right", items), "half_right"


def test_shipped_tasks_are_small_varied_and_held_out_from_the_embedded_corpus():
    from mixln_convert.data import embedded_corpus
    from mixln_convert.data.corpus import SPLITS

    files = sorted(p.name for p in shipped_tasks_dir().iterdir() if p.suffix in (".yaml", ".jsonl"))
    assert files == ["langref_next.jsonl", "langref_next.yaml", "langref_ppl.jsonl", "langref_ppl.yaml"]
    assert sum((shipped_tasks_dir() / f).stat().st_size for f in files) < 1_000_000
    items = [json.loads(line) for line in (shipped_tasks_dir() / "langref_next.jsonl").read_text().splitlines()]
    assert len(items) == 300 and all(len(i["choices"]) == 4 and len(set(i["choices"])) == 4 for i in items)
    labels = [i["label"] for i in items]
    assert all(labels.count(k) > 40 for k in range(4))  # the answer's position gives nothing away
    documents = [json.loads(line)["text"] for line in (shipped_tasks_dir() / "langref_ppl.jsonl").read_text().splitlines()]
    assert len(documents) == 60
    corpus = " ".join(" ".join(doc.split()) for split in SPLITS for doc in embedded_corpus(split))
    held_out = [paragraph[:80] for text in documents for paragraph in text.split("\n\n")]
    held_out += [i["context"][:80] for i in items]
    assert not [text for text in held_out if text in corpus]


def test_eval_tasks_accuracy_is_lm_evals_on_the_loaded_model(cli, converted, tiny_llama, half_right_task):
    folder, name = half_right_task
    result = cli("eval", converted, "--tasks", f"{name},mixln_langref_ppl", "--include-path", folder,
                 "--limit", "3", "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(shown) == {"checkpoint", "batch_size", "tasks", "limit", "lm_eval_version"}
    assert shown["limit"] == 3 and set(shown["tasks"]) == {name, "mixln_langref_ppl"}
    ppl = shown["tasks"]["mixln_langref_ppl"]
    assert set(ppl["metrics"]) == {"word_perplexity", "byte_perplexity", "bits_per_byte"} and ppl["samples"] == 3
    assert ppl["output_type"] == "loglikelihood_rolling" and ppl["metrics"]["byte_perplexity"] > 1

    plain = cli("eval", tiny_llama, "--tasks", name, "--include-path", folder, "--limit", "2", "--json")  # plain LLaMA
    assert plain.exit_code == 0, plain.output
    assert 0 <= json.loads(plain.stdout.strip().splitlines()[-1])["tasks"][name]["metrics"]["acc"] <= 1

    full = cli("eval", converted, "--tasks", name, "--include-path", folder)
    assert full.exit_code == 0, full.output
    assert [line.split()[:3] for line in full.stdout.splitlines()[1:]] == [["task", "metric", "value"],
                                                                           [name, "acc", "↑"]]
    assert full.stdout.splitlines()[2].split()[3] == "0.5000"  # 6 of the 12 labels are the model's favourite


def test_eval_tasks_and_lm_eval_give_the_same_numbers_on_a_folder(converted, half_right_task, tmp_path, cli):
    folder, name = half_right_task
    tasks = f"{name},mixln_langref_ppl"
    ours = cli("eval", converted, "--tasks", tasks, "--include-path", folder, "--limit", "4", "--json")
    assert ours.exit_code == 0, ours.output
    ours = json.loads(ours.stdout.strip().splitlines()[-1])["tasks"]
    include = tmp_path / "include"  # lm_eval takes one --include_path: the user's task and the shipped ones
    shutil.copytree(folder, include / "mine")
    shutil.copytree(shipped_tasks_dir(), include / "shipped", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                           f"pretrained={converted},trust_remote_code=True", "--tasks", tasks, "--include_path",
                           include, "--limit", "4", "--batch_size", "4", "--device", "cpu", "--output_path",
                           tmp_path / "results"], capture_output=True, text=True, env=OFFLINE)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(next((tmp_path / "results").rglob("results_*.json")).read_text())["results"]
    for task, result in ours.items():
        for metric, value in result["metrics"].items():
            assert value == pytest.approx(theirs[task][f"{metric},none"], rel=1e-9), (task, metric)


@pytest.mark.parametrize("task", ["mixln_langref_ppl", "half_right"])
def test_task_layer_drop_equals_lm_eval_on_the_model_without_that_block(converted, half_right_task, task):
    from mixln_convert.analysis.task_drop import task_layer_drop

    manager = task_manager([task], half_right_task[0])
    model, tokenizer = load_model(converted), load_tokenizer(converted)
    drop = task_layer_drop(model, tokenizer, task, manager, limit=4, batch_size=3, progress=False)
    assert drop.task == task and drop.samples == 4 and len(drop.layer_drop) == L
    full = evaluate_tasks(model, tokenizer, [task], manager, limit=4)["tasks"][task].metrics[drop.metric]
    assert drop.value == pytest.approx(full, rel=1e-5)
    for block in (0, 5):  # a Post-LN and a Pre-LN block
        shallower = copy.deepcopy(model)
        del shallower.model.layers[block]
        without = evaluate_tasks(shallower, tokenizer, [task], manager, limit=4)["tasks"][task].metrics
        assert drop.value + drop.layer_drop[block] == pytest.approx(without[drop.metric], rel=1e-5)
    if task == "mixln_langref_ppl":
        assert len(set(drop.layer_drop)) == L  # every skipped block changes the perplexity differently


def test_analyze_task_and_per_document_reach_the_report(cli, converted, tmp_path):
    out = tmp_path / "analysis"
    result = cli("analyze", converted, "--out", out, "--seq-len", "64", "--max-tokens", "256", "--task",
                 "mixln_langref_ppl", "--limit", "2", "--per-document")
    assert result.exit_code == 0, result.output
    analysis = Analysis.read(out / "analysis.json")
    drop = analysis.task_drop["mixln_langref_ppl"]
    assert drop.metric == "word_perplexity" and drop.higher_is_better is False and len(drop.layer_drop) == L
    assert analysis.per_document.tokens >= 256 and analysis.per_document.token_perplexity > 1
    assert (out / "task_drop_mixln_langref_ppl.png").is_file()

    report = tmp_path / "report"
    shown = cli("compare", out, "--out", report)
    assert shown.exit_code == 0, shown.output
    markdown = (report / "report.md").read_text()
    assert "## Downstream tasks" in markdown and "## Per-document perplexity" in markdown
    figures = [line for line in markdown.splitlines() if line.startswith("![")]
    assert figures[0].endswith("(layer_drop.png)") and figures[1].endswith("(task_drop_mixln_langref_ppl.png)")
    numbers = json.loads((report / "comparison.json").read_text())["models"][0]
    assert numbers["tasks"]["mixln_langref_ppl"]["value"] == pytest.approx(drop.value)
    assert numbers["per_document"]["token_perplexity"] == pytest.approx(analysis.per_document.token_perplexity)


def test_without_lm_eval_the_error_says_how_to_install_it(cli, converted, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else find_spec(name, *a))
    result = cli("eval", converted, "--tasks", SHIPPED_TASKS[0])
    assert result.exit_code == 1
    assert result.stderr.strip() == ("Error: --tasks: lm-evaluation-harness is not installed; pip install "
                                     "'lm_eval>=0.4.13' (or, in a mixln-convert checkout, pip install -e '.[eval]')")


def test_eval_tasks_with_per_document_loads_the_model_once_and_scores_as_eval_does(cli, converted, half_right_task,
                                                                                    monkeypatch):
    from mixln_convert.io.checkpoint import Checkpoint

    folder, name = half_right_task
    plain = cli("eval", converted, "--per-document", "--max-tokens", "256", "--seq-len", "64", "--json")
    assert plain.exit_code == 0, plain.output
    loads = []
    model = Checkpoint.model
    monkeypatch.setattr(Checkpoint, "model", lambda self, *a, **k: loads.append(self.path) or model(self, *a, **k))
    both = cli("eval", converted, "--tasks", name, "--include-path", folder, "--limit", "2", "--per-document",
               "--max-tokens", "256", "--seq-len", "64", "--json")
    assert both.exit_code == 0, both.output
    shown = json.loads(both.stdout.strip().splitlines()[-1])
    assert len(loads) == 1
    assert shown["per_document"] == json.loads(plain.stdout.strip().splitlines()[-1])["per_document"]
    assert "perplexity" not in shown and set(shown["tasks"]) == {name}


def test_eval_tasks_refuses_a_bad_seq_len_before_running_the_tasks(cli, converted, half_right_task, monkeypatch):
    import mixln_convert.evaluation.downstream as downstream

    folder, name = half_right_task
    monkeypatch.setattr(downstream, "evaluate_tasks", lambda *a, **k: pytest.fail("the tasks ran"))
    result = cli("eval", converted, "--tasks", name, "--include-path", folder, "--per-document", "--seq-len", "100000")
    assert result.exit_code != 0 and "--seq-len" in result.output and "Traceback" not in result.output


def test_eval_tasks_refuses_bad_data_before_loading_the_model(cli, converted, half_right_task, monkeypatch,
                                                              tmp_path):
    from mixln_convert.io.checkpoint import Checkpoint

    folder, name = half_right_task
    monkeypatch.setattr(Checkpoint, "model", lambda *a, **k: pytest.fail("the model loaded"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = cli("eval", converted, "--tasks", name, "--include-path", folder, "--per-document", "--data", empty)
    assert result.exit_code != 0 and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"{empty}: no text found" in errors[0], result.stderr
