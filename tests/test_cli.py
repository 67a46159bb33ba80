"""The command line: help, speed of --help, eval --json, inspect."""

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from mixln_convert.cli import main

SCRIPT = Path(__file__).parent.parent / "mixln-convert.py"


@pytest.mark.parametrize("command", [[], *([name] for name in main.commands)], ids=lambda c: " ".join(c) or "group")
def test_help_of_group_and_every_command(cli, command):
    result = cli(*command, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: main" + "".join(f" {c}" for c in command))
    assert "[default: (" not in result.stdout  # click's look for a described, not a real, default
    if command:
        undescribed = [p.name for p in main.commands[command[0]].params
                       if isinstance(p, click.Option) and not p.help and p.name != "help"]
        assert not undescribed, f"options without help: {undescribed}"


@pytest.mark.parametrize("command", [[], *([name] for name in main.commands)], ids=lambda c: " ".join(c) or "group")
def test_help_imports_neither_torch_nor_transformers(command):
    """What makes --help answer at once (python -m benchmarks maintenance startup times it): no heavy import."""
    code = ("import sys\nfrom mixln_convert.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n"
            "    print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))" % ([*command, "--help"],))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("[]"), (done.stdout[-500:], done.stderr[-500:])


def test_eval_json_last_line(cli, converted):
    result = cli("eval", converted, "--json", "--seq-len", "32", "--max-tokens", "128")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["tokens"] == 4 * 31  # 4 windows of 32, the first position of each is not scored
    assert 1 < summary["perplexity"] < 10 * 320  # a random model over a 320-token vocabulary


def test_a_home_relative_path_reads_what_its_check_found(cli, converted, tmp_path, monkeypatch):
    """'~/...' (quoted, or after --flag=) is checked as the home folder's path; the readers once took it
    literally and answered 'no such file or folder' after the check had passed."""
    import shutil

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(converted, tmp_path / "ckpt")
    (tmp_path / "text.txt").write_text("The model reads a line of text and writes the next word. " * 40)
    result = cli("eval", "~/ckpt", "--data=~/text.txt", "--max-tokens", "64", "--seq-len", "16", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["perplexity"] > 0


def test_inspect_shows_layout_and_provenance(cli, converted):
    result = cli("inspect", converted)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [row.split()[1] for row in rows] == ["Post-LN"] * 2 + ["Pre-LN"] * 6
    assert all(row.count("]") == 2 for row in rows)  # two norms per block, each "mean ±std [min,max]" in full
    assert "provenance" in result.stdout and "strategy: calibrated" in result.stdout
    assert "1024 tokens of embedded:calibration in windows of 64" in result.stdout
    calibration = json.loads((converted / "config.json").read_text())["mixln_provenance"]["calibration"]
    per_layer = [key for key, value in calibration.items() if isinstance(value, list)]
    assert per_layer and all(f"    {key}: " in result.stdout for key in per_layer)

    summary = json.loads(cli("inspect", converted, "--json").stdout)
    assert summary["post_ln_layers"] == 2 and summary["provenance"]["strategy"] == "calibrated"
    assert set(summary["layers"][0]["norms"]) == {"post_attention_norm", "post_feedforward_norm"}
    assert set(summary["layers"][2]["norms"]) == {"input_norm", "post_attention_norm"}


def test_streaming_conversion_does_not_import_transformers(tiny_llama_sharded, tmp_path):
    """move/reinit-post/alpha-0 need no model code: transformers (9 s to import here) stays out."""
    code = ("import sys; from mixln_convert.conversion.converter import convert; "
            f"convert({str(tiny_llama_sharded)!r}, {str(tmp_path / 'out')!r}, strategy='move', progress=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SCRIPT.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and (tmp_path / "out" / "config.json").is_file()


def test_convert_calibration_flags_reach_the_calibration(cli, tiny_llama, tmp_path):
    result = cli("convert", tiny_llama, tmp_path / "out", "--calibration-tokens", "512", "--calibration-seq-len", "32")
    assert result.exit_code == 0, result.output
    calibration = json.loads((tmp_path / "out" / "config.json").read_text())["mixln_provenance"]["calibration"]
    assert calibration["tokens"] == 512 and calibration["seq_len"] == 32


def test_per_document_scoring_equals_a_plain_reference_loop(cli, converted):
    """Each document from its first token, BOS as its context, windows of --seq-len that predict
    every token once: the same figures as scoring each window alone, one by one."""
    import math

    import torch

    from mixln_convert.data import read_texts
    from mixln_convert.evaluation.perplexity import evaluate_documents
    from mixln_convert.surgery.loading import load_model, load_tokenizer

    model, tokenizer = load_model(converted), load_tokenizer(converted)
    # the first 200 characters of each (over a 48-token window): the reference loop runs the model once per token
    texts = [text[:200] for text in read_texts(None, "validation")[:4]]
    result = evaluate_documents(model, tokenizer, texts, max_length=48, batch_size=3, progress=False)
    nll, tokens = 0.0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        full = [tokenizer.bos_token_id, *ids]
        for i in range(len(ids)):  # token i, in window i // 48, from that window's whole context
            window_end = min(len(ids), (i // 48 + 1) * 48)
            context = full[max(0, window_end - 48): i + 1]
            logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
            nll -= torch.log_softmax(logits, -1)[ids[i]].item()
            tokens += 1
    assert result.tokens == tokens and result.documents == 4
    assert result.token_perplexity == pytest.approx(math.exp(nll / tokens), rel=1e-4)
    words = sum(len(t.split()) for t in texts)
    assert result.word_perplexity == pytest.approx(math.exp(nll / words), rel=1e-4)
    assert result.bits_per_byte == pytest.approx(nll / sum(len(t.encode()) for t in texts) / math.log(2), rel=1e-4)

    shown = cli("eval", converted, "--seq-len", "32", "--max-tokens", "128", "--per-document", "--json")
    assert shown.exit_code == 0, shown.output
    per_document = json.loads(shown.stdout.strip().splitlines()[-1])["per_document"]
    assert per_document["tokens"] == 128 and per_document["token_perplexity"] > 1


def test_a_saved_eval_result_reads_back_and_a_damaged_one_is_refused_naming_file_and_key(cli, converted, tmp_path):
    from mixln_convert.errors import MixLNError
    from mixln_convert.evaluation.result import PerplexityScores

    shown = cli("eval", converted, "--seq-len", "32", "--max-tokens", "64", "--per-document", "--generate", "--json")
    saved = tmp_path / "eval.json"
    saved.write_text(shown.stdout.strip().splitlines()[-1])
    scores = PerplexityScores.read(saved)
    assert json.dumps(scores.to_dict()) == saved.read_text()  # the same object, key for key
    assert scores.per_document.tokens == 64 and scores.generation.continuations[0].prompt
    record = json.loads(saved.read_text())
    for damage, message in [(lambda r: r["per_document"].pop("tokens"),
                             "per_document: not per-document scores (missing tokens)"),
                            (lambda r: r["generation"]["continuations"][1].update(text=3),
                             "generation.continuations[1].text: must be a string"),
                            (lambda r: r.update(perplexity="high"), "perplexity: must be a number > 0")]:
        damaged = json.loads(json.dumps(record))
        damage(damaged)
        saved.write_text(json.dumps(damaged))
        with pytest.raises(MixLNError) as refused:
            PerplexityScores.read(saved)
        assert str(refused.value).startswith(f"{saved}: {message}") and "\n" not in str(refused.value)


def test_per_document_scoring_stops_at_its_budget_inside_one_huge_document(converted):
    """A document past the budget is cut there, and scored as the same text cut beforehand."""
    from mixln_convert.evaluation.perplexity import evaluate_documents
    from mixln_convert.surgery.loading import load_model, load_tokenizer

    model, tokenizer = load_model(converted), load_tokenizer(converted)
    huge = "words about the residual stream " * 20_000
    result = evaluate_documents(model, tokenizer, ["A short one.", huge], max_length=32, max_tokens=100, progress=False)
    first = len(tokenizer("A short one.", add_special_tokens=False)["input_ids"])
    cut = tokenizer.decode(tokenizer(huge, add_special_tokens=False)["input_ids"][:100 - first])
    alone = evaluate_documents(model, tokenizer, ["A short one.", cut], max_length=32, progress=False)
    assert result.tokens == 100 and result.documents == 2
    assert result.loss == pytest.approx(alone.loss, rel=1e-5) and result.bytes == alone.bytes


FREED_RSS = """
import sys
import torch
from mixln_convert.runtime import map_large_allocations

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

print(map_large_allocations())
first = torch.ones(4 << 20)  # 16 MiB; freeing a mapped block is what raises glibc's threshold
del first
base = resident_mib()
held = []
for _ in range(8):
    held += [torch.ones(4 << 20), torch.ones(1000)]  # small tensors between the large ones pin the heap
del held[::2]
print(resident_mib() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_tensors_leave_the_resident_set():
    out = subprocess.run([sys.executable, "-c", FREED_RSS], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"
    assert float(out[1]) < 4  # 8 x 16 MiB freed; left in the heap they would stay resident


def test_a_users_malloc_threshold_wins(monkeypatch):
    from mixln_convert.runtime import map_large_allocations

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert map_large_allocations() is False


def test_every_command_sets_the_allocation_threshold(cli, monkeypatch):
    import mixln_convert.cli as cli_module

    calls = []
    monkeypatch.setattr(cli_module, "map_large_allocations", lambda: calls.append(1))
    assert cli("recipes").exit_code == 0
    assert calls == [1]


def test_warnings_and_notices_reach_the_terminal_as_plain_lines(cli, monkeypatch):
    """A library caller gets MixLNWarnings and log records; the CLI prints each as the line it always did."""
    import logging

    import mixln_convert.cli as cli_module
    from mixln_convert.errors import warn

    def noisy():
        for _ in range(2):  # each warning is about its own result: none is deduplicated
            warn("fewer tokens than asked for")
        logging.getLogger("mixln_convert.data.tokenization").info("resuming .out.partial")

    monkeypatch.setattr(cli_module, "_print_recipes", noisy)
    result = cli("recipes")
    assert result.exit_code == 0 and result.stderr == "warning: fewer tokens than asked for\n" * 2 + "resuming .out.partial\n"


def test_a_reader_that_stops_early_gets_no_error_line():
    """`mixln-convert recipes | head -1`: a closed pipe ends the command quietly, not with 'Error: Broken pipe'."""
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the command writes
    done = subprocess.run([sys.executable, "-m", "mixln_convert.cli", "recipes"], stdout=writer,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(writer)
    assert done.stderr == "" and done.returncode == 1


# The commands whose function has another name; fetch and recipes have none (docs/development.md says so).
API_NAMES = {"eval": "score_checkpoint", "demo": "run_demo"}


def test_every_command_but_fetch_and_recipes_is_a_function_of_the_package(tmp_path):
    """What README.md and docs/development.md say: ``from mixln_convert import NAME`` gives each command's function,
    export too, though Python binds the ``mixln_convert.export`` subpackage to that name once it is imported."""
    import inspect

    import mixln_convert
    import mixln_convert.export.plain  # noqa: F401  (the subpackage imported: the name is the package now)
    from mixln_convert.errors import MixLNError

    for command in sorted(set(main.commands) - {"fetch", "recipes"}):
        name = API_NAMES.get(command, command)
        assert name in mixln_convert.__all__, command
        function = getattr(mixln_convert, name)
        assert callable(function), command
        if command != "export":
            assert inspect.isfunction(function), command
    from mixln_convert import export

    with pytest.raises(MixLNError, match="--to"):
        export(tmp_path / "none", tmp_path / "out", to="onnx")


def test_an_options_help_names_only_its_own_commands_flags():
    """prune's --method once cited --prune-curve (analyze's) and analyze's --remove (prune's); prune's --batch-size
    spoke of lm-eval requests, which prune never makes."""
    import re

    for name, command in main.commands.items():
        flags = {flag for p in command.params for flag in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]}
        for param in command.params:
            named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", getattr(param, "help", None) or ""))
            assert named <= flags, (name, param.name, named - flags)
    prune_help = {p.name: p.help for p in main.commands["prune"].params}
    assert "lm-eval" not in prune_help["batch_size"]
