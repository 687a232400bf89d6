"""`vit-eval`: measure a checkpoint on its test (or validation) set, classify image files, or
compare training runs.

    vit-eval --ckpt runs/demo/train/checkpoints/best.ckpt              # print the table
    vit-eval --ckpt best.ckpt --out eval                               # and write metrics, plots
    vit-eval --ckpt best.ckpt --data test_split=far                    # another two-circles test set
    vit-eval --ckpt best.ckpt --data root=/data/other                  # another image folder
    vit-eval --ckpt best.ckpt --datamodule mydm.Pets                   # a data module of your own
    vit-eval predict --ckpt best.ckpt cat.jpg dog.png --top_k 3        # top classes as JSON
    vit-eval --model timm:deit_tiny_patch16_224 --weights deit.safetensors --data root=imagenet/val
    vit-eval predict --model hf:google/vit-base-patch16-224 cat.jpg    # models of other libraries
    vit-eval curves runs/two_circles                                   # compare training runs

The figures and their table come from `vit.metrics`; this command loads, calls, prints and
saves. Checkpoints are read without unpickling code (`vit.checkpoint`). Measuring rebuilds the
model and its data module from the checkpoint; `predict` needs only the checkpoint: its `Preparation`
says how image files become model input, and no data module is built. Everything is computed
before the first file is written; bad input stops the command with one line `error: ...` and exit
status 2 (a bad option or value) or 1 (a missing or unreadable file), and writes nothing.
`curves`, which reads training runs rather than a checkpoint, is its own module (`vit.commands.curves`).

torch, Lightning and matplotlib are imported inside the functions that use them, not at the top:
importing them takes seconds, and `vit-eval --help` needs none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vit.commands import curves
from vit.commands.base import (
    Command,
    Source,
    check_out_folder,
    data_option,
    option,
    out_option,
    torch_device,
    write_outputs,
)
from vit.errors import UsageError

SPLITS = ("test", "val")
TTA_HELP = (
    "average the probabilities of each image and its mirror image (flipped left to right); only for "
    "data whose classes survive a mirror (not two circles: a flip swaps / and \\)"
)
TTA_TRANSLATE_HELP = (
    "--tta and also each image and its mirror moved one pixel up and left and one pixel down and right "
    "(airbench's level 2: the image and its mirror weigh 1/4 each, the moved views 1/8)"
)


@dataclass
class EvalOptions(Source):
    """The options of vit-eval: `Source` (the network), the split and its data module's arguments."""

    batch_size: int | None = option(None, "images per batch; null: the data module's", type=int, metavar="N")
    split: str = option("test", "which split to measure", choices=SPLITS)
    data: dict = data_option()
    tta: bool = option(False, TTA_HELP, action="store_true")
    tta_translate: bool = option(False, TTA_TRANSLATE_HELP, action="store_true")
    out: str | None = out_option(None, "metrics.json and the plots; null: print only")


@dataclass
class Measured:
    """What `evaluate` measures: a data set, its class names, the network and how it was given."""

    network: object  # an nn.Module in eval mode
    dataset: object  # a split of a data module, or the images of a folder of class folders
    classes: list[str]
    batch_size: int
    about: dict  # where the network and the data came from, for metrics.json
    present: list[int] | None = None  # a folder's classes, where they are a subset of the model's


