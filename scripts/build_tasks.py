"""Build the offline lm-evaluation-harness tasks that ship in mixln_convert/evaluation/tasks/ (their JSONL).

Source: the Python Language Reference as it ships with Python itself (``pydoc_data.topics``,
the text ``help("assert")`` prints). It is not in the embedded corpus, which is general English
and the standard library's *docstrings* (mixln_convert/data/corpus.py) -- the text the demo
calibrates, trains and heals on -- so these documents are held out from all of it; paragraphs that
also occur in it are dropped all the same.

    python scripts/build_tasks.py     # rewrites mixln_convert/evaluation/tasks/langref_{ppl,next}.jsonl

Deterministic for one Python version (the committed files were built with the one named in
their YAML's metadata): paragraphs in topic order, choices drawn by a seeded generator.
"""

import json
import random
import re
import sys
from pathlib import Path

import pydoc_data.topics

from mixln_convert.data import embedded_corpus
from mixln_convert.data.corpus import SPLITS

OUT = Path(__file__).resolve().parent.parent / "mixln_convert" / "evaluation" / "tasks"
SEED = 0
PPL_DOCUMENTS = 60  # rolling-perplexity documents, each a run of prose paragraphs of one topic
PPL_DOC_CHARS = 1200  # a document grows paragraph by paragraph to at least this many characters
NEXT_ITEMS = 300  # "which sentence comes next" items
CHOICES = 4  # the true next sentence and three from elsewhere in the same topic
MIN_SENTENCE, MAX_SENTENCE = 40, 300  # characters: no fragments, no run-on paragraphs as one sentence
# a sentence ends at . ! or ? followed by a capital letter or a quote; "e.g." and "i.e." do not end one
SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<=[.!?])\s+(?=[A-Z\"*])")


def prose_paragraphs(topic_text: str) -> list[str]:
    """The topic's paragraphs of running text, each on one line: no headings, underlines, code,
    grammar rules or lists."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", topic_text):
        lines = block.splitlines()
        if len(lines) < 2 or any(line.startswith((" ", "\t", "*", "-", ">")) for line in lines):
            continue  # a one-line heading or label, an indented code/grammar block, a list
        if re.fullmatch(r"[=*\-~^]+", lines[-1].strip()) or "::=" in block or ">>>" in block:
            continue
        text = " ".join(line.strip() for line in lines)
        if text[-1] in ".!?:" and len(text) >= 120:
            paragraphs.append(text)
    return paragraphs


def held_out(paragraphs: dict[str, list[str]]) -> dict[str, list[str]]:
    """The paragraphs none of whose sentences occurs in the embedded corpus (any split)."""
    corpus = " ".join(" ".join(" ".join(doc.split()) for doc in embedded_corpus(split)) for split in SPLITS)
    return {topic: [p for p in ps if not any(s in corpus for s in sentences(p) if len(s) >= MIN_SENTENCE)]
            for topic, ps in paragraphs.items()}


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(paragraph) if s.strip()]


def perplexity_documents(paragraphs: dict[str, list[str]]) -> list[dict]:
    """Documents of consecutive paragraphs of one topic, from the first topic on, until there are enough."""
    documents = []
    for topic, ps in paragraphs.items():
        current = []
        for p in ps:
            current.append(p)
            if sum(map(len, current)) >= PPL_DOC_CHARS:
                documents.append({"topic": topic, "text": "\n\n".join(current)})
                current = []
        if len(documents) >= PPL_DOCUMENTS:
            break
    return documents[:PPL_DOCUMENTS]


def next_sentence_items(paragraphs: dict[str, list[str]], rng: random.Random) -> list[dict]:
    """Items: a paragraph's opening sentences, then its true next sentence among sentences of the
    same topic's other paragraphs (so a choice is told apart by coherence, not by subject)."""
    candidates = []
    for topic, ps in paragraphs.items():
        split = [sentences(p) for p in ps]
        for i, ss in enumerate(split):
            others = [s for j, o in enumerate(split) if j != i for s in o if MIN_SENTENCE <= len(s) <= MAX_SENTENCE]
            if len(ss) < 2 or len(others) < CHOICES - 1:
                continue
            cut = rng.randrange(1, len(ss))  # the context is ss[:cut], the answer ss[cut]
            answer = ss[cut]
            if not MIN_SENTENCE <= len(answer) <= MAX_SENTENCE:
                continue
            # distinct distractors of similar length, so that length alone does not give the answer away
            others = sorted(set(others) - {answer}, key=lambda s: (abs(len(s) - len(answer)), s))
            if len(others) < CHOICES - 1:
                continue
            distractors = rng.sample(others[:max(8, CHOICES - 1)], CHOICES - 1)
            choices = [answer, *distractors]
            rng.shuffle(choices)
            candidates.append({"topic": topic, "context": " ".join(ss[:cut]), "choices": choices,
                               "label": choices.index(answer)})
    rng.shuffle(candidates)
    return candidates[:NEXT_ITEMS]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    tmp.replace(path)


def main() -> None:
    topics = pydoc_data.topics.topics
    paragraphs = held_out({topic: prose_paragraphs(topics[topic]) for topic in sorted(topics)})
    rng = random.Random(SEED)
    documents = perplexity_documents(paragraphs)
    items = next_sentence_items(paragraphs, rng)
    write_jsonl(OUT / "langref_ppl.jsonl", documents)
    write_jsonl(OUT / "langref_next.jsonl", items)
    print(f"Python {sys.version.split()[0]}: {len(documents)} documents "
          f"({sum(len(d['text']) for d in documents):,} characters), {len(items)} items; wrote {OUT}")


if __name__ == "__main__":
    main()
