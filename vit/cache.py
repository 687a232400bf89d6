"""The on-disk cache of decoded image folders.

A split decoded from image files is saved as one file of uint8 tensors in `<root>/.vit-cache/`
(or `~/.cache/vit/` when the data folder is read-only), with a signature of the file names, sizes
and modification times it was made from: the next run loads it in a fraction of a second, and a
changed file, or a cache file that cannot be read, rebuilds it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path

import torch

from vit.errors import one_line
from vit.storage import atomic_file

USER_CACHE = Path.home() / ".cache" / "vit"  # the cache when the data folder is read-only
CACHE_VERSION = 1  # bump when the decoding changes, so old caches are rebuilt


def report(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def writable(folder: Path) -> bool:
    """Whether a cache may go into `folder`: it is writable and its permission bits allow writing
    (root may write anywhere, but a data share without write bits is meant to stay as it is)."""
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def cache_folders(root: Path) -> list[Path]:
    """Where the cache of a data folder may go, in order of preference."""
    root = root.resolve()
    user = USER_CACHE / f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    return [root / ".vit-cache", user] if writable(root) else [user]


def load_cache(path: Path, signature: str) -> dict | None:
    """The cache at `path` if it exists and was made from the same files, else None. A file that
    cannot be read (truncated, corrupt) is reported in a one-line warning, then rebuilt."""
    if not path.is_file():
        return None
    try:
        cache = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        report(f"warning: the cache file {path} cannot be read ({one_line(e)[:200]}); decoding again")
        return None
    ok = isinstance(cache, dict) and cache.get("signature") == signature
    return cache if ok and cache.get("version") == CACHE_VERSION else None


def save_cache(root: Path, name: str, cache: dict) -> Path | None:
    """Write the cache into the first folder of `cache_folders(root)` that takes it, whole or not at
    all (`atomic_file`: several processes may build it at once, and a run stopped meanwhile leaves
    no partial file). None if no folder does."""
    for folder in cache_folders(root):
        try:
            with atomic_file(folder / name) as temporary:
                torch.save(cache, temporary)
            return folder / name
        except OSError:
            continue
    return None
