"""Where calibration, evaluation and training text comes from, and its token ids.

With no data given we use the embedded corpus, so conversion, heal and evaluation work offline: general
English that ships with this package (Jane Austen's novels and Wikipedia articles; sources and licences
in english/manifest.json) mixed with the docstrings of the Python standard library (docstrings alone
tuned a heal toward code documentation: docs/corpus.md). It is deterministic for a given installation.
"""

import ast
import glob
import gzip
import hashlib
import inspect
import itertools
import json
import lzma
import os
import sysconfig
import zlib
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import MixLNError
from ..io.hub import HubDataset, hub_name
from ..io.paths import is_pattern, is_regular

SPLITS = ("calibration", "train", "validation")
MIN_DOC_CHARS = 200  # shorter docstrings are mostly one-liners ("Return self."), not prose
# Test suites are code-heavy and full of fixtures; site-packages is not the stdlib.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
TOKENIZE_BATCH = 256  # documents per tokenizer call
PARQUET_BATCH = 1024  # rows read from a parquet file at a time
FORMATS = (".txt", ".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")
ENGLISH = Path(__file__).parent / "english"  # the shipped general English (scripts/build_corpus.py)
ENGLISH_DOCUMENTS, ENGLISH_MANIFEST = "documents.jsonl.xz", "manifest.json"
# The embedded corpus's sources and their shares of its characters (in every split, and in every
# prefix of one: calibration, evaluation and heal read only the first tokens of theirs).
SHARES = {"docstrings": 1 / 3, "austen": 1 / 3, "wikipedia": 1 / 3}


def _split_of(key: str) -> str:
    # hashlib, not hash(): the assignment must not change with PYTHONHASHSEED or across runs.
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    return "calibration" if bucket < 10 else "validation" if bucket < 35 else "train"


