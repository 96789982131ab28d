"""Task YAMLs whose data lies on S3, made local for lm-evaluation-harness, which reads local files
offline. A YAML that names ``s3://`` objects (its ``data_files``) is read from a copy of its folder
in a scratch directory (the folder's YAMLs and Python files, so that ``include:`` and
``!function`` helpers still resolve), each URI replaced by a local copy: an object's file, or for a
glob the objects under its fixed part and the same pattern over them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from raydp_llm.core import storage
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options

S3_URI = re.compile(r"""s3a?://[^\s'"\],}]+""")
GLOB = "*?["


def localized(given: list[str], s3: S3Options, scratch: Path) -> list[str]:
    """``given`` with each task YAML that names S3 objects replaced by its local copy in
    ``scratch`` (harness task names and local-only YAMLs as they are)."""
    out, copies = [], {}
    for task in given:
        path = Path(task)
        if not task.endswith((".yaml", ".yml")) or not S3_URI.search(path.read_text()):
            out.append(task)
            continue
        folder = path.resolve().parent
        if folder not in copies:
            copies[folder] = _copied(folder, s3, scratch / f"tasks{len(copies)}")
        out.append(str(copies[folder] / path.name))
    return out


def _copied(folder: Path, s3: S3Options, into: Path) -> Path:
    """``folder``'s YAMLs (their S3 URIs made local, each fetched once) and Python files in
    ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    fetched: dict[str, str] = {}

    def local(match: re.Match) -> str:
        uri = match.group(0)
        if uri not in fetched:
            fetched[uri] = _fetched(uri, s3, into / "data" / str(len(fetched)), folder)
        return fetched[uri]

    for f in sorted(folder.iterdir()):
        if f.suffix in (".yaml", ".yml"):
            (into / f.name).write_text(S3_URI.sub(local, f.read_text()))
        elif f.suffix == ".py":
            shutil.copy(f, into / f.name)
    return into


def _fetched(uri: str, s3: S3Options, target: Path, folder: Path) -> str:
    """The local path that stands for ``uri`` once its objects are copied under ``target``."""
    cut = min((uri.find(c) for c in GLOB if c in uri), default=-1)
    fixed = uri if cut < 0 else uri[:uri.rfind("/", 0, cut) + 1]
    target.mkdir(parents=True, exist_ok=True)
    try:
        if cut < 0:
            storage.copy(uri, target / uri.rsplit("/", 1)[-1], s3)
            return str(target / uri.rsplit("/", 1)[-1])
        storage.fetch(fixed, target, s3)
    except OSError as err:
        raise InputError(f"tasks: a task YAML in {folder} names {uri}, which could not be read "
                         f"({first_line(err, 160)}); check the URI and the s3.* settings") from None
    return f"{target}/{uri[len(fixed):]}"
