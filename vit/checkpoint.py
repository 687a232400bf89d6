"""Checkpoints written by vit-train: what they rebuild, and how they are written.

`read_checkpoint` (`vit.safe_load`) is the one reader of every command (vit-train's
--ckpt_path included), which refuses a file that would run code, and `build_model` rebuilds its
classifier, of the classes `vit.classifier.MODELS` holds. `load_model` rebuilds the model and its
`Preparation` (how image files become its input) from the checkpoint alone, with no data module
and no data files; `load_checkpoint` rebuilds the data module too, for evaluating on a split.
`AtomicCheckpointIO` writes checkpoints whole or not at all.

A checkpoint names its data module by class path, and only the classes of `DATAMODULES` are
rebuilt from that name: a file must not decide what code is imported. A data module of your own
(`vit-train fit --data mydm.Pets`) is imported when you name it (`datamodule_class`, the
commands' `--datamodule`).
"""

from __future__ import annotations

import importlib
import io
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from vit import storage
from vit.classifier import MODELS, Classifier
from vit.datamodules import CIFAR10, FashionMNIST, ImageFolders
from vit.errors import UsageError
from vit.preparation import Preparation
from vit.pretrained import load_source
from vit.safe_load import build_model, keyword_options, read_checkpoint, recorded_arguments
from vit.streaming import StreamingImages
from vit.two_circles import TwoCircles

