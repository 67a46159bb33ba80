import gzip
import hashlib
import json
import shutil
import sys
from collections import Counter

import pytest
import torch

from mixln_convert.data import SPLITS, embedded_corpus, read_texts, token_windows
from mixln_convert.data import corpus
from mixln_convert.data.corpus import (ENGLISH, ENGLISH_DOCUMENTS, ENGLISH_MANIFEST, SHARES, TOKENIZE_BATCH,
                                       _shipped_english, _split_of, _stdlib_docstrings)
from mixln_convert.errors import MixLNError


class FakeTokenizer:
    """Whitespace tokenizer of a batch of texts: "3 4 5" is the ids [3, 4, 5]; id 0 is EOS."""

    eos_token_id = 0

    def __init__(self):
        self.documents = 0  # documents tokenized so far

    def get_vocab(self) -> dict:  # what the token cache's key reads of a tokenizer without a backend
        return {"fake": 0}

    def __call__(self, texts: list[str], add_special_tokens=True):
        assert add_special_tokens is False  # BOS/EOS inside the stream would be wrong
        self.documents += len(texts)
        return {"input_ids": [[int(w) for w in text.split()] for text in texts]}


# ---- embedded corpus ----------------------------------------------------------------------


def test_embedded_splits_nonempty_disjoint_deterministic():
    docs = {s: embedded_corpus(s) for s in SPLITS}
    assert sum(map(len, docs["validation"])) > 250_000
    assert sum(map(len, docs["calibration"])) > 80_000
    assert all(len(d) >= 200 and d == d.strip() for s in SPLITS for d in docs[s])
    assert not set(docs["calibration"]) & set(docs["validation"])
    assert not set(docs["calibration"]) & set(docs["train"])
    assert not set(docs["validation"]) & set(docs["train"])
    assert embedded_corpus("validation") == docs["validation"]
    docs["validation"].clear()  # callers get a copy, not the cache
    assert embedded_corpus("validation")
    assert read_texts(None, "calibration") == docs["calibration"]


def test_split_assignment_is_a_stable_hash():
    # pinned: a change here reshuffles every split (and the numbers measured on them)
    assert [_split_of(f"m.py:f{i}") for i in range(7)] == [
        "calibration", "train", "train", "train", "train", "calibration", "validation"
    ]
    counts = {s: 0 for s in SPLITS}
    for i in range(10_000):
        counts[_split_of(f"m.py:f{i}")] += 1
    assert 800 < counts["calibration"] < 1200 and 2200 < counts["validation"] < 2800


def test_unknown_split():
    with pytest.raises(MixLNError, match="split"):
        embedded_corpus("test")


def corpus_sources() -> dict[str, str]:
    """{text: source} of every document the embedded corpus draws from."""
    found = {doc: "docstrings" for _, doc in _stdlib_docstrings()}
    found.update({text: source for source, _, text in _shipped_english()})
    return found


def test_embedded_corpus_mixes_general_english_and_docstrings_at_its_shares_in_every_prefix():
    # calibration, evaluation and heal read only the first tokens of their split: each prefix must be the mix
    sources = corpus_sources()
    for split in SPLITS:
        docs = embedded_corpus(split)
        assert len({sources[d] for d in docs[:len(SHARES)]}) == len(SHARES)  # one of each source first
        left = {s: sum(len(d) for d in docs if sources[d] == s) for s in SHARES}
        # the greedy merge keeps every source within one longest document (scaled by the shares' spread) of its share
        slack = max(map(len, docs)) * max(SHARES.values()) / min(SHARES.values())
        taken = dict.fromkeys(SHARES, 0)
        for doc in docs:
            if any(taken[s] == left[s] for s in SHARES):
                break  # a source ran out: from here on the others fill the split
            taken[sources[doc]] += len(doc)
            total = sum(taken.values())
            assert all(abs(taken[s] - SHARES[s] * total) <= slack for s in SHARES), (split, taken)
        assert total > 100_000  # the balanced prefix covers what calibration, evaluation and heal read


