"""Rebuild a trained classifier and its data module from a checkpoint, without unpickling code."""

from __future__ import annotations

import contextlib
import inspect
import pickle
import re
from pathlib import Path

import lightning as L
import torch

from vit.classifier import Classifier, CNNClassifier, ViTClassifier
from vit.data import TwoCircles
from vit.images import CIFAR10, FashionMNIST, ImageFolders, files_optional

# Models a checkpoint may name, by the class path LightningCLI records (either spelling);
# checkpoints without one hold a ViTClassifier.
MODELS: dict[str, type[Classifier]] = {
    f"{module}.{cls.__name__}": cls
    for cls in (ViTClassifier, CNNClassifier)
    for module in ("vit", "vit.classifier")
}

# Data modules a checkpoint may name, by the class path LightningCLI records (either spelling).
DATAMODULES: dict[str, type[L.LightningDataModule]] = {
    "vit.data.TwoCircles": TwoCircles,
    **{
        f"{module}.{cls.__name__}": cls
        for cls in (CIFAR10, ImageFolders, FashionMNIST)
        for module in ("vit", "vit.images")
    },
}


def _public(hparams: dict) -> dict:
    return {k: v for k, v in hparams.items() if not k.startswith("_")}


def _reason(error: pickle.UnpicklingError) -> str:
    """What the file wanted unpickled, out of torch's many-line advice (such as
    "Unsupported global: GLOBAL builtins.print")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # no terminal colours in a one-line error
    match = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global|\.?$)", text, re.MULTILINE)
    return match[1] if match else text.strip().splitlines()[0]


def state_dict_mismatch(error: RuntimeError) -> str | None:
    """torch's many-line report of weights that do not fit a model, on one line of at most about
    300 characters; None for any other RuntimeError."""
    text = " ".join(line.strip() for line in str(error).strip().splitlines())
    if not text.startswith("Error(s) in loading state_dict"):
        return None
    return text if len(text) <= 300 else text[:300] + " ..."


def _options(cls: type) -> list[str]:
    """The keyword arguments `cls(...)` takes."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [
        p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def load_checkpoint(
    path: str | Path,
    map_location: str | torch.device = "cpu",
    data: dict | None = None,
    need_data: bool = True,
) -> tuple[Classifier, L.LightningDataModule | None]:
    """Model (in eval mode) and data module (None if the checkpoint names none) of a checkpoint.

    The file is read with `weights_only=True`: tensors and plain containers only. A checkpoint
    that needs arbitrary unpickling is refused with a ValueError, and none of its code runs.
    `data` overrides arguments of the data module before it is built (another folder, another
    test split); an argument it does not take is a ValueError that lists those it does.
    `need_data=False` (for image files given by the user): the data module is built even where
    its files are absent, to name the classes and prepare pictures; reading a split then fails.
    """
    path, data = Path(path), dict(data or {})
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"refusing {path}: it is not a plain-tensor checkpoint ({_reason(e)})") from e
    except (EOFError, RuntimeError) as e:
        raise ValueError(f"{path} is not a readable checkpoint: {e}") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint written by vit-train")
    hparams = ckpt["hyper_parameters"]
    model_class = MODELS.get(hparams.get("_class_path", "vit.ViTClassifier"))
    if model_class is None:
        raise ValueError(f"{path} names an unknown model {hparams['_class_path']!r}")
    # options or weights this version does not have: one line, not a traceback
    name, hint = model_class.__name__, "written by another version of vit?"
    unknown = sorted(set(_public(hparams)) - set(_options(model_class)) - set(_options(Classifier)))
    if unknown:
        raise ValueError(f"cannot rebuild {name} from {path} ({hint}): no option {', '.join(unknown)}")
    model = model_class(**_public(hparams))
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:
        if (reason := state_dict_mismatch(e)) is None:
            raise
        raise ValueError(f"cannot rebuild {name} from {path} ({hint}): {reason}") from e
    model.eval()
    datamodule = None
    if dm_hparams := ckpt.get("datamodule_hyper_parameters"):
        cls = DATAMODULES.get(dm_hparams.get("_class_path"))
        if cls is None:
            raise ValueError(f"{path} names an unknown data module {dm_hparams.get('_class_path')!r}")
        options = _options(cls)
        unknown = sorted(set(data) - set(options))
        if unknown:
            raise ValueError(
                f"{cls.__name__} has no option {', '.join(unknown)}; it has {', '.join(options)}"
            )
        try:
            with contextlib.nullcontext() if need_data else files_optional():
                datamodule = cls(**{**_public(dm_hparams), **data})
        except TypeError as e:  # a value of the wrong type, found by the constructor
            given = f" with {data}" if data else ""
            raise ValueError(f"cannot build {cls.__name__} from {path}{given}: {e}") from e
    elif data:
        raise ValueError(f"{path} names no data module, so there is none to change with {data}")
    return model, datamodule