def evaluate(options: EvalOptions, progress: bool = True) -> dict:
    """Measure a checkpoint on a split of its data module, or a model (`model`: timm:NAME,
    hf:ID, a vit-export folder; `weights` its file) on a folder of class folders
    (data={"root": FOLDER}); print the table; with `out`, write metrics.json, confusion.png and
    reliability.png there. Returns the metrics.

    `data` overrides arguments of the data module rebuilt from the checkpoint (another folder,
    another test split); `batch_size` is the same as data={"batch_size": ...}; `datamodule`
    names its class when it is the user's own (`vit.checkpoint.load_checkpoint`). A model's class
    folders are named by its class names or, for ImageNet heads, synsets (n01440764); they may be
    a subset of its classes (a prediction of another class is wrong).
    """
    from vit.metrics import classification_metrics, collect_probabilities, metrics_table, restrict_to

    if options.split not in SPLITS:
        raise UsageError(f"unknown split {options.split!r}; choose one of {', '.join(SPLITS)}")
    options.check_source()
    device = torch_device(options.device)
    if options.batch_size is not None and options.batch_size < 1:
        raise UsageError(f"batch_size={options.batch_size} must be at least 1")
    check_out_folder(options.out)
    measured = checkpoint_split(options) if options.model is None else model_folder(options)
    probabilities, labels = collect_probabilities(
        measured.network,
        measured.dataset,
        batch_size=measured.batch_size,
        tta=tta_of(options),
        device=device,
        progress=progress,
        desc=f"{options.split} split",
    )
    classes = measured.classes
    if probabilities.shape[1] != len(classes):
        raise ValueError(
            f"the model predicts {probabilities.shape[1]} classes, the data has {len(classes)}: {classes}"
        )
    level = tta_of(options)
    about = {**measured.about, "tta": level != "none", "tta_level": level}
    metrics = {**about, **classification_metrics(probabilities, labels, classes)}
    if measured.present is not None and len(measured.present) < len(classes):
        metrics = restrict_to(metrics, measured.present, classes)
    print(metrics_table(metrics))
    if options.out is not None:
        print()
        write_outputs(options.out, evaluation_files(metrics, options))
    return metrics


def checkpoint_split(options: EvalOptions) -> Measured:
    """A checkpoint's network and a split of its data module, rebuilt with `options.data`."""
    data = dict(options.data)
    if options.batch_size is not None:
        data["batch_size"] = options.batch_size
    network, datamodule = options.load_with_data(data, "to evaluate on; vit-eval predict reads files")
    about = {
        "checkpoint": str(options.ckpt),
        "split": options.split,
        "data_module": type(datamodule).__name__,
    }
    about |= {"data_overrides": data, "data": dict(getattr(datamodule, "hparams", {}))}
    classes = [str(c) for c in datamodule.classes]
    batch_size = datamodule.hparams.get("batch_size", 128)
    return Measured(network, datamodule.split(options.split), classes, batch_size, about)


def model_folder(options: EvalOptions) -> Measured:
    """A model of another library (or a vit-export folder) and a folder of class folders."""
    from vit.checkpoint import load_network
    from vit.datamodules import class_folder_split

    data = dict(options.data)
    if options.split != "test" or set(data) != {"root"}:
        raise UsageError("with --model, give the images as --data root=FOLDER (FOLDER/<class>/<images>)")
    network, preparation = load_network(options.ckpt, options.model, options.weights)
    dataset, present = class_folder_split(Path(data["root"]), preparation)
    weights = None if options.weights is None else str(options.weights)
    about = {"model": options.model, "weights": weights, "split": "test"}
    about |= {"data_module": "class folders", "data_overrides": data, "data": data}
    return Measured(network, dataset, list(preparation.classes), options.batch_size or 64, about, present)


def evaluation_files(metrics: dict, options: EvalOptions) -> dict:
    """metrics.json, confusion.png and reliability.png, by file name."""
    import torch

    from vit.metrics import TTA_NAMES
    from vit.plot import confusion_figure, reliability_figure

    reliability = metrics["reliability"]
    tta = f", {TTA_NAMES[metrics['tta_level']]}" if metrics["tta"] else ""
    title = f"{Path(options.ckpt or options.model).name}, {options.split} split{tta}"
    return {
        "metrics.json": json.dumps(metrics, indent=2, default=str) + "\n",
        "confusion.png": confusion_figure(
            torch.tensor(metrics["confusion_matrix"]),
            list(metrics["per_class"]),
            f"confusion matrix\n{title}",
            metrics.get("confusion_columns"),
        ),
        "reliability.png": reliability_figure(
            torch.tensor(reliability["count"]),
            torch.tensor(reliability["confidence"]),
            torch.tensor(reliability["accuracy"]),
            metrics["ece"],
            title=f"{title}\n",
        ),
    }