def _docstrings(tree: ast.Module):
    """Yield (qualified_name, docstring) for the module, its classes and functions, in source order."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, ast.get_docstring(child, clean=False)
                yield from visit(child, name + ".")
            elif not isinstance(child, ast.expr):  # defs nested in if/try/with blocks count too
                yield from visit(child, prefix)

    yield "<module>", ast.get_docstring(tree, clean=False)
    yield from visit(tree, "")


def _stdlib_docstrings():
    """Yield (key, docstring) for every docstring of the standard library worth reading as prose."""
    root = sysconfig.get_paths()["stdlib"]
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)  # sorted: walk order is the doc order
        for file in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            try:  # ast.parse on bytes honours the file's coding cookie; we never import the module
                with open(path, "rb") as f:
                    tree = ast.parse(f.read(), filename=path)
            except (OSError, SyntaxError, ValueError):
                continue  # a broken or unreadable file in someone's Python is not our user's problem
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            for name, doc in _docstrings(tree):
                doc = inspect.cleandoc(doc).strip() if doc else ""
                if len(doc) >= MIN_DOC_CHARS:
                    yield f"{rel}:{name}", doc


def _shipped_english():
    """Yield (source, key, text) of the shipped general English, its file checked against the
    manifest first: a damaged installation is refused, not read."""
    path = ENGLISH / ENGLISH_DOCUMENTS
    try:
        manifest = json.loads((ENGLISH / ENGLISH_MANIFEST).read_text(encoding="utf-8"))
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise MixLNError(f"{path}: sha256 differs from {ENGLISH_MANIFEST}'s: the installed package is damaged; "
                             "reinstall mixln-convert")
        records = [json.loads(line) for line in lzma.decompress(data).decode("utf-8").splitlines()]
    except (OSError, KeyError, ValueError, lzma.LZMAError) as e:  # JSONDecodeError and UnicodeDecodeError too
        raise MixLNError(f"{path}: cannot read the embedded corpus: {e}; reinstall mixln-convert") from None
    for record in records:
        yield record["source"], record["document"], record["text"]


def _interleave(by_source: dict[str, list[str]]) -> list[str]:
    """The sources' documents, each source's in its own order, merged so that every prefix holds
    each source at about its SHARES share of the characters (until one runs out)."""
    merged, taken, at = [], dict.fromkeys(by_source, 0), dict.fromkeys(by_source, 0)
    while left := [source for source in by_source if at[source] < len(by_source[source])]:
        source = min(left, key=lambda s: taken[s] / SHARES[s])  # ties: the first in SHARES's order
        document = by_source[source][at[source]]
        merged.append(document)
        at[source] += 1
        taken[source] += len(document)
    return merged


@lru_cache(maxsize=1)
def _split_corpus() -> dict[str, tuple[str, ...]]:
    splits, seen = {s: {source: [] for source in SHARES} for s in SPLITS}, set()
    documents = itertools.chain((("docstrings", key, doc) for key, doc in _stdlib_docstrings()), _shipped_english())
    for source, key, text in documents:
        # a split is drawn per document (a docstring, a chapter, an article), so no text is both
        # trained on and measured; identical texts (e.g. _pyio vs io wrappers) would leak across splits
        if text not in seen:
            seen.add(text)
            splits[_split_of(key)][source].append(text)
    return {s: tuple(_interleave(by_source)) for s, by_source in splits.items()}


def embedded_corpus(split: str) -> list[str]:
    """The embedded corpus's documents of one split: ~10% calibration, ~25% validation, the rest
    train, of each source's documents; the sources interleaved at their SHARES. The held-out shares
    are large because the docstrings are few: validation needs enough of them for a stable perplexity."""
    if split not in SPLITS:
        raise MixLNError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    return list(_split_corpus()[split])  # a copy, so callers cannot edit the cache


def _format(path: Path) -> str | None:
    name = path.name.lower()
    return next((ext for ext in FORMATS if name.endswith(ext)), None)


def _expand(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and _format(p)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise MixLNError(f"{path}: folder holds no {'/'.join(FORMATS)} files")
        return found
    if not is_regular(path):
        raise MixLNError(f"{path}: not a regular file or folder")
    if _format(path) is None:
        raise MixLNError(f"{path}: unsupported format, expected one of {'/'.join(FORMATS)}")
    return [path]


def _files(source: str) -> list[Path]:
    source = os.path.expanduser(source)  # as io/paths.py checked it
    if os.path.exists(source):
        return _expand(Path(source))
    if is_pattern(source):
        matches = sorted(glob.glob(source, recursive=True))
        if not matches:
            raise MixLNError(f"{source}: glob pattern matches no files")
        return [f for m in matches for f in _expand(Path(m))]
    raise MixLNError(f"{source}: no such file or folder")


def _text_of(record, path: Path, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise MixLNError(f"{path}: {where} has no 'text' string field")
    return record["text"]


def _json_record(line: str, path: Path, n: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise MixLNError(f"{path}: invalid JSON at line {n if n else e.lineno}: {e.msg}") from None


def _json_documents(path: Path, fmt: str) -> Iterator[str]:
    """A JSON file's texts, a line at a time: JSON lines (the C4 layout) are never held whole; a
    file that is one JSON list of objects is (it is one value)."""
    with (gzip.open if fmt.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        first, blank_lines = f.read(1), 0
        while first.isspace():
            blank_lines += first == "\n"
            first = f.read(1)
        if first == "[":
            for i, record in enumerate(_json_record("\n" * blank_lines + first + f.read(), path, 0)):
                yield _text_of(record, path, f"record {i}")
            return
        for n, line in enumerate(itertools.chain([first + f.readline()], f), blank_lines + 1):
            if line.strip():
                yield _text_of(_json_record(line, path, n), path, f"line {n}")


def _parquet_documents(path: Path) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MixLNError(f"{path}: reading .parquet needs pyarrow: pip install pyarrow") from None
    try:
        file = pq.ParquetFile(path)
        if "text" not in file.schema_arrow.names:
            raise MixLNError(f"{path}: parquet file has no 'text' column")
        batches = file.iter_batches(batch_size=PARQUET_BATCH, columns=["text"])  # a row group at most in memory
        for row, text in enumerate(itertools.chain.from_iterable(b.column(0).to_pylist() for b in batches)):
            yield _text_of({"text": text}, path, f"row {row}")
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise MixLNError(f"{path}: cannot read parquet: {e}".replace("\n", " ")) from None


def file_documents(path: Path | HubDataset, streaming: bool = False) -> Iterator[str]:
    """The non-blank documents of one file or Hub dataset, streamed: a .txt file is one document, a JSON line,
    record, parquet row or dataset row another. ``streaming``: a Hub dataset's rows as they come."""
    fmt = None if isinstance(path, HubDataset) else _format(path)
    try:
        if fmt is None:
            documents = (_text_of(record, path, f"row {i}") for i, record in enumerate(path.records(streaming)))
        elif fmt == ".parquet":
            documents = _parquet_documents(path)
        elif fmt == ".txt":
            text = path.read_bytes().decode("utf-8")
            if "\0" in text:  # valid UTF-8, but no text file holds NUL: a binary file named .txt
                raise MixLNError(f"{path}: holds NUL bytes: a binary file, not text")
            documents = iter([text])
        else:
            documents = _json_documents(path, fmt)
        yield from (text for text in documents if text.strip())
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise MixLNError(f"{path}: cannot read: {e}") from None


