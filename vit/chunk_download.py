"""litdata reading chunks from an object store through `vit.storage`, the package's one client of
the store. `Downloader`, registered with litdata for s3:// when this module is imported (litdata's
public `register_downloader`), fetches each file litdata asks for: a split's index.json, its
chunks; litdata makes no other request of the store for chunks `vit.chunk_writer` wrote (no
listing: index.json names the files). `PyTreeLoader`, the item loader `chunks_dataset` gives
litdata for a URL, raises what stopped a chunk's download where the chunk is read.

Why the item loader: litdata downloads chunks ahead of the reader in a thread of its own, which
prints the traceback of an error that stops it (0.2.76) or dies of it, leaving the reader to wait
two minutes (0.2.50). So a chunk's download fails quietly there: its error, a one-line
`StoreError` naming the chunk's URL, is kept for the folder the chunk was to be written into (a
split's cache), and the reader, waiting for the chunk in `PyTreeLoader`, raises it. Every other
request (index.json, when a dataset is made; the byte ranges of `dataset[i]`) raises where it is
made.

Imported where litdata is, which it needs: by `vit.chunk_reader.chunks_dataset` when it first
makes a dataset of a URL, and by the unpickling of such a dataset in a spawned loader worker (its
item loader is `PyTreeLoader`), so that every process that reads has the downloader registered.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from litdata.streaming import downloader, item_loader

from vit import storage
from vit.errors import DataError

WAIT = 60  # seconds `PyTreeLoader` waits for a chunk, then leaves it to litdata's wait (2 minutes)
# the errors that stopped a chunk's download in this process, by the folder it was to be written into
FAILED: dict[str, DataError] = {}


class Downloader(downloader.Downloader):
    """litdata's downloader of s3:// URLs: each file through `vit.storage`, whole or not at all."""

    def __init__(self, remote_dir: str, cache_dir: str, chunks: list, storage_options=None, **kwargs):
        super().__init__(remote_dir, cache_dir, chunks, storage_options)
        FAILED.pop(os.path.normpath(cache_dir), None)  # a dataset made again tries again

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        if not os.path.exists(local_filepath):
            storage.download(remote_filepath, Path(local_filepath))

    def download_chunk_from_index(self, chunk_index: int) -> None:
        """A chunk, downloaded in litdata's thread: an error is kept for `PyTreeLoader` to raise,
        and stops the chunks after it (each would wait as long for a store out of reach)."""
        folder = os.path.normpath(self._cache_dir)
        if folder in FAILED:
            return
        try:
            super().download_chunk_from_index(chunk_index)
        except DataError as e:
            FAILED[folder] = e


class PyTreeLoader(item_loader.PyTreeLoader):
    """litdata's item loader of the chunks, which first waits for a chunk to be downloaded, and
    raises the error that stopped its download (`Downloader`) rather than wait out litdata's two
    minutes; after `WAIT` seconds it leaves the chunk to litdata's own wait. Named as litdata's:
    litdata refuses a loader whose class is named otherwise than the one index.json records."""

    def load_item_from_chunk(self, index, chunk_index, chunk_filepath, begin, filesize_bytes, *args):
        folder = os.path.normpath(os.path.dirname(chunk_filepath))
        deadline = time.monotonic() + WAIT
        while not downloaded(chunk_filepath, filesize_bytes) and time.monotonic() < deadline:
            if folder in FAILED:
                raise FAILED[folder]
            time.sleep(0.01)
        return super().load_item_from_chunk(index, chunk_index, chunk_filepath, begin, filesize_bytes, *args)

    def close(self, chunk_index: int) -> None:
        """The chunk's file closed, and forgotten: one loader serves every pass over a dataset, and
        litdata 0.2.50 kept the path, so that a pass reading that chunk first found no file open
        (0.2.76 forgets it too)."""
        super().close(chunk_index)
        self._chunk_filepath = None


def downloaded(path: str, size: int) -> bool:
    """Whether the chunk file `path` is there, whole (litdata publishes it by a rename)."""
    try:
        return os.stat(path).st_size >= size
    except FileNotFoundError:
        return False


downloader.register_downloader("s3://", Downloader, overwrite=True)