@dataclass
class PredictOptions(Source):
    """The options of vit-eval predict: `Source` (the network) and the image files."""

    images: list[str] | None = option(None, "image files", positional=True, nargs="+", metavar="IMAGE")
    top_k: int = option(5, "how many classes to list per file", type=int, metavar="K")
    tta: bool = option(False, TTA_HELP, action="store_true")
    tta_translate: bool = option(False, TTA_TRANSLATE_HELP, action="store_true")


def tta_of(options: EvalOptions | PredictOptions) -> str:
    """The level of `vit.metrics.TTA` that --tta and --tta_translate ask for."""
    return "flip-translate" if options.tta_translate else "flip" if options.tta else "none"


def predict(options: PredictOptions) -> list[dict]:
    """Classify image files (any size or mode), prepared as the checkpoint's (or the model's)
    preparation says, and print, as JSON, each file's `top_k` classes with their probabilities,
    most probable first. Returns that list. Needs only the checkpoint: no data module, no data
    files (`datamodule`: see `vit.checkpoint.preparation_of`)."""
    from vit.checkpoint import load_network
    from vit.metrics import predict_probabilities
    from vit.preparation import read_images

    top_k, batch_size = options.top_k, options.batch_size
    if top_k < 1 or batch_size < 1:
        raise UsageError(f"top_k={top_k} and batch_size={batch_size} must be at least 1")
    device = torch_device(options.device)
    files = [Path(f) for f in options.images or []]
    if not files:
        raise UsageError("give image files to classify")
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"image not found: {file}")
    network, preparation = load_network(options.ckpt, options.model, options.weights, options.datamodule)
    classes = list(preparation.classes)
    if not classes:
        raise UsageError(f"{options.model} has no head (it outputs features): it has no classes to predict")
    network.to(device)
    results = []
    for start in range(0, len(files), batch_size):  # a batch of pictures at a time bounds the memory
        chunk = files[start : start + batch_size]
        batch = read_images(chunk, preparation).to(device)
        probabilities = predict_probabilities(network, batch, tta_of(options)).cpu()
        top = probabilities.topk(min(top_k, len(classes)), dim=-1)
        for file, values, indices in zip(chunk, top.values.tolist(), top.indices.tolist(), strict=True):
            ranked = [
                {"class": classes[i], "index": i, "probability": p}
                for p, i in zip(values, indices, strict=True)
            ]
            results.append({"file": str(file), "top_k": ranked})
    print(json.dumps(results, indent=2))
    return results


PREDICT = Command(
    prog="vit-eval predict",
    description=(
        "Classify image files of any size or mode, prepared as the checkpoint (or --model) says (as its "
        "data module prepared test images; the data itself is not needed), and print each "
        "file's top classes with their probabilities "
        'as JSON: [{"file": ..., "top_k": [{"class": ..., "index": ..., "probability": ...}]}].'
    ),
    options=PredictOptions,
    function=predict,
)
COMMAND = Command(
    prog="vit-eval",
    description=(
        "Measure a checkpoint on the test (or validation) split of the data module it was "
        "trained with: top-1 (and top-5 beyond 5 classes) accuracy, expected calibration "
        "error, negative log-likelihood and per-class accuracy. Prints a table; with --out, "
        "writes metrics.json, confusion.png and reliability.png. Checkpoints are read "
        "without unpickling code. Or measure a model of timm or Hugging Face (or a vit-export "
        "folder: --model) on a folder of class folders named by its classes or ImageNet "
        "synsets (--data root=FOLDER)."
    ),
    epilog=(
        "To classify image files: vit-eval predict --help. To compare training runs' loss and "
        "accuracy: vit-eval curves --help"
    ),
    options=EvalOptions,
    function=evaluate,
    subcommands={"predict": PREDICT, "curves": curves.COMMAND},
)
main = COMMAND.main

if __name__ == "__main__":
    main()