def test_every_piece_of_a_chapter_or_article_lies_in_one_split():
    split_of = {doc: split for split in SPLITS for doc in embedded_corpus(split)}
    splits_of_document = {}
    for source, document, text in _shipped_english():
        splits_of_document.setdefault((source, document), set()).add(split_of[text])
    assert all(len(splits) == 1 for splits in splits_of_document.values())
    pieces = Counter(document for _, document, _ in _shipped_english())
    assert sum(n > 1 for n in pieces.values()) > 100  # most chapters and articles are cut into pieces
    for source in SHARES.keys() - {"docstrings"}:
        held = Counter(splits.pop() for (s, _), splits in splits_of_document.items() if s == source)
        assert set(held) == set(SPLITS), (source, held)


def test_the_shipped_english_is_what_its_manifest_pins_with_sources_and_licences():
    manifest = json.loads((ENGLISH / ENGLISH_MANIFEST).read_text(encoding="utf-8"))
    assert hashlib.sha256((ENGLISH / manifest["file"]).read_bytes()).hexdigest() == manifest["sha256"]
    assert set(manifest["sources"]) == SHARES.keys() - {"docstrings"}
    for source in manifest["sources"].values():
        assert source["registry"] in ("PyPI", "Debian") and source["version"] and source["licence"]
        assert len(source["sha256"]) == 64 and int(source["sha256"], 16) >= 0
    found = Counter(source for source, _, _ in _shipped_english())
    assert found == {name: source["pieces"] for name, source in manifest["sources"].items()}


def test_a_damaged_shipped_corpus_is_refused_in_one_line(tmp_path, monkeypatch):
    shutil.copytree(ENGLISH, tmp_path / "english")
    monkeypatch.setattr(corpus, "ENGLISH", tmp_path / "english")
    data = bytearray((tmp_path / "english" / ENGLISH_DOCUMENTS).read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / "english" / ENGLISH_DOCUMENTS).write_bytes(data)
    with pytest.raises(MixLNError) as error:
        list(_shipped_english())
    assert str(tmp_path / "english" / ENGLISH_DOCUMENTS) in str(error.value) and "damaged" in str(error.value)
    (tmp_path / "english" / ENGLISH_MANIFEST).unlink()
    with pytest.raises(MixLNError) as error:
        list(_shipped_english())
    assert "reinstall" in str(error.value) and "\n" not in str(error.value)


# ---- user files ---------------------------------------------------------------------------


