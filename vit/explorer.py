"""The old path of `vit.page`, kept for code that imports its names from here."""

from vit.page import (  # noqa: F401
    COLORMAPS,
    LEVELS,
    PLACEHOLDER,
    VIEWS,
    Explorer,
    colormap_tables,
    explore,
    image_data_uri,
    prefix_names,
    quantise,
)
