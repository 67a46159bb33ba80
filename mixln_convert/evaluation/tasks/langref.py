"""Datasets of the shipped tasks, for lm-eval's ``custom_dataset: !function langref.<name>``:
the JSONL beside this file, read with no download and no datasets cache."""

import json
from pathlib import Path


def _test_split(name: str):
    import datasets

    text = Path(__file__).resolve().with_name(name).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def perplexity_documents(**_metadata):
    """lm-eval passes the task's metadata as keyword arguments; none of it changes the data."""
    return _test_split("langref_ppl.jsonl")


def next_sentence_items(**_metadata):
    return _test_split("langref_next.jsonl")