# Data modules a checkpoint may name, by the class path LightningCLI records: the package's name
# for them or their module's (vit.compat renames those of older versions).
DATAMODULES: dict[str, type[L.LightningDataModule]] = {
    **{f"{module}.TwoCircles": TwoCircles for module in ("vit", "vit.two_circles")},
    **{
        f"{module}.{cls.__name__}": cls
        for cls in (CIFAR10, ImageFolders, FashionMNIST)
        for module in ("vit", "vit.datamodules")
    },
    "vit.streaming.StreamingImages": StreamingImages,
}


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written whole or not at all: into a temporary file beside the target, then
    renamed over it (`vit.storage.atomic_file`), so that a run killed at any moment leaves the
    previous last.ckpt loadable, and the checkpoint is made with the mode of the files beside it.
    Lightning writes its temporary file in the system's temporary folder and moves it into place;
    where that folder is another filesystem (a tmpfs /tmp), the move is a copy into the target, and
    a kill during it left a truncated last.ckpt. A URL (s3://...) is written by one PUT, which an
    object store shows whole or not at all (it has no rename); not as Lightning writes it, which
    creates a missing bucket and drops a PermissionError silently (`_atomic_save`); and read
    through `vit.storage` too. vit-train uses it unless the trainer is given another CheckpointIO."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage.is_url(path):
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            storage.write_bytes(str(path), buffer.getvalue())
            return
        with storage.atomic_file(path) as temporary:
            torch.save(checkpoint, temporary)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        """A URL's checkpoint read through `vit.storage`, as everything in an object store is (an
        error is one line naming the URL); a file as Lightning reads it."""
        if not storage.is_url(path):
            return super().load_checkpoint(path, map_location, weights_only)
        if not storage.is_file(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        source = io.BytesIO(storage.read_bytes(str(path)))
        return torch.load(source, map_location=map_location, weights_only=weights_only)


def _import_datamodule(given: type | str) -> type[L.LightningDataModule]:
    """The data module class a user names: the class, or its path `module.Class` (`mydm.Pets`, as
    LightningCLI records it), imported because the user named it."""
    cls = given
    if isinstance(given, str):
        module_name, _, name = given.rpartition(".")
        if not module_name or not name:
            raise UsageError(f"--datamodule {given!r} is not MODULE.CLASS (such as mydm.Pets)")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UsageError(
                f"--datamodule {given}: cannot import {module_name} ({e}; is its folder on PYTHONPATH?)"
            ) from e
        cls = getattr(module, name, None)
        if cls is None:
            raise UsageError(f"--datamodule {given}: {module_name} has no {name}")
    if not (isinstance(cls, type) and issubclass(cls, L.LightningDataModule)):
        raise UsageError(f"--datamodule {given}: not a LightningDataModule class")
    return cls


def _datamodule_class(
    dm_hparams: dict, path: str | Path, given: type | str | None = None
) -> type[L.LightningDataModule]:
    """The class the user gave (`_import_datamodule`), else the one of `DATAMODULES` the checkpoint
    names; a name not there is never imported."""
    if given is not None:
        return _import_datamodule(given)
    class_path = dm_hparams.get("_class_path")
    cls = DATAMODULES.get(class_path)
    if cls is None:
        raise UsageError(
            f"{path} names an unknown data module {class_path!r}: "
            f"pass --datamodule {class_path or 'MODULE.CLASS'} to import it"
        )
    return cls


def preparation_of(
    ckpt: dict, model: Classifier, path: str | Path, datamodule_class: type | str | None = None
) -> Preparation:
    """How image files become the input of a checkpoint's model: the preparation vit-train stored;
    for older checkpoints, the one its data module's recorded arguments describe (that module's
    class: `datamodule_class` where given); for a checkpoint without a data module, the model's
    channels and image size, its classes named by number."""
    hparams = model.hparams
    numbered = [str(i) for i in range(hparams.num_classes)]
    dm_hparams = ckpt.get("datamodule_hyper_parameters")
    if "preparation" not in ckpt and dm_hparams:  # outside the try: a missing --datamodule is bad usage
        cls = _datamodule_class(dm_hparams, path, datamodule_class)
    try:
        if "preparation" in ckpt:
            return Preparation.from_dict(ckpt["preparation"])
        if dm_hparams:
            preparation = cls.preparation_for(recorded_arguments(dm_hparams))
            # image folders recorded no class names before they were kept: number them
            return preparation if preparation.classes else replace(preparation, classes=numbered)
    except (AttributeError, TypeError, KeyError, ValueError) as e:  # ValueError: a bad value (UsageError)
        raise ValueError(f"{path} does not say how to prepare images ({type(e).__name__}: {e})") from e
    return Preparation(
        channels=hparams.get("in_channels", 3), size=hparams.get("image_size", 32), classes=numbered
    )


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu", datamodule_class: type | str | None = None
) -> tuple[Classifier, Preparation]:
    """Model (in eval mode) and preparation of a checkpoint: all that classifying or drawing image
    files needs. Builds no data module and reads no data file (`datamodule_class`: see
    `preparation_of`)."""
    ckpt = read_checkpoint(path, map_location)
    model = build_model(ckpt, path, MODELS)
    return model, preparation_of(ckpt, model, path, datamodule_class)


def check_source(
    ckpt: str | Path | None,
    model: str | None,
    weights: str | Path | None,
    datamodule_class: type | str | None = None,
) -> None:
    """A command reads a checkpoint or a model, one of them; a weights file goes with a model, a
    data module class with a checkpoint."""
    if (ckpt is None) == (model is None):
        raise UsageError("give a checkpoint (--ckpt) or a model (--model), one of them")
    if weights is not None and model is None:
        raise UsageError("--weights goes with --model (a checkpoint holds its own weights)")
    if datamodule_class is not None and ckpt is None:
        raise UsageError("--datamodule goes with --ckpt (a --model has no data module)")


def load_network(
    ckpt: str | Path | None = None,
    model: str | None = None,
    weights: str | Path | None = None,
    datamodule_class: type | str | None = None,
) -> tuple[nn.Module, Preparation]:
    """The network (in eval mode) and its preparation, from a checkpoint written by vit-train
    (`ckpt`, with `datamodule_class` for `preparation_of`) or from a model of another library or a
    vit-export folder (`model`, with an optional `weights` file: `vit.pretrained.load_source`):
    what the commands that read image files need."""
    check_source(ckpt, model, weights, datamodule_class)
    if model is not None:
        return load_source(model, weights)
    classifier, preparation = load_model(ckpt, datamodule_class=datamodule_class)
    return classifier.model, preparation


def load_checkpoint(
    path: str | Path,
    map_location: str | torch.device = "cpu",
    data: dict | None = None,
    datamodule_class: type | str | None = None,
) -> tuple[Classifier, L.LightningDataModule | None]:
    """Model (in eval mode) and data module (None if the checkpoint names none) of a checkpoint,
    for measuring the model on a split of its data: `build_model` and `load_datamodule`."""
    ckpt = read_checkpoint(path, map_location)
    return build_model(ckpt, path, MODELS), load_datamodule(path, cls=datamodule_class, data=data, ckpt=ckpt)


def load_datamodule(
    path: str | Path, cls: type | str | None = None, data: dict | None = None, ckpt: dict | None = None
) -> L.LightningDataModule | None:
    """The data module a checkpoint was trained with (None if it names none), built with the
    arguments the checkpoint recorded; `data` overrides some before it is built (another folder,
    another test split); an argument it does not take is a UsageError that lists those it does.
    Its class is `cls` where given (a class, or its path `module.Class` such as `mydm.Pets`,
    imported because you name it), else the one the checkpoint names if `DATAMODULES` holds it:
    any other name is a UsageError that says to pass --datamodule. `ckpt`: the checkpoint's
    contents where already read."""
    data = dict(data or {})
    ckpt = read_checkpoint(path) if ckpt is None else ckpt
    dm_hparams = ckpt.get("datamodule_hyper_parameters")
    if not dm_hparams:
        if data:
            raise UsageError(f"{path} names no data module, so there is none to change with {data}")
        if cls is not None:
            raise UsageError(f"{path} names no data module, so there is none to build as {cls}")
        return None
    cls = _datamodule_class(dm_hparams, path, cls)
    options = keyword_options(cls)
    unknown = sorted(set(data) - set(options))
    if unknown:
        raise UsageError(f"{cls.__name__} has no option {', '.join(unknown)}; it has {', '.join(options)}")
    try:
        return cls(**{**recorded_arguments(dm_hparams), **data})
    except TypeError as e:  # a value of the wrong type, found by the constructor
        given = f" with {data}" if data else ""
        raise UsageError(f"cannot build {cls.__name__} from {path}{given}: {e}") from e
