"""Locations that are either local paths or object-store URLs (`s3://bucket/prefix`): what
vit-train's run folders, checkpoints and config.yaml go through, so that a run can live in a bucket.

A local location stays a `pathlib.Path` and is handled as before; a URL goes through fsspec (s3fs
for s3://), which reads the credentials and the endpoint from the environment only
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION). An object store
has no folders to make and no rename: an object is written by one PUT, which it shows whole or not
at all, so a URL is written directly, never through a temporary file.

The chunks that `vit.streaming` streams from an object store go through boto3 instead
(`vit.streaming.Store`): litdata reads them with boto3, and the chunks are written and read with
the same client settings (few retries, short timeouts); runs go through fsspec because Lightning
writes their checkpoints and logs through it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from vit.errors import UsageError, one_line

# scheme://..., as fsspec reads it; a Windows drive (C:\) has no "//" after its colon
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_url(location: str | Path) -> bool:
    """Whether `location` is a URL (s3://bucket/key) rather than a local path. A Path is never one:
    pathlib folds the "//" of a URL (s3:/bucket/key), so a URL is kept as its string."""
    return URL.match(str(location)) is not None


def filesystem(url: str):
    """The fsspec filesystem of `url` and the path within it (the URL without its scheme)."""
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(url)
    except ImportError as e:  # fsspec's own words: "Install s3fs to access S3"
        raise UsageError(f"{url}: {one_line(e)} (pip install -e '.[stream]')") from e


def join(base: str | Path, *parts: str) -> str | Path:
    """`base` / parts: a Path for a local `base`, a URL for a URL (empty parts left out)."""
    if not is_url(base):
        return Path(base, *parts)
    return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts if p)])


def is_file(path: str | Path) -> bool:
    """Whether `path` is a file (an object, for a URL). An object store that refuses the
    credentials is a PermissionError, not a missing file."""
    if not is_url(path):
        return Path(path).is_file()
    fs, inner = filesystem(str(path))
    try:
        return fs.info(inner, refresh=True)["type"] == "file"  # not a listing s3fs kept
    except FileNotFoundError:
        return False
    except Exception as e:
        raise unreachable(str(path), e) from e


def glob(base: str | Path, pattern: str) -> list[str | Path]:
    """The files under `base` that match `pattern` (`*/checkpoints/last.ckpt`), as locations."""
    if not is_url(base):
        return list(Path(base).glob(pattern))
    fs, inner = filesystem(str(base))
    fs.invalidate_cache()  # s3fs keeps listings: another process may have written since
    try:
        found = fs.glob(f"{inner.rstrip('/')}/{pattern}")
    except Exception as e:
        raise unreachable(str(base), e) from e
    return [fs.unstrip_protocol(name) for name in found]


def modified(path: str | Path) -> float:
    """When `path` was last written, in seconds since the epoch."""
    if not is_url(path):
        return Path(path).stat().st_mtime
    fs, inner = filesystem(str(path))
    return fs.modified(inner).timestamp()


def read_bytes(path: str | Path) -> bytes:
    if not is_url(path):
        return Path(path).read_bytes()
    fs, inner = filesystem(str(path))
    return fs.cat_file(inner)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """A temporary file beside the local file `path` to write into, renamed over `path` when the
    block ends (`os.replace`, atomic within a filesystem) and removed when it raises, so that a
    process killed or stopped meanwhile (kill -9, Ctrl-C, a full disk) leaves `path` as it was:
    the old file whole, or none. The folders are made first. The temporary file is made as any
    file is (the umask's mode, as the files beside it) and named by the process (two processes may
    write one path at once: the last rename wins); a kill -9 leaves it, a dot file, behind. No
    fsync: a killed process loses nothing the kernel holds; a power cut is not covered."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> None:
    """`data` into the file `path`, whole or not at all: a local file through `atomic_file`; an
    object is one PUT, which an object store shows whole or not at all (no folders to make: s3fs's
    makedirs would create a missing bucket)."""
    if not is_url(path):
        with atomic_file(path) as temporary:
            temporary.write_bytes(data)
        return
    fs, inner = filesystem(str(path))
    fs.pipe_file(inner, data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def check_bucket(url: str) -> None:
    """That the bucket of `url` exists and the environment's credentials may reach it, checked
    before a run writes anything: Lightning would create a missing bucket (s3fs's makedirs), and
    wrong credentials would surface after the data were built. One line otherwise: a
    FileNotFoundError (no such bucket), PermissionError (credentials refused) or OSError."""
    fs, inner = filesystem(url)
    bucket = inner.strip("/").split("/", 1)[0]
    if not bucket:
        raise FileNotFoundError(f"{url} names no bucket (s3://BUCKET/PREFIX)")
    try:
        fs.info(bucket, refresh=True)  # S3: HEAD of the bucket
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{url}: there is no bucket {bucket!r} ({endpoint()})") from e
    except Exception as e:
        raise unreachable(url, e) from e


def endpoint() -> str:
    """Where the environment points S3 clients, for error messages."""
    return f"AWS_ENDPOINT_URL={os.environ['AWS_ENDPOINT_URL']}" if "AWS_ENDPOINT_URL" in os.environ else "AWS"


def unreachable(url: str, error: Exception) -> OSError:
    """An error of the object store as one line: refused credentials (PermissionError) name the
    variables they come from; anything else (no credentials at all, no server) is an OSError."""
    reason = f"{type(error).__name__}: {one_line(error)}"
    if isinstance(error, PermissionError):
        return PermissionError(
            f"{url}: access denied ({reason}); the credentials come from AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY ({endpoint()})"
        )
    return OSError(f"cannot reach {url} ({reason}; {endpoint()})")
