"""scripts/build_corpus.py, which builds the shipped general English, and the registry downloads
(mixln_convert/fetch.py) it and the default model's fetch share. Offline: the pinned files
themselves are fetched only when the corpus is rebuilt; the shipped result is tested in test_data.py."""

import hashlib
import importlib.util
import struct
import sys
import zlib
from pathlib import Path

import pytest

from mixln_convert.data.corpus import MIN_DOC_CHARS
from mixln_convert.errors import MixLNError
from mixln_convert.fetch import _download

SCRIPT = Path(__file__).parent.parent / "scripts" / "build_corpus.py"
spec = importlib.util.spec_from_file_location("build_corpus", SCRIPT)
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)


def r_serialized(strings) -> bytes:
    """An Rdata.rdb object as R writes one: length, then zlib of the XDR serialization (version 3)."""
    body = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    body += struct.pack(">ii", 16, len(strings))
    for s in strings:
        raw = s.encode() if s is not None else b""
        body += struct.pack(">ii", 0x40009, -1 if s is None else len(raw)) + raw
    return struct.pack(">I", len(body)) + zlib.compress(body)


def test_r_character_vectors_reads_every_object_of_the_database():
    novels = [["EMMA", "", "CHAPTER I", "Emma Woodhouse, handsome, clever, and rich"], ["Persuasion", None, "Sir Walter — é"]]
    assert build.r_character_vectors(b"".join(r_serialized(n) for n in novels)) == novels


def test_r_character_vectors_refuses_what_is_not_a_plain_character_vector():
    good = r_serialized(["a"])
    body = zlib.decompress(good[4:])
    at = body.index(struct.pack(">ii", 16, 1))
    with_attributes = body[:at] + struct.pack(">ii", 16 | 1 << 9, 1) + body[at + 8:]
    with pytest.raises(ValueError, match="not a plain character vector"):
        build.r_character_vectors(struct.pack(">I", len(body)) + zlib.compress(with_attributes))
    with pytest.raises(ValueError, match="not a zlib-compressed XDR"):
        build.r_character_vectors(struct.pack(">I", 99) + zlib.compress(body))


def test_austen_chapters_joins_wrapped_lines_and_drops_the_title_page_and_headings():
    lines = ["EMMA", "", "By Jane Austen", "", "VOLUME I", "", "CHAPTER I", "", "", "Emma Woodhouse, handsome,",
             "clever,  and _rich_.", "", "She was the youngest.", "", "CHAPTER II", "", "Mr. Weston was a native", None,
             "VOLUME II", "", "CHAPTER I", "", "Last words"]
    assert build.austen_chapters(lines) == ["Emma Woodhouse, handsome, clever, and rich.\n\nShe was the youngest.",
                                            "Mr. Weston was a native", "Last words"]


def test_wiki_text_keeps_the_running_text_and_drops_the_markup():
    markup = """{{Infobox person|name=Ada|image={{nested|x}}}}
'''Ada Lovelace''' (10 December 1815 – 1852) was an [[England|English]] [[mathematician]].<ref name="a">{{cite web|url=http://x}}</ref> She wrote on the [[Analytical Engine]].<ref name="b" />
[[File:Ada.jpg|thumb|Ada, by [[Alfred Chalon]]]]
<!-- a comment -->
{| class="wikitable"
| a || b
|}

== Early life ==
* Born in [[London]], see [http://example.org the record] and [http://example.org/x].
She loved ''poetical science'' ({{lang-fr|x}}) and [[wikt:science|science]]&nbsp;alike.

== References ==
{{reflist}}
* A book
[[Category:Mathematicians]]
[[fr:Ada Lovelace]]"""
    assert build.wiki_text(markup) == (
        "Ada Lovelace (10 December 1815 – 1852) was an English mathematician. She wrote on the Analytical Engine.\n\n"
        "Early life\nBorn in London, see the record and.\nShe loved poetical science and science alike.")


def test_pieces_cut_at_paragraphs_within_the_limit_and_keep_every_paragraph():
    paragraphs = [("word " * (n * 37 % 300 + 20)).strip() for n in range(200)] + ["x" * (build.CHUNK_CHARS + 5), "end"]
    found = build.pieces("austen", "austen/emma/1", "\n\n".join(paragraphs))
    assert {(p["source"], p["document"]) for p in found} == {("austen", "austen/emma/1")}
    assert [q for p in found for q in p["text"].split("\n\n")] == paragraphs  # nothing lost, nothing reordered
    assert all(len(p["text"]) <= build.CHUNK_CHARS or "\n\n" not in p["text"] for p in found[:-1])
    assert all(len(p["text"]) >= MIN_DOC_CHARS for p in found)  # the short last paragraph joined the piece before
    assert len(found) > 5


def test_a_download_runs_once_into_the_cache_and_is_checked_against_its_pin(tmp_path):
    write = [sys.executable, "-c", "open('pkg_1.0_all.deb', 'wb').write(b'content')"]
    pinned = hashlib.sha256(b"content").hexdigest()
    found = _download(write, tmp_path / "debs", "pkg_1.0_*.deb", "pkg 1.0", pinned, progress=False)
    assert found == tmp_path / "debs" / "pkg_1.0_all.deb" and found.read_bytes() == b"content"
    fail = [sys.executable, "-c", "raise SystemExit('must not run: the file is cached')"]
    assert _download(fail, tmp_path / "debs", "pkg_1.0_*.deb", "pkg 1.0", pinned, progress=False) == found
    with pytest.raises(MixLNError, match=f"{found}: sha256 {pinned}, but pkg 1.0 is pinned at 0+; remove the file"):
        _download(fail, tmp_path / "debs", "pkg_1.0_*.deb", "pkg 1.0", "0" * 64, progress=False)
    with pytest.raises(MixLNError, match="^fetching pkg 2.0 failed: E: Unable to locate package pkg$"):
        _download([sys.executable, "-c", "import sys; sys.exit('E: Unable to locate package pkg')"],
                  tmp_path / "debs", "pkg_2.0_*.deb", "pkg 2.0", None, progress=False)
