"""Streaming holds memory flat as the data grows; the in-memory data modules grow with it."""

import pytest
from helpers import forked_peak_megabytes

pytest.importorskip("litdata")

from benchmarks.streaming import memory  # noqa: E402


@pytest.mark.slow
def test_peak_memory_stays_flat_from_1000_to_8000_images_where_in_memory_grows(tmp_path):
    """vit-train (one epoch) and vit-eval, each a process of its own (forked after the imports:
    the growth is the measure, not the start), on 96-px JPEGs: from 1,000 to 8,000 images the
    in-memory module's peak grows by at least the 7,000 decoded images (194 MB of uint8, so the
    measure sees data of that size), the streaming module's by under a third of that growth (it
    holds a batch, and the chunks it reads, at a time)."""
    decoded = 7000 * 3 * 96 * 96 / 2**20
    peaks = memory([1000, 8000], image_size=96, work=tmp_path, chunk_bytes="2MB", peak=forked_peak_megabytes)
    print(peaks)
    for command in ("vit-train", "vit-eval"):
        in_memory, streaming = (
            peaks[f"{command}, {module}"] for module in ("ImageFolders", "StreamingImages")
        )
        grown = in_memory[8000] - in_memory[1000]
        assert grown >= decoded, (command, peaks)
        assert streaming[8000] - streaming[1000] < grown / 3, (command, peaks)
