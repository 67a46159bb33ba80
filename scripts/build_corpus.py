"""Build the general English of the default corpus, which ships in mixln_convert/data/english/.

The default corpus (mixln_convert/data/corpus.py) mixes the standard library's docstrings, read
from the running Python, with the documents this script writes from two pinned registry files:

- Jane Austen's six novels (public domain), from Debian's ``r-cran-janeaustenr`` (the novels as R
  character vectors, one line of the Project Gutenberg text each): a chapter is a document.
- 106 articles of the English Wikipedia (CC BY-SA 3.0), the extract of a 2016 dump that PyPI's
  ``gensim`` wheel carries as test data, wiki markup stripped: an article is a document.

A document is cut at paragraph boundaries into pieces of at most CHUNK_CHARS characters, each
piece labelled with its document, so that corpus.py puts every piece of one chapter or article
into one split. The texts measured as held out (`python -m benchmarks heal quality`, docs/corpus.md) are
in neither source.

    python scripts/build_corpus.py    # rewrites mixln_convert/data/english/{documents.jsonl.xz,manifest.json}

Needs PyPI (pip) and Debian's package lists (``apt-get update`` once). Deterministic: the inputs
are pinned by version and sha256, documents are written in source order, and the manifest keeps the
sha256 of what was written (corpus.py checks it on every read).
"""

import bz2
import hashlib
import html
import io
import json
import lzma
import re
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
import zlib
from pathlib import Path

from mixln_convert.data.corpus import ENGLISH, ENGLISH_DOCUMENTS, ENGLISH_MANIFEST, MIN_DOC_CHARS
from mixln_convert.fetch import debian_package, pip_wheel
from mixln_convert.io.atomic import write_atomic

CHUNK_CHARS = 4000  # ~1,000 tokens: the 8,192 tokens evaluation and calibration read mix every source
AUSTEN = {"package": "r-cran-janeaustenr", "version": "1.0.0-1",
          "sha256": "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
          "member": "./usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"}
