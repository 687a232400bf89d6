"""Argument checks and the errors the commands print as one line.

The model, the data modules and the commands raise these; `vit.commands.base` turns them into
`error: ...` on stderr and an exit status: 2 for bad usage (`UsageError`: a bad option or value,
as argparse exits for a bad option), 1 for a failure (missing or unreadable files, a bad
checkpoint, an object store that cannot be reached).
"""

from __future__ import annotations


class UsageError(ValueError):
    """A bad argument value (exit status 2 in the commands)."""


class DataError(ValueError):
    """Missing, unreadable or inconsistent data files (exit status 1 in the commands)."""


class DataNotFoundError(DataError, FileNotFoundError):
    """The data files are not where the data module was told to look."""


class StoreError(DataError):
    """An object store (s3://) out of reach, refusing the credentials, or failing a request
    (`vit.storage.store_error`; exit status 1 in the commands)."""


class TrainingDiverged(ValueError):
    """The loss became infinite or nan while training (exit status 1 in the commands)."""


def require(condition: bool, message: str) -> None:
    """Raise a `UsageError` with `message` unless `condition` holds."""
    if not condition:
        raise UsageError(message)


def one_line(error: BaseException | str) -> str:
    """An error's message with its line breaks and runs of spaces made single spaces."""
    return " ".join(str(error).split())