def source_files(source) -> list[Path | HubDataset]:
    """The files a user-given source names (a file, a folder recursively, a glob), or its Hub dataset."""
    dataset = hub_name(source, "dataset")
    return [HubDataset(dataset)] if dataset is not None else _files(str(source))


def check_text(source, flag: str) -> None:
    """Every document of ``source`` read once, none kept: a command that writes before it reads its text
    refuses a bad file first. A Hub dataset is checked as its builder knows it: reading it would fetch it."""
    dataset = hub_name(source, "dataset")
    if dataset is not None:
        HubDataset(dataset).builder(flag)
    elif not sum(1 for f in source_files(source) for _ in file_documents(f)):
        raise MixLNError(f"{flag} {source}: no text found (empty file or all documents empty)")


def read_texts(source=None, split: str = "validation") -> list[str]:
    """Documents from `source`: None (the embedded corpus's `split`), a file, a folder, a glob or a Hub
    dataset. A user-given source ignores `split` (a Hub dataset's split is in its name, train unless named)."""
    if source is None:
        return embedded_corpus(split)
    texts = [t for f in source_files(source) for t in file_documents(f)]
    if not texts:
        raise MixLNError(f"{source}: no text found (empty file or all documents empty)")
    return texts


def token_ids(tokenizer, texts: list[str], max_tokens: int | None = None) -> np.ndarray:
    """The documents' token ids in one int32 array, EOS between documents; with ``max_tokens`` tokenizing
    stops once that many are in hand (more may be returned). Encoded a batch at a time (the fast tokenizer
    spreads a batch over its threads) and kept as int32 arrays, not lists of Python ints."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise MixLNError("the tokenizer has no eos_token_id to separate documents with")
    texts = [text for text in texts if text]
    pieces, count = [], 0
    # a progress bar only for big inputs; None also hides it when stderr is not a terminal
    with tqdm(total=len(texts), desc="tokenizing", unit="doc", leave=False,
              disable=True if len(texts) < 2000 else None) as bar:
        for start in range(0, len(texts), TOKENIZE_BATCH):
            for ids in tokenizer(texts[start:start + TOKENIZE_BATCH], add_special_tokens=False)["input_ids"]:
                pieces += [np.array([eos], np.int32)] if pieces else []
                pieces.append(np.array(ids, np.int32))
                count += len(ids) + 1
                if max_tokens is not None and count > max_tokens:
                    return np.concatenate(pieces)
            bar.update(min(TOKENIZE_BATCH, len(texts) - start))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