WIKIPEDIA = {"requirement": "gensim==4.4.0",
             "file": "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
             # one platform's wheel, whatever the machine: the same bytes, so the same sha256, everywhere
             "pip_args": ["--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                          "--implementation", "cp", "--abi", "cp311"],
             "sha256": "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
             "member": "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"}
CHAPTER = re.compile(r"^(CHAPTER|Chapter) [IVXLC\d]+\.?$")

# ---------------------------------------------------------------------------------------------
# Jane Austen: R's serialization of six character vectors


def r_character_vectors(rdb: bytes) -> list[list[str | None]]:
    """Every object of an R lazy-load database (``Rdata.rdb``): each a big-endian length and a
    zlib stream of R's XDR serialization, here a character vector (STRSXP) without attributes."""
    vectors, pos = [], 0
    while pos < len(rdb):
        (size,) = struct.unpack(">I", rdb[pos:pos + 4])
        stream = zlib.decompressobj()
        raw = stream.decompress(rdb[pos + 4:])
        if len(raw) != size or raw[:2] != b"X\n":
            raise ValueError(f"object at byte {pos}: not a zlib-compressed XDR serialization")
        vectors.append(_strsxp(raw))
        pos = len(rdb) - len(stream.unused_data)
    return vectors


def _strsxp(raw: bytes) -> list[str | None]:
    at = 2 + 12  # "X\n", then serialization version, R's version, the minimal reader's version
    (encoding,) = struct.unpack(">i", raw[at:at + 4])
    at += 4 + encoding  # version 3 names the writer's native encoding
    flags, length = struct.unpack(">ii", raw[at:at + 8])
    at += 8
    if flags != 16:  # a plain STRSXP: no attributes, object or tag bits
        raise ValueError(f"not a plain character vector (flags {flags:#x})")
    strings = []
    for _ in range(length):
        flags, size = struct.unpack(">ii", raw[at:at + 8])
        at += 8
        if flags & 0xFF != 9:  # CHARSXP
            raise ValueError(f"not a string (flags {flags:#x})")
        strings.append(None if size == -1 else raw[at:at + size].decode("utf-8"))
        at += max(size, 0)
    if at != len(raw):
        raise ValueError(f"{len(raw) - at} bytes after the vector")
    return strings


def austen_chapters(lines: list[str | None]) -> list[str]:
    """A novel's chapters, each its paragraphs (Gutenberg's hard-wrapped lines joined, _emphasis_
    marks dropped) one to a line; the title page and the chapter and volume headings go."""
    chapters, paragraphs, current = [], None, []
    for line in [*(line or "" for line in lines), ""]:
        line = line.strip()
        if CHAPTER.match(line):
            if paragraphs is not None:
                chapters.append(paragraphs)
            paragraphs, current = [], []
        elif line and not line.startswith("VOLUME "):
            current.append(line)
        elif current:
            if paragraphs is not None:  # what precedes the first chapter is the title page
                paragraphs.append(re.sub(r"_(.+?)_", r"\1", " ".join(" ".join(current).split())))
            current = []
    chapters.append(paragraphs)
    return ["\n\n".join(p) for p in chapters if p]


def austen(progress: bool) -> tuple[list[dict], dict]:
    deb = debian_package(AUSTEN["package"], AUSTEN["version"], AUSTEN["sha256"], progress)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        rdb = (Path(tmp) / AUSTEN["member"]).read_bytes()
    records, titles = [], []
    for novel in r_character_vectors(rdb):
        title = re.sub(r" And ", " and ", next(line for line in novel if line).strip().title())
        titles.append(title)
        slug = re.sub(r"\W+", "-", title.lower())
        for n, chapter in enumerate(austen_chapters(novel), 1):
            records += pieces("austen", f"austen/{slug}/{n}", chapter)
    return records, {
        "what": f"Jane Austen's novels: {', '.join(titles)} (1811-1818), a chapter a document",
        "registry": "Debian", "package": AUSTEN["package"], "version": AUSTEN["version"], "file": deb.name,
        "sha256": AUSTEN["sha256"], "member": AUSTEN["member"],
        "licence": "public domain (the novels, published 1811-1818; text as in Project Gutenberg, without its "
                   "header); the R package: MIT, Julia Silge"}


# ---------------------------------------------------------------------------------------------
# Wikipedia: wiki markup to text

NESTED = (re.compile(r"\{\{[^{}]*\}\}"), re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.S))  # templates, tables
LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
# files, categories and links to other wikis (en:, fr:, simple:) show nothing in the article's text
HIDDEN_LINK = re.compile(r"^\s*(file|image|media|category|[a-z]{2,3}(-[a-z]+)?|simple)\s*:", re.I)
# the lists of sources and links at an article's end are citations, not prose
END_SECTION = re.compile(r"^=+\s*(references|notes|see also|external links|further reading|bibliography|"
                         r"sources|footnotes|citations)\s*=+\s*$", re.I | re.M)


def _link(match) -> str:
    target, bar, label = match.group(1).partition("|")
    if target.lower().startswith("wikt:"):
        return label.rsplit("|", 1)[-1] if bar else target[5:]
    if HIDDEN_LINK.match(target):
        return ""
    return label.rsplit("|", 1)[-1] if bar else target


def _innermost_first(pattern, replacement, text: str) -> str:
    while True:  # nested constructs: the innermost are matched first, until none is left
        text, n = pattern.subn(replacement, text)
        if not n:
            return text