def write_jsonl(path, records, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def test_formats(tmp_path):
    (tmp_path / "a.txt").write_text("line one\n\fline two\n", encoding="utf-8")
    assert read_texts(tmp_path / "a.txt") == ["line one\n\fline two\n"]
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b1", "url": "x"}, {"text": "b2"}])
    assert read_texts(str(tmp_path / "b.jsonl"), split="train") == ["b1", "b2"]
    (tmp_path / "c.json").write_text(json.dumps([{"text": "c1"}, {"text": "c2"}]))
    assert read_texts(tmp_path / "c.json") == ["c1", "c2"]
    write_jsonl(tmp_path / "d.json", [{"text": "d1"}, {"text": "d2"}])  # JSON lines named .json
    assert read_texts(tmp_path / "d.json") == ["d1", "d2"]
    write_jsonl(tmp_path / "c4-train.00000-of-01024.json.gz", [{"text": "e1"}, {"text": ""}], gzip.open)
    assert read_texts(tmp_path / "c4-train.00000-of-01024.json.gz") == ["e1"]  # empty docs dropped
    write_jsonl(tmp_path / "f.jsonl.gz", [{"text": "f1"}], gzip.open)
    assert read_texts(tmp_path / "f.jsonl.gz") == ["f1"]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p1", "p2"], "id": [1, 2]}), tmp_path / "p.parquet")
    assert read_texts(tmp_path / "p.parquet") == ["p1", "p2"]
    pq.write_table(pa.table({"body": ["p1"]}), tmp_path / "q.parquet")
    with pytest.raises(MixLNError, match="q.parquet.*'text'"):
        read_texts(tmp_path / "q.parquet")
    (tmp_path / "r.parquet").write_bytes(b"not parquet")
    with pytest.raises(MixLNError, match="r.parquet.*cannot read"):
        read_texts(tmp_path / "r.parquet")


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow.parquet` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "p.parquet").write_bytes(b"PAR1")
    with pytest.raises(MixLNError, match="p.parquet.*pip install pyarrow"):
        read_texts(tmp_path / "p.parquet")


def test_folder_and_glob(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".cache").mkdir()
    (tmp_path / "b.txt").write_text("B")
    (tmp_path / "sub" / "a.txt").write_text("A")
    write_jsonl(tmp_path / "sub" / "c.jsonl", [{"text": "C"}])
    (tmp_path / "notes.md").write_text("not a supported format: skipped in a folder")
    (tmp_path / ".cache" / "x.txt").write_text("hidden: skipped")
    assert read_texts(tmp_path) == ["B", "A", "C"]  # recursive, sorted by path
    assert read_texts(tmp_path / "sub" / "*.jsonl") == ["C"]
    assert read_texts(f"{tmp_path}/**/*.txt") == ["B", "A"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.txt", b"", "no text"),
        ("blank.jsonl", b'{"text": ""}\n{"text": "  "}\n', "no text"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": \n', "invalid JSON at line 2"),
        ("blank-first.jsonl", b'\n\n{"text": "ok"}\n{"text": \n', "invalid JSON at line 4"),  # streamed, still counted
        ("bad.json", b'[{"text": "ok"},\n {"text": }]', "invalid JSON at line 2"),
        ("notext.jsonl", b'{"text": "ok"}\n{"content": "x"}\n', "line 2 has no 'text'"),
        ("notext.json", b'[{"content": "x"}]', "record 0 has no 'text'"),
        ("bad.json.gz", b"not gzip at all", "cannot read"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "cannot read"),
        ("nul.txt", b"\0" * 20_000, "holds NUL bytes: a binary file"),
        ("data.csv", b"text\nx\n", "unsupported format"),
    ],
)
def test_read_errors(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(MixLNError, match=message) as e:
        read_texts(tmp_path / name)
    assert name in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name, message", [("nope.txt", "no such file"), ("*.jsonl", "matches no files"), ("", "holds no")])
def test_missing_sources(tmp_path, name, message):
    source = str(tmp_path / name)  # "" is the (empty) folder itself
    with pytest.raises(MixLNError, match=message) as e:
        read_texts(source)
    assert source in str(e.value)


def test_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "secret.txt"
    path.write_text("x")

    def refuse(self):  # chmod 0 cannot stop root, so fake the refusal
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(path), "read_bytes", refuse)
    with pytest.raises(MixLNError, match="secret.txt: cannot read.*Permission denied"):
        read_texts(path)


# ---- token windows ------------------------------------------------------------------------


def test_token_windows_eos_between_documents():
    windows = token_windows(FakeTokenizer(), ["1 2 3", "", "4 5", "6 7 8 9"], seq_len=4)
    assert windows.dtype == torch.long
    # 1 2 3 EOS 4 5 EOS 6 7 8 9: 11 tokens, two full windows, remainder dropped; "" adds no EOS
    assert windows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6]]


def test_token_windows_max_tokens_is_lazy():
    tok = FakeTokenizer()
    texts = ["1 2 3 4 5"] * 1000
    windows = token_windows(tok, texts, seq_len=4, max_tokens=10)  # rounds down to 2 windows
    assert windows.shape == (2, 4)
    assert tok.documents == TOKENIZE_BATCH < len(texts)  # stopped after the batch that held 8 tokens
    assert token_windows(tok, texts, seq_len=4, max_tokens=1).shape == (1, 4)  # at least one window
    assert token_windows(tok, texts, seq_len=4).shape == (5999 // 4, 4)  # 5000 tokens + 999 EOS


def test_token_windows_too_little_data():
    with pytest.raises(MixLNError, match="only 3 tokens.*--seq-len 8"):
        token_windows(FakeTokenizer(), ["1 2 3"], seq_len=8)


def test_token_windows_say_when_the_text_gives_fewer_tokens_than_asked(recwarn):
    texts = ["1 2 3 4 5"] * 3  # 15 tokens + 2 EOS: 4 windows of 4
    assert token_windows(FakeTokenizer(), texts, seq_len=4, max_tokens=16).shape == (4, 4)
    assert not recwarn.list
    assert token_windows(FakeTokenizer(), texts, seq_len=4, max_tokens=10**12, source="notes.txt").shape == (4, 4)
    assert [str(w.message) for w in recwarn] == ["notes.txt: gives 16 tokens in windows of 4, fewer than the "
                                                 "1,000,000,000,000 asked for; using those"]
