"""Locations that are either local paths or object-store URLs (`s3://bucket/prefix`), and the one
client of the object store: whatever this package keeps there (streamed chunks, run folders,
checkpoints, config.yaml, logs) is read and written through fsspec (s3fs for s3://).

Why fsspec: Lightning writes checkpoints and logs through fsspec and cannot be made to use another
client, so everything else goes through it too: the chunks `vit.chunk_writer` uploads, and those
litdata reads, through the downloader `vit.chunk_reader` registers with litdata for s3://. One
client means one set of settings and one error vocabulary, whichever file a run was reading or
writing when the store went away.

The endpoint, region and credentials come from the environment only (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, or AWS_PROFILE), as botocore reads
them. Every S3 filesystem fsspec makes in this process, Lightning's included, is given `CLIENT`
(few tries, short time-outs) through fsspec's configuration of the s3 protocol, set when this
module first makes one (a configuration of the user's own, `~/.config/fsspec/`, wins).

What goes wrong reaching the store is one line naming the URL and the endpoint (`store_error`, and
`errors` around every request made here): a bucket or object that is not there, no credentials,
credentials refused, a server out of reach.

A local location stays a `pathlib.Path` and is handled as before. An object store has no folders
to make and no rename: an object is written by one PUT, which it shows whole or not at all, so a
URL is written directly, never through a temporary object.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from vit.errors import DataError, DataNotFoundError, StoreError, UsageError, one_line

# scheme://..., as fsspec reads it; a Windows drive (C:\) has no "//" after its colon
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")
# botocore's client settings: a server that went away fails a request within seconds, not after
# botocore's default minute to connect and five tries
CLIENT = {"connect_timeout": 5, "read_timeout": 30, "retries": {"total_max_attempts": 3, "mode": "standard"}}
# what the object store answers when the credentials are not accepted (403 to a HEAD, which has no body)
REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
           "403"}  # fmt: skip


def is_url(location: str | Path) -> bool:
    """Whether `location` is a URL (s3://bucket/key) rather than a local path. A Path is never one:
    pathlib folds the "//" of a URL (s3:/bucket/key), so a URL is kept as its string."""
    return URL.match(str(location)) is not None


def filesystem(url: str):
    """The fsspec filesystem of `url` and the path within it (the URL without its scheme)."""
    from fsspec.config import conf
    from fsspec.core import url_to_fs

    conf.setdefault("s3", {}).setdefault("config_kwargs", CLIENT)
    try:
        return url_to_fs(url)
    except ImportError as e:  # fsspec's own words: "Install s3fs to access S3"
        raise UsageError(f"{url}: {one_line(e)} (pip install -e '.[stream]')") from e


def join(base: str | Path, *parts: str) -> str | Path:
    """`base` / parts: a Path for a local `base`, a URL for a URL (empty parts left out)."""
    if not is_url(base):
        return Path(base, *parts)
    return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts if p)])


# ---- the object store's errors as one line ----


def endpoint() -> str:
    """Where the environment points S3 clients, for messages."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS's S3"


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was raised from (s3fs raises an OSError from botocore's)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def botocore_errors():
    """botocore's exceptions module, where it is imported: where it is not, nothing reached a
    store (s3fs imports it), and it is not imported to find out."""
    return sys.modules.get("botocore.exceptions")


def is_store_error(error: BaseException) -> bool:
    """Whether botocore, the client under s3fs, raised `error` or an error it comes from."""
    botocore = botocore_errors()
    return botocore is not None and any(
        isinstance(e, botocore.BotoCoreError | botocore.ClientError) for e in causes(error)
    )


def store_error(url: str, error: BaseException) -> DataError:
    """`error`, raised reaching the object store for `url` (botocore's, or the OSError s3fs made
    of it), as the one line the commands print, naming `url` and the endpoint: a bucket or object
    that is not there (`DataNotFoundError`), no credentials, credentials refused, a server out of
    reach, anything else (`StoreError`). An error of ours already says where: it is kept."""
    if isinstance(error, DataError):
        return error
    where, botocore = endpoint(), botocore_errors()
    said = [
        e.response.get("Error", {}) for e in causes(error) if isinstance(getattr(e, "response", None), dict)
    ]
    answer = next((a for a in said if a.get("Code")), {})  # what the store answered, if it answered
    code = answer.get("Code")
    reason = (
        f"{code}: {one_line(answer.get('Message') or '')}"
        if code
        else f"{type(error).__name__}: {one_line(error)}"
    )

    def raised(*kinds: str | type) -> bool:  # by `error` or an error it comes from
        types = tuple(getattr(botocore, k, ()) if isinstance(k, str) else k for k in kinds)
        return any(isinstance(e, types) for e in causes(error))

    if raised("NoCredentialsError"):
        return StoreError(
            f"{url}: no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            f"AWS_PROFILE) in the environment"
        )
    if code == "NoSuchBucket":
        return DataNotFoundError(f"{url}: there is no bucket {bucket(url)!r} at {where}")
    if isinstance(error, FileNotFoundError) or code in ("NoSuchKey", "404"):
        return DataNotFoundError(f"{url}: not found at {where}")
    if isinstance(error, PermissionError) or code in REFUSED:
        return StoreError(
            f"{url}: {where} refused access ({reason}); the credentials come from the environment "
            f"(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )
    if raised(ConnectionError, TimeoutError, "ConnectionError", "HTTPClientError"):
        return StoreError(f"{url}: cannot reach {where} ({reason})")
    return StoreError(f"{url}: {reason} ({where})")


@contextlib.contextmanager
def errors(url: str) -> Iterator[None]:
    """A request to the object store for `url` in the block: what goes wrong is one line
    (`store_error`)."""
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        if not (isinstance(e, OSError) or is_store_error(e)):
            raise
        raise store_error(url, e) from e


def bucket(url: str) -> str:
    """The bucket of `url` (s3://bucket/prefix)."""
    return str(url).partition("://")[2].split("/", 1)[0]


def check_bucket(url: str) -> None:
    """That the bucket of `url` exists and the environment's credentials may reach it, checked
    before anything is written or read there: Lightning would create a missing bucket (s3fs's
    makedirs), and wrong credentials would surface after the data were built."""
    fs, _ = filesystem(url)
    name = bucket(url)
    if not name:
        raise UsageError(f"{url} names no bucket (s3://BUCKET/PREFIX)")
    try:
        with errors(url):
            fs.info(name, refresh=True)  # S3: HEAD of the bucket
    except DataNotFoundError as e:
        raise DataNotFoundError(f"{url}: there is no bucket {name!r} at {endpoint()}") from e


# ---- reading and writing a location ----


def is_file(path: str | Path) -> bool:
    """Whether `path` is a file (an object, for a URL). An object store that refuses the
    credentials is a `StoreError`, not a missing file."""
    if not is_url(path):
        return Path(path).is_file()
    fs, inner = filesystem(str(path))
    try:
        with errors(str(path)):
            return fs.info(inner, refresh=True)["type"] == "file"  # not a listing s3fs kept
    except DataNotFoundError:
        return False


def is_empty(url: str) -> bool:
    """Whether no object's key starts with the prefix of `url` (its bucket checked first)."""
    check_bucket(url)
    fs, inner = filesystem(url)
    try:
        with errors(url):
            return not fs.ls(inner, refresh=True)
    except DataNotFoundError:  # s3fs: a prefix with no object under it
        return True


def glob(base: str | Path, pattern: str) -> list[str | Path]:
    """The files under `base` that match `pattern` (`*/checkpoints/last.ckpt`), as locations."""
    if not is_url(base):
        return list(Path(base).glob(pattern))
    fs, inner = filesystem(str(base))
    fs.invalidate_cache()  # s3fs keeps listings: another process may have written since
    with errors(str(base)):
        found = fs.glob(f"{inner.rstrip('/')}/{pattern}")
    return [fs.unstrip_protocol(name) for name in found]


def modified(path: str | Path) -> float:
    """When `path` was last written, in seconds since the epoch."""
    if not is_url(path):
        return Path(path).stat().st_mtime
    fs, inner = filesystem(str(path))
    with errors(str(path)):
        return fs.modified(inner).timestamp()


def read_bytes(path: str | Path) -> bytes:
    if not is_url(path):
        return Path(path).read_bytes()
    fs, inner = filesystem(str(path))
    with errors(str(path)):
        return fs.cat_file(inner)


def download(url: str, path: Path) -> None:
    """The object `url` into the local file `path`, whole or not at all (`atomic_file`)."""
    fs, inner = filesystem(url)
    with atomic_file(path) as temporary, errors(url):  # a local folder that fails is not the store's
        fs.get_file(inner, str(temporary))


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
    with errors(str(path)):
        fs.pipe_file(inner, data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def upload(path: Path, url: str) -> None:
    """The local file `path` as the object `url`."""
    fs, inner = filesystem(url)
    with errors(url):
        fs.put_file(str(path), inner)


def remove(urls: list[str]) -> None:
    """Delete the objects `urls` (of one bucket: one request for up to 1000)."""
    if urls:
        fs, _ = filesystem(urls[0])
        with errors(urls[0]):
            fs.rm([filesystem(url)[1] for url in urls])
