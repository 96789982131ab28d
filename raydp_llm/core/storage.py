"""Where files live: local paths, or S3 (``s3://``, ``s3a://``) through pyarrow's filesystem layer,
so that neither Spark nor Ray Train needs Hadoop's S3 connector jars.

Credentials come from the standard AWS chain (environment, ``~/.aws`` profile, the instance role);
``s3.endpoint_url`` points at an S3-compatible service (MinIO, moto, ...) instead of AWS. Every S3
request is retried with exponential backoff (``s3.max_attempts`` attempts): S3 answers ``SlowDown``
or 5xx under load, and the ETL's reads, Ray Train's checkpoint uploads and the final copy all go
through this one client.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import ParseResult, urlparse

import pyarrow.fs as pafs

from raydp_llm.core.errors import InputError, first_line

T = TypeVar("T")
COPY_CHUNK = 1 << 24  # bytes read and written at a time by write_tree
S3_SCHEMES = (
    "s3",
    "s3a",
    "s3n",
)  # the schemes Hadoop users write; all mean the same bucket and key


@dataclass(frozen=True)
class S3Options:
    """The ``s3`` settings as plain values (they travel to Spark executors and Ray Train
    workers)."""

    endpoint_url: str | None = None  # http(s)://host:port of an S3-compatible service; None = AWS
    region: str | None = None  # None = from the environment, the profile or the instance
    max_attempts: int = 10  # per request, with exponential backoff (25 ms, doubling)

    @classmethod
    def of(cls, cfg) -> S3Options:
        return cls(endpoint_url=cfg.endpoint_url, region=cfg.region, max_attempts=cfg.max_attempts)

    @functools.cache  # one S3 client per process and settings (an executor reads many splits)
    def filesystem(self) -> pafs.S3FileSystem:
        # The SDK's legacy ("default") retry mode: its "standard" mode stops retrying once its retry
        # quota is spent (about 100 failures a client), which a long ETL on a throttled bucket
        # reaches.
        kwargs = {"retry_strategy": pafs.AwsDefaultS3RetryStrategy(max_attempts=self.max_attempts)}
        if self.endpoint_url:
            url = urlparse(self.endpoint_url)
            answers(url, "s3.endpoint_url")
            kwargs.update(endpoint_override=url.netloc, scheme=url.scheme)
        if self.region:
            kwargs["region"] = self.region
        return pafs.S3FileSystem(**kwargs)

    @functools.cache
    def client(self):
        """A boto3 S3 client with these settings, for what pyarrow's filesystem cannot ask
        (``write_new``); imported when first needed."""
        import boto3
        from botocore.config import Config

        retries = Config(retries={"max_attempts": self.max_attempts, "mode": "legacy"})
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            config=retries)


ENDPOINT_TIMEOUT_S = 5.0


def answers(url: ParseResult, key: str) -> None:
    """An OSError at once when nothing listens at the endpoint setting ``key`` gives (a wrong host
    or port): the SDK would retry the refused connection ``s3.max_attempts`` times, about 25 s,
    before the one-line error. Checked once per process, where its first S3 client is made (and
    before a catalog's client: data/inputs/tables.py); a service that answers, even with errors,
    is left to the retries."""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=ENDPOINT_TIMEOUT_S).close()
    except OSError as err:
        raise OSError(f"nothing answers at {key}={url.geturl()} ({first_line(err)}); "
                      "check its host and port") from None


def retried(work: Callable[[], T], s3: S3Options) -> T:
    """``work()``, tried again with backoff (``s3.max_attempts`` times in all) while it fails with
    an OSError: the SDK's legacy retry mode gives up on some of S3's bodiless 503 answers to HEAD
    requests (seen with 1 request in 4 refused), and a whole download is cheap to repeat."""
    for attempt in range(s3.max_attempts):
        try:
            return work()
        except OSError:
            if attempt == s3.max_attempts - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")  # max_attempts ≥ 1


# pyarrow's S3 error for a bucket in another region than the client's (its AWS SDK's HTTP 301):
# "... Looks like the configured region is 'us-east-1' while the bucket is located in 'eu-west-1'."
OTHER_REGION = re.compile(r"bucket is located in '([A-Za-z0-9-]+)'")


def unreachable(key: str, value, err: OSError) -> InputError:
    """The one-line error for a setting whose storage could not be read: the region to set when
    the bucket is in another one."""
    other = OTHER_REGION.search(str(err))
    if other:
        return InputError(f"{key}={value}: the bucket is in the region {other[1]}, not the one "
                          f"this client uses; set s3.region={other[1]} (or AWS_REGION)")
    return InputError(f"{key}={value}: cannot read it ({first_line(err)}); check the URI, "
                      "the AWS credentials (environment, ~/.aws, instance role) and "
                      "s3.endpoint_url")


def check_bucket(key: str, uri: str, s3: S3Options) -> None:
    """A one-line error, before anything runs, when the bucket of ``uri`` is missing or out of
    reach."""
    try:
        fs, path = resolve(uri, s3)
        bucket = path.split("/", 1)[0]
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as err:
        raise unreachable(key, uri, err) from None
    if missing:
        raise InputError(f"{key}={uri}: there is no bucket {bucket}; create it (aws s3 mb "
                         f"s3://{bucket}) or fix the URI")


def is_s3(uri: str) -> bool:
    return urlparse(str(uri)).scheme in S3_SCHEMES


def s3_uri(path: str) -> str:
    """``s3a://b/k`` and ``s3n://b/k`` → ``s3://b/k``: one name per object (cache keys, Spark's
    ``src``)."""
    url = urlparse(path)
    return f"s3://{url.netloc}{url.path}" if url.scheme in S3_SCHEMES else path


def resolve(uri: str | Path, s3: S3Options) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``uri`` and the path within it (``bucket/key`` on S3, an absolute path
    locally)."""
    uri = str(uri)
    if is_s3(uri):
        url = urlparse(uri)
        return s3.filesystem(), f"{url.netloc}{url.path}".rstrip("/")
    return pafs.LocalFileSystem(), str(
        Path(uri[len("file://") :] if uri.startswith("file://") else uri).resolve()
    )


