"""Where calibration, evaluation and training text comes from, and its token ids.

With no data given we use the docstrings of the Python standard library: English prose that ships
with every Python, so conversion and evaluation work offline. The corpus depends on the Python
version but is deterministic for a given installation.
"""

import ast
import glob
import gzip
import hashlib
import inspect
import json
import os
import sysconfig
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import MixLNError

SPLITS = ("calibration", "train", "validation")
MIN_DOC_CHARS = 200  # shorter docstrings are mostly one-liners ("Return self."), not prose
# Test suites are code-heavy and full of fixtures; site-packages is not the stdlib.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
TOKENIZE_BATCH = 256  # documents per tokenizer call
FORMATS = (".txt", ".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")

# ---------------------------------------------------------------------------------------------
# the embedded corpus


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


@lru_cache(maxsize=1)
def _split_corpus() -> dict[str, tuple[str, ...]]:
    root = sysconfig.get_paths()["stdlib"]
    splits, seen = {s: [] for s in SPLITS}, set()
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
                # identical docstrings (e.g. _pyio vs io wrappers) would leak across splits
                if len(doc) >= MIN_DOC_CHARS and doc not in seen:
                    seen.add(doc)
                    splits[_split_of(f"{rel}:{name}")].append(doc)
    return {s: tuple(docs) for s, docs in splits.items()}


def embedded_corpus(split: str) -> list[str]:
    """Standard-library docstrings of one split: ~10% calibration, ~25% validation, the rest train.

    The whole corpus is only ~1.3M characters, hence the large held-out shares: validation needs
    ~300k characters for a stable perplexity, calibration ~100k.
    """
    if split not in SPLITS:
        raise MixLNError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    return list(_split_corpus()[split])  # a copy, so callers cannot edit the cache


# ---------------------------------------------------------------------------------------------
# user-given text files


def _format(path: Path) -> str | None:
    name = path.name.lower()
    return next((ext for ext in FORMATS if name.endswith(ext)), None)


def _expand(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(
            p for p in path.rglob("*")
            if p.is_file() and _format(p) and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            raise MixLNError(f"{path}: folder holds no {'/'.join(FORMATS)} files")
        return found
    if _format(path) is None:
        raise MixLNError(f"{path}: unsupported format, expected one of {'/'.join(FORMATS)}")
    return [path]


def _files(source: str) -> list[Path]:
    if os.path.exists(source):
        return _expand(Path(source))
    if any(c in source for c in "*?["):
        matches = sorted(glob.glob(source, recursive=True))
        if not matches:
            raise MixLNError(f"{source}: glob pattern matches no files")
        return [f for m in matches for f in _expand(Path(m))]
    raise MixLNError(f"{source}: no such file or folder")


def _text_of(record, path: Path, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise MixLNError(f"{path}: {where} has no 'text' string field")
    return record["text"]


def _read_json(path: Path, raw: str) -> list[str]:
    if raw.lstrip().startswith("["):  # one JSON list of objects
        try:
            records = json.loads(raw)
        except json.JSONDecodeError as e:
            raise MixLNError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        return [_text_of(r, path, f"record {i}") for i, r in enumerate(records)]
    texts = []  # JSON lines, the C4 layout
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise MixLNError(f"{path}: invalid JSON at line {n}: {e.msg}") from None
            texts.append(_text_of(record, path, f"line {n}"))
    return texts


def _read_parquet(path: Path) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MixLNError(f"{path}: reading .parquet needs pyarrow: pip install pyarrow") from None
    try:
        if "text" not in pq.read_schema(path).names:
            raise MixLNError(f"{path}: parquet file has no 'text' column")
        texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise MixLNError(f"{path}: cannot read parquet: {e}".replace("\n", " ")) from None
    return [_text_of({"text": t}, path, f"row {i}") for i, t in enumerate(texts)]


def _read_file(path: Path) -> list[str]:
    fmt = _format(path)
    if fmt == ".parquet":
        return _read_parquet(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if fmt.endswith(".gz") else path.read_bytes()
        raw = raw.decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise MixLNError(f"{path}: cannot read: {e}") from None
    return [raw] if fmt == ".txt" else _read_json(path, raw)


def read_texts(source=None, split: str = "validation") -> list[str]:
    """Documents from `source`: None (the embedded corpus's `split`), a file, a folder or a glob.

    For a user-given source `split` is ignored: the user chose the text.
    """
    if source is None:
        return embedded_corpus(split)
    texts = [t for f in _files(str(source)) for t in _read_file(f) if t.strip()]
    if not texts:
        raise MixLNError(f"{source}: no text found (empty file or all documents empty)")
    return texts


# ---------------------------------------------------------------------------------------------
# token blocks


def token_ids(tokenizer, texts: list[str], max_tokens: int | None = None) -> np.ndarray:
    """The documents' token ids in one int32 array, EOS between documents; with ``max_tokens``
    tokenizing stops once that many are in hand (more may be returned), so a huge corpus stays cheap.

    Documents are encoded a batch at a time (the fast tokenizer spreads a batch over its threads)
    and kept as int32 arrays: 4 bytes a token, where a Python list of ints takes ~36.
    """
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