def wiki_text(markup: str) -> str:
    """An article's running text: no references, templates, tables, files, formatting marks or
    closing sections of sources and links; headings and list items as plain lines."""
    text = re.sub(r"<!--.*?-->", "", markup, flags=re.S)
    text = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", "", text, flags=re.S)
    text = re.sub(r"<(math|gallery|timeline|syntaxhighlight|source|score|imagemap|chem)\b[^>]*>.*?</\1>", "", text,
                  flags=re.S)
    for pattern in NESTED:
        text = _innermost_first(pattern, "", text)
    text = _innermost_first(LINK, _link, text)
    if end := END_SECTION.search(text):
        text = text[:end.start()]
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+ ([^\]]*)\]", r"\1", text)  # [url label] -> label
    text = re.sub(r"\[(?:https?:)?//[^\]]*\]", "", text)
    text = html.unescape(re.sub(r"<[^>]+>", "", text)).replace("\xa0", " ")
    text = re.sub(r"'{2,}", "", text)  # bold and italics
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1", text, flags=re.M)
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith(("|", "!", "{", "}")):  # what is left of a table or template
            continue
        line = re.sub(r"^[*#:;]+\s*", "", line.strip())  # list and indentation marks
        line = re.sub(r"\(\s*[,;]?\s*\)", "", line)  # parentheses emptied by a removed template
        line = re.sub(r"\(\s*[,;]\s*", "(", line)  # ... or left opening on a separator
        lines.append(re.sub(r" +([,.;:])", r"\1", re.sub(r" {2,}", " ", line)).strip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def wikipedia_articles(dump: bytes) -> list[tuple[str, str]]:
    """(title, text) of the dump's articles: namespace 0, no redirects, no lists or disambiguation pages."""
    articles = []
    for _, element in ET.iterparse(bz2.BZ2File(io.BytesIO(dump))):
        if element.tag.endswith("}page"):
            ns = element.tag[:-len("page")]
            title = element.findtext(f"{ns}title")
            wanted = (element.findtext(f"{ns}ns") == "0" and element.find(f"{ns}redirect") is None
                      and not title.startswith("List of") and "(disambiguation)" not in title)
            if wanted:
                articles.append((title, wiki_text(element.findtext(f"{ns}revision/{ns}text") or "")))
            element.clear()
    return articles


def wikipedia(progress: bool) -> tuple[list[dict], dict]:
    wheel = pip_wheel(WIKIPEDIA["requirement"], WIKIPEDIA["file"], *WIKIPEDIA["pip_args"], sha256=WIKIPEDIA["sha256"],
                      progress=progress)
    with zipfile.ZipFile(wheel) as archive:
        dump = archive.read(WIKIPEDIA["member"])
    records, titles = [], []
    for title, text in wikipedia_articles(dump):
        found = pieces("wikipedia", f"wikipedia/{title}", text)
        records += found
        titles += [title] if found else []
    return records, {
        "what": f"{len(titles)} articles of the English Wikipedia (revisions of 2003-2016), an article a document",
        "registry": "PyPI", "package": "gensim", "version": "4.4.0", "file": WIKIPEDIA["file"],
        "sha256": WIKIPEDIA["sha256"], "member": WIKIPEDIA["member"],
        "licence": "CC BY-SA 3.0 (and GFDL): text of the English Wikipedia by its contributors (each article's "
                   "page history); this extract, markup stripped, is CC BY-SA 3.0. gensim itself: LGPL-2.1",
        "articles": titles}


# ---------------------------------------------------------------------------------------------


def pieces(source: str, document: str, text: str) -> list[dict]:
    """``text`` cut at paragraph boundaries into pieces of at most CHUNK_CHARS (a longer paragraph
    is a piece alone); a last piece under MIN_DOC_CHARS joins the one before, any other is dropped
    (as the corpus drops shorter docstrings)."""
    chunks = []
    for paragraph in (p for p in text.split("\n\n") if p.strip()):
        if chunks and len(chunks[-1]) + 2 + len(paragraph) <= CHUNK_CHARS:
            chunks[-1] += "\n\n" + paragraph
        else:
            chunks.append(paragraph)
    if len(chunks) > 1 and len(chunks[-1]) < MIN_DOC_CHARS:
        last = chunks.pop()  # popped first: `chunks[-2] += chunks.pop()` would store into the wrong piece
        chunks[-1] += "\n\n" + last
    return [{"source": source, "document": document, "text": chunk} for chunk in chunks if len(chunk) >= MIN_DOC_CHARS]


def main():
    records, sources = [], {}
    for name, build in (("austen", austen), ("wikipedia", wikipedia)):
        found, sources[name] = build(progress=True)
        sources[name] |= {"documents": len({r["document"] for r in found}), "pieces": len(found),
                          "characters": sum(len(r["text"]) for r in found)}
        records += found
    texts = [r["text"] for r in records]
    if len(set(texts)) != len(texts):
        sys.exit("two pieces hold the same text: it could fall into two splits")
    data = lzma.compress("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode(),
                         preset=9 | lzma.PRESET_EXTREME)
    ENGLISH.mkdir(parents=True, exist_ok=True)
    write_atomic(ENGLISH / ENGLISH_DOCUMENTS, data)
    manifest = {"file": ENGLISH_DOCUMENTS, "sha256": hashlib.sha256(data).hexdigest(),
                "built_by": "scripts/build_corpus.py", "chunk_chars": CHUNK_CHARS, "sources": sources}
    write_atomic(ENGLISH / ENGLISH_MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    for name, source in sources.items():
        print(f"{name}: {source['documents']} documents, {source['pieces']} pieces, {source['characters']:,} characters")
    print(f"{ENGLISH / ENGLISH_DOCUMENTS}: {len(data):,} bytes")


if __name__ == "__main__":
    main()
