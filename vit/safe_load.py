"""A checkpoint written by vit-train, read the one safe way (`read_checkpoint`), and the classifier
it rebuilds (`build_model`) of the classes its caller names.

The file is loaded with `weights_only=True` (tensors and plain containers only), so a checkpoint
that would run code when unpickled is refused and none of its code runs; a missing, truncated or
foreign file is one line naming it. This module imports no classifier, so that a classifier can
use it too: a ViTClassifier's teacher is read with it (`vit.teacher.load_teacher`), every other
checkpoint through `vit.checkpoint`; both give `build_model` the classes a checkpoint may name
(`vit.classifier.MODELS`).
"""

from __future__ import annotations

import inspect
import io
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import lightning as L
import torch

from vit import compat, storage
from vit.errors import one_line


def recorded_arguments(hparams: dict) -> dict:
    """The constructor arguments a checkpoint recorded: its hyper-parameters without LightningCLI's
    own keys (`_class_path`, `_instantiator`)."""
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


def keyword_options(cls: type) -> list[str]:
    """The keyword arguments `cls(...)` takes (its constructor's own)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [
        p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """The contents of a checkpoint written by vit-train (of any version: `vit.compat` upgrades
    older ones to today's format), read without unpickling code. A missing
    file is a FileNotFoundError; a file that would run code, a truncated or corrupt one, or one
    that is no vit-train checkpoint a ValueError: each a line that names the file. `path` may be a
    URL (s3://bucket/.../best.ckpt, `vit.storage`)."""
    path = str(path) if storage.is_url(path) else Path(path)
    if not storage.is_file(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    source = io.BytesIO(storage.read_bytes(path)) if isinstance(path, str) else path
    try:
        ckpt = torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e) or "allowed global" in str(e):  # code it would run
            raise ValueError(f"refusing {path}: it is not a plain-tensor checkpoint ({_reason(e)})") from e
        raise ValueError(f"{path} is not a readable checkpoint (not a torch.save file?)") from e
    except (EOFError, OSError, RuntimeError, ValueError) as e:  # the zip reader on a cut file: OSError
        raise ValueError(
            f"{path} is not a readable checkpoint (truncated or corrupt? {one_line(e)[:200]})"
        ) from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint written by vit-train")
    return compat.checkpoint(ckpt)


def build_model(
    ckpt: dict, path: str | Path, models: Mapping[str, type[L.LightningModule]]
) -> L.LightningModule:
    """The classifier of a checkpoint's contents, with its weights, in eval mode: of the class of
    `models` (class path -> class: `vit.classifier.MODELS`) that the checkpoint names, or a
    ViTClassifier where it names none."""
    hparams = ckpt["hyper_parameters"]
    model_class = models.get(hparams.get("_class_path", "vit.ViTClassifier"))
    if model_class is None:
        raise ValueError(f"{path} names an unknown model {hparams['_class_path']!r}")
    # options or weights this version does not have: one line, not a traceback
    name, hint = model_class.__name__, "written by another version of vit?"
    # the options of its class and of the classes it passes the rest on to (**kwargs)
    known = {name for cls in model_class.__mro__ if "__init__" in vars(cls) for name in keyword_options(cls)}
    unknown = sorted(set(recorded_arguments(hparams)) - known)
    if unknown:
        raise ValueError(f"cannot rebuild {name} from {path} ({hint}): no option {', '.join(unknown)}")
    model = model_class(**recorded_arguments(hparams))
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:
        if (reason := state_dict_mismatch(e)) is None:
            raise
        raise ValueError(f"cannot rebuild {name} from {path} ({hint}): {reason}") from e
    return model.eval()