def join(uri: str, *parts: str) -> str:
    return "/".join([str(uri).rstrip("/"), *parts])


def list_objects(uri: str, s3: S3Options) -> list[pafs.FileInfo]:
    """The objects an S3 URI names: one object, every object under a prefix (hidden names and
    Hadoop's ``_SUCCESS`` markers left out), or those a glob in the key matches; sorted by key."""
    fs, path = resolve(uri, s3)
    if any(ch in path for ch in "*?["):
        prefix = path[: min(path.find(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        found = [f for f in walk(fs, prefix) if fnmatch.fnmatchcase(f.path, path)]
    else:
        info = fs.get_file_info(path)
        found = [info] if info.type == pafs.FileType.File else walk(fs, path)
    return sorted(
        (f for f in found if not f.base_name.startswith((".", "_"))), key=lambda f: f.path
    )


def walk(fs: pafs.FileSystem, prefix: str) -> list[pafs.FileInfo]:
    """Every file under ``prefix`` on ``fs``, at any depth (none when nothing is there)."""
    selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return [f for f in fs.get_file_info(selector) if f.type == pafs.FileType.File]


def find_files(root: str | Path, name: str, s3: S3Options) -> list[tuple[str, str, pafs.FileInfo]]:
    """Every file called ``name`` under ``root`` (local or S3, any depth): its location (path or
    ``s3://`` URI), its path relative to ``root`` and its info."""
    fs, path = resolve(root, s3)
    scheme = "s3://" if is_s3(str(root)) else ""
    return [
        (scheme + f.path, f.path[len(path) + 1 :], f)
        for f in walk(fs, path)
        if f.base_name == name
    ]


def read_text(uri: str | Path, s3: S3Options) -> str:
    fs, path = resolve(uri, s3)
    with fs.open_input_stream(path) as f:
        return f.read().decode()


def read_json(uri: str | Path, s3: S3Options) -> dict:
    return json.loads(read_text(uri, s3))


def write_text(uri: str | Path, text: str, s3: S3Options) -> None:
    """Write a small file whole: locally through a temporary file and a rename, so that a reader
    never sees half of it; on S3 a PUT is whole already."""
    if is_s3(str(uri)):
        fs, path = resolve(uri, s3)
        with fs.open_output_stream(path) as f:
            f.write(text.encode())
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


@contextlib.contextmanager
def whole_or_absent(directory: str | Path):
    """A temporary directory beside ``directory`` for the block to write into: renamed to
    ``directory`` (which may exist only empty) when the block ends, removed if it raises. A reader
    never sees ``directory`` half written."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if directory.exists():
            directory.rmdir()  # an empty one only: anything in it stops the rename
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def exists(uri: str | Path, s3: S3Options) -> bool:
    fs, path = resolve(uri, s3)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def copy(source: str | Path, destination: str | Path, s3: S3Options) -> None:
    """Copy a file or a directory tree from local or S3 to local or S3."""
    src_fs, src = resolve(source, s3)
    dst_fs, dst = resolve(destination, s3)
    pafs.copy_files(src, dst, source_filesystem=src_fs, destination_filesystem=dst_fs)


def publish(directory: Path, destination: str, s3: S3Options) -> None:
    """Copy the local tree ``directory`` to ``destination`` (local or S3), each ``complete.json``
    marker after the files beside it (``write_tree``)."""
    write_tree(directory, *resolve(destination, s3))


def write_tree(directory: str | Path, fs: pafs.FileSystem, root: str,
               hold_seal: bool = False) -> None:
    """Copy the local tree ``directory`` to ``root`` on ``fs`` one file at a time, each
    ``complete.json`` marker after the files beside it: S3 has no rename, so a reader that finds a
    marker finds every file it lists (``integrity``). ``hold_seal``: the top marker is left for
    the caller to write (``write_file``) once other writers' files have landed too. A file that
    cannot be written raises here.

    Not ``pafs.copy_files``: it waits for its uploads' asynchronous closes but drops their errors
    (pyarrow 25; since apache/arrow#44897), so a file whose last part or CompleteMultipartUpload
    failed for good (S3's SlowDown, retried ``s3.max_attempts`` times) is missing while the copy
    returns as if it had succeeded."""
    directory = Path(directory)
    files = sorted(
        (p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.name == "complete.json"
    )
    for path in files:
        if hold_seal and path == directory / "complete.json":
            continue
        write_file(path, fs, f"{root}/{path.relative_to(directory).as_posix()}")


def write_file(path: Path, fs: pafs.FileSystem, target: str) -> None:
    """One local file to ``target`` on ``fs`` (its directory made where there are directories)."""
    if fs.type_name != "s3":  # S3 has no directories
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
    with path.open("rb") as source, fs.open_output_stream(target) as out:
        while chunk := source.read(COPY_CHUNK):
            out.write(chunk)  # the stream's close (the upload's last requests) raises


def fetch(source: str, directory: str | Path, s3: S3Options) -> None:
    """Copy the files under ``source`` (an S3 prefix) into the local ``directory``, made if new (a
    copy into a directory that does not exist fails to open its first file); a prefix with nothing
    under it copies nothing, and the caller names the files it then lacks."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        copy(source, directory, s3)


def write_new(uri: str, text: str, s3: S3Options) -> bool:
    """Write a small object on S3 only if there is none yet: True when written, False when one was
    there. A conditional PUT (``If-None-Match: *``, which pyarrow's filesystem cannot send: boto3),
    so that of two writers exactly one wins."""
    from botocore.exceptions import ClientError

    bucket, key = resolve(uri, s3)[1].split("/", 1)
    try:
        s3.client().put_object(Bucket=bucket, Key=key, Body=text.encode(), IfNoneMatch="*")
    except ClientError as err:  # 412: the object exists; 409: a concurrent conditional write won
        if err.response["Error"]["Code"] in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


def remove(uri: str | Path, s3: S3Options) -> None:
    """Delete a file or a whole directory (an S3 prefix); nothing there, nothing done."""
    fs, path = resolve(uri, s3)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind == pafs.FileType.File:
        fs.delete_file(path)
