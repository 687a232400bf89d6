"""What the commands share: their options, declared once; the network and images they read; parsing
with one-line errors; exit codes.

Each command's options are a dataclass whose fields are its options, each declared once with its
default, help and checks (`option`): the command's parser is built from it (`Command.parser`) and
its function takes it whole, so a Python caller and the command line read the same declaration.
What several commands share is a dataclass they derive from: `Source` (where the network comes
from, how many images a pass, on which device) and `Images` (the images the looking commands run
it on: image files, or test images of the checkpoint's data module).

Every error a user can cause ends a command with one line `error: ...` on stderr and, as argparse
users expect, exit status 2 for bad usage (an unknown option, a bad value: `UsageError`) or 1 for
a failure (a missing or unreadable file, a bad checkpoint, bad data). vit-train's LightningCLI
parser uses the same `OneLineErrors`.

torch, Lightning and matplotlib are imported inside the functions that use them: `--help` needs
none of them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from jsonargparse import ArgumentParser

from vit.compat import old_option_hint
from vit.errors import UsageError, one_line
from vit.memory import keep_freed_memory

if TYPE_CHECKING:
    import lightning as L
    import torch

    from vit.classifier import Classifier
    from vit.datamodules import InMemoryDataModule
    from vit.model import ViT
    from vit.preparation import Preparation

USAGE, FAILURE = 2, 1  # exit statuses
DEVICES = ("auto", "cpu", "cuda")


# ---- options declared once ----


def option(default: Any, help: str, **argparse: Any) -> Any:
    """A field of a command's options: its default, its help, and how argparse reads it (`type`,
    `metavar`, `choices`, `nargs`, `action`, `const`; `flag` where the option is spelled otherwise
    than the field, `positional` for an argument without one, `read` a function of the parsed
    value, such as "ROW,COLUMN" -> (row, column))."""
    metadata = {"help": help, **argparse}
    if isinstance(default, list | dict):  # a fresh one for each instance
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


def add_options(parser: ArgumentParser, options: type) -> None:
    """An argument of `parser` for each field of the dataclass `options`, in their order."""
    for spec in fields(options):
        argparse = dict(spec.metadata)
        argparse.pop("read", None)
        if argparse.pop("positional", False):
            parser.add_argument(spec.name, **argparse)
            continue
        default = spec.default if spec.default is not MISSING else spec.default_factory()
        if argparse.get("action") == "append":
            default = []  # argparse appends to its default: the field's value is read from the list
        parser.add_argument(
            argparse.pop("flag", f"--{spec.name}"), dest=spec.name, default=default, **argparse
        )


def read_options(options: type, parsed: dict) -> Any:
    """The dataclass `options` from what its parser read, each value passed through its `read`."""
    values = {}
    for spec in fields(options):
        read = spec.metadata.get("read")
        values[spec.name] = read(parsed[spec.name]) if read is not None else parsed[spec.name]
    return options(**values)


def parse_data_options(items: list[str]) -> dict:
    """["test_split=far", "separation=[12, 15]"] -> {"test_split": "far", "separation": [12, 15]}:
    each value read as YAML, so numbers, booleans and lists come out typed."""
    options = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UsageError(f"--data {item!r} is not KEY=VALUE")
        try:
            options[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise UsageError(f"--data {item!r}: the value is not YAML ({' '.join(str(e).split())})") from e
    return options


def data_option() -> Any:
    """--data KEY=VALUE, repeatable: the checkpoint's data module built with other arguments."""
    return option(
        {},
        "override an argument of the checkpoint's data module, as YAML (repeat for more): another "
        "folder (root=/data/other) or test set (test_split=far)",
        action="append",
        metavar="KEY=VALUE",
        read=parse_data_options,
    )


def out_option(default: str | None, what: str) -> Any:
    return option(default, f"folder for {what}", metavar="DIR")


def check_out_folder(out: str | Path | None) -> None:
    """An output folder given by the user is a folder, or not there yet (checked before any work)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")


def torch_device(device: str) -> str:
    """The device to run on: for auto, cuda if PyTorch sees a GPU, else cpu."""
    import torch

    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: PyTorch sees no CUDA device")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass
class Source:
    """Where a command's network comes from (a checkpoint of vit-train, or a model of another
    library), how many images go through it at once, and on which device."""

    ckpt: str | None = option(None, "checkpoint written by vit-train", metavar="PATH")
    model: str | None = option(
        None, "instead of --ckpt: timm:NAME, hf:REPO_ID_OR_FOLDER or a vit-export folder", metavar="SOURCE"
    )
    weights: str | None = option(
        None, "the --model's weights (.safetensors, .pth, .bin): nothing is downloaded", metavar="FILE"
    )
    datamodule: str | None = option(
        None,
        "the class of the checkpoint's data module when it is your own (vit-train fit --data "
        "mydm.Pets): mydm.Pets, imported because you name it; a checkpoint alone never imports code",
        metavar="CLASS_PATH",
    )
    batch_size: int | None = option(64, "images per forward pass", type=int, metavar="N")
    device: str = option("auto", "auto: a GPU if there is one", choices=DEVICES)

    def check_source(self) -> None:
        """A checkpoint or a model, one of them; weights with a model, a data module with a checkpoint."""
        from vit.checkpoint import check_source

        check_source(self.ckpt, self.model, self.weights, self.datamodule)

    @property
    def name(self) -> str:
        """The checkpoint's path or the model's name, for the JSON."""
        return str(self.ckpt or self.model)

    def load_vit(self) -> tuple[ViT, Preparation, str]:
        """The ViT of the checkpoint or model on its device, how image files become its input, and
        the device: what reading image files needs (no data module is built)."""
        from vit.checkpoint import load_network

        device = torch_device(self.device)
        network, preparation = load_network(self.ckpt, self.model, self.weights, self.datamodule)
        return require_vit(network, self.name).to(device), preparation, device

    def load_with_data(self, data: dict, missing: str) -> tuple[Classifier, InMemoryDataModule]:
        """The checkpoint's module and its data module, rebuilt with `data` and prepared (a download,
        where it was told to make one); `missing` says what to do when the checkpoint names none."""
        from vit.checkpoint import load_checkpoint

        classifier, datamodule = load_checkpoint(self.ckpt, data=data, datamodule_class=self.datamodule)
        if datamodule is None:
            raise ValueError(f"{self.ckpt} names no data module {missing}")
        check_datamodule(datamodule)
        datamodule.prepare_data()
        return classifier, datamodule


@dataclass
class Images(Source):
    """A `Source` and the images the looking commands run it on: image files, or test images of
    the checkpoint's data module (its class named by --datamodule when it is the user's own, its
    arguments changed by --data)."""

    data: dict = data_option()
    images: list[str] | None = option(
        None,
        "image files or folders of them; default: test images of the checkpoint's data set",
        nargs="+",
        metavar="PATH",
    )
    num_images: int = option(512, "how many test images, spread over the test split", type=int, metavar="N")

    def check(self) -> None:
        """Everything about the network and the images that can be checked before any work."""
        self.check_source()
        if self.num_images < 1 or self.batch_size < 1:
            raise UsageError(
                f"num_images={self.num_images} and batch_size={self.batch_size} must be at least 1"
            )
        self.check_images()

    def check_images(self) -> None:
        """A --model, unlike a checkpoint, names no data module: its images come from --images.
        --data changes the data module that gives test images: image files take none."""
        if self.model is not None and not self.images:
            raise UsageError("--model has no test set: give image files with --images")
        if self.images and self.data:
            raise UsageError("--data changes the data module that gives test images: not with --images")

    def load(self) -> Inputs:
        """The network, on its device, and the images: the files or folders of `images`, prepared
        as the checkpoint or model says (no data module is built), else `num_images` test images
        of the checkpoint's data module (`spread_test_images`), built as
        `vit.checkpoint.load_checkpoint` builds it."""
        from vit.datamodules import spread_test_images
        from vit.preparation import image_files, read_images

        # the model goes to its device; the images follow a chunk at a time, results come back on the CPU
        if self.images:
            network, preparation, device = self.load_vit()
            files = image_files(self.images)
            batch = read_images(files, preparation)
            return Inputs(network, device, batch, list(preparation.classes), files=files)
        device = torch_device(self.device)
        classifier, datamodule = self.load_with_data(self.data, "to take test images from; give --images")
        network = require_vit(classifier.model, self.name).to(device)
        names = [str(name) for name in datamodule.classes]
        batch, labels, indices = spread_test_images(datamodule, self.num_images)
        return Inputs(network, device, batch, names, datamodule=datamodule, indices=indices, labels=labels)


@dataclass
class Analysis(Images):
    """`Images`, and what the commands that measure the network on them (vit-attention score,
    heads, patch) add: a seed for every random draw and a folder for the results."""

    out: str | None = out_option(None, "the results' JSON and the figures; default: print only")
    seed: int = option(0, "every random draw: random maps and patches, the bootstrap's resampling", type=int)

    def check(self) -> None:
        super().check()
        check_out_folder(self.out)

    def measure(self, function: Callable[..., dict], *args, progress: str, **kwargs) -> dict:
        """`function` (`vit.interpret.score.score`, `heads.analyse`, `patching.analyse`) on `args`
        with the options' batch size and seed, and a progress bar labelled `progress`."""
        return function(
            *args, batch_size=self.batch_size, seed=self.seed, progress=progress_bar(progress), **kwargs
        )

    def settings(self, seconds: float, device: str, **described) -> dict:
        """The record of the run for the results' JSON (`settings`)."""
        return settings(
            self.name, seconds, **described, batch_size=self.batch_size, seed=self.seed, device=device
        )


def require_vit(network: torch.nn.Module, source: str) -> ViT:
    """`network` where it is a ViT with blocks: the commands that look inside read its attention
    and heads (a ViT of depth 0, the control without attention, has none)."""
    from vit.interpret.hooks import require_attention
    from vit.model import ViT

    if not isinstance(network, ViT):
        raise ValueError(f"{source} holds a {type(network).__name__}, not a ViT: it has no attention")
    require_attention(network)
    return network


def check_datamodule(datamodule: L.LightningDataModule) -> None:
    """The commands read a data module's images as vit.datamodules.InMemoryDataModule gives them
    (`split(name)`, `classes`, `evidence(name)`): a data module of the user's own derives from it."""
    from vit.datamodules import InMemoryDataModule

    if not isinstance(datamodule, InMemoryDataModule):
        raise UsageError(
            f"{type(datamodule).__name__} is not a vit.datamodules.InMemoryDataModule: the commands "
            "read its images through split(name) and classes"
        )


@dataclass
class Inputs:
    """A ViT on its device and the images a command runs it on: image files, or test images of a
    data module."""

    model: ViT
    device: str  # where the model is: cpu or cuda
    images: torch.Tensor  # (B, C, H, W), prepared as the model expects, on the CPU
    class_names: list[str]
    files: list[Path] | None = None  # the image files, in the order of `images`; or else
    datamodule: L.LightningDataModule | None = None  # the data module whose test split holds them,
    indices: list[int] | None = None  # at these indices,
    labels: torch.Tensor | None = None  # with these labels

    @property
    def description(self) -> str:
        """What the images are, for the printout and the JSON: "8 image files", "512 test images
        of TwoCircles"."""
        if self.datamodule is None:
            return f"{len(self.images)} image files"
        return f"{len(self.images)} test images of {type(self.datamodule).__name__}"

    def evidence(self) -> tuple[torch.Tensor | None, str | None]:
        """The evidence pixels of the images (B, H, W) bool where the data module knows them, and
        else None with the reason in words."""
        from vit.datamodules import ImageFolders

        if self.datamodule is None:
            return None, "image files given with --images carry no evidence"
        pixels = self.datamodule.evidence("test")
        if pixels is not None:
            return pixels[self.indices], None
        why = f"{type(self.datamodule).__name__} does not know which pixels carry its labels"
        if isinstance(self.datamodule, ImageFolders):
            why += f" (no masks in {self.datamodule.root}/masks/test/<class>/<image>.png)"
        return None, why


# ---- parsing, one-line errors, running ----


def fail(message: str | BaseException, status: int = FAILURE) -> NoReturn:
    """Print `error: <message>` on one line to stderr and exit with `status`."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def short_message(message: str) -> str:
    """jsonargparse's message on one line; for a class given by class_path, only the reason
    that class rejected the value (not the list of every type it tried)."""
    message = one_line(message)
    match = re.search(
        r'Parser key "([^"]+)": Does not validate against any of the Union subtypes.*?'
        r"Problem with given class_path '([^']+)': (.*?)(?: - Expected a <class 'NoneType'>.*)?$",
        message,
    )
    return f"{match[1]} ({match[2]}): {match[3]}" if match else message


class OneLineErrors:
    """Mixin for a jsonargparse parser: a bad option or value is one line and exit status 2,
    instead of the whole usage text."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse probing alternatives: let it handle this
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        if (hint := old_option_hint(message)) is not None:  # a config of an older version
            fail(f"{short_message(message)}: {hint}", USAGE)
        fail(f"{short_message(message)} (options: {prog} --help)", USAGE)


class Parser(OneLineErrors, ArgumentParser):
    """The parser of vit-eval, vit-attention and vit-export. Options of several words are declared
    and shown one way, with underscores as vit-train's are (`--num_images`); the hyphenated
    spelling (`--num-images`) is read as the same option."""

    def parse_args(self, args=None, *rest, **kwargs):
        args = sys.argv[1:] if args is None else [str(a) for a in args]
        return super().parse_args([self.spelled(arg) for arg in args], *rest, **kwargs)

    def spelled(self, arg: str) -> str:
        """`--num-images` (or `--num-images=8`) as the declared `--num_images`; anything else as given."""
        name, equals, value = arg.partition("=")
        declared = "--" + name[2:].replace("-", "_")
        if name.startswith("--") and declared in self._option_string_actions:
            return declared + equals + value
        return arg


def is_misconfiguration(error: BaseException) -> bool:
    """Whether `error` is Lightning's MisconfigurationException (a bad option or value). Lightning
    is not imported to find out: importing it takes seconds, and where no module has imported it,
    nothing can have raised its exception."""
    exceptions = sys.modules.get("lightning.fabric.utilities.exceptions")
    return exceptions is not None and isinstance(error, exceptions.MisconfigurationException)


def run_command(command: Callable[..., object], *args, **kwargs) -> None:
    """Call `command`; an error the user caused ends the process with one line and its status:
    a bad option or value (`UsageError`, Lightning's MisconfigurationException) 2, a file that is
    missing, unreadable or unwritable, or bad data or a bad checkpoint (`OSError`, `ValueError`) 1.
    Memory freed by one step is kept for the next (`vit.memory.keep_freed_memory`)."""
    keep_freed_memory()
    try:
        command(*args, **kwargs)
    except UsageError as e:
        fail(e, USAGE)
    except (OSError, ValueError) as e:
        fail(e, FAILURE)
    except Exception as e:
        if not is_misconfiguration(e):
            raise
        fail(e, USAGE)


@dataclass(frozen=True)
class Command:
    """A command line: its name, what it does, the dataclass of its options and the function that
    takes them; `subcommands` are the commands run by their name as the first word
    (`vit-attention score ...`)."""

    prog: str
    description: str
    options: type
    function: Callable[[Any], object]
    epilog: str | None = None
    subcommands: dict[str, Command] = field(default_factory=dict)

    def parser(self) -> Parser:
        parser = Parser(prog=self.prog, description=self.description, epilog=self.epilog)
        add_options(parser, self.options)
        return parser

    def main(self, args: list[str] | None = None) -> None:
        """Run the command on `args` (default: the process's arguments), or the subcommand its
        first word names."""
        args = sys.argv[1:] if args is None else [str(a) for a in args]
        if args[:1] and args[0] in self.subcommands:
            return self.subcommands[args[0]].main(args[1:])
        parsed = vars(self.parser().parse_args(args))
        run_command(lambda: self.function(read_options(self.options, parsed)))


# ---- what the commands print and write ----


def progress_bar(what: str) -> Callable:
    """A function that wraps an iterable of chunks in a tqdm bar labelled `what`."""
    from tqdm import tqdm

    return lambda chunks: tqdm(chunks, desc=what, unit="batch")


def settings(source, seconds: float, **options) -> dict:
    """The record of a run for its JSON: where the network came from, `options` (images, batch
    size, seed, device, ...), the seconds it took and torch's version."""
    import torch

    return {"source": str(source), **options, "seconds": round(seconds, 2), "torch": torch.__version__}


def write_outputs(out: str | Path, files: dict) -> None:
    """Write a command's texts and figures into `out` (`vit.plot.save_all`: nothing half-written)
    and say which."""
    from vit.plot import save_all

    written = save_all(Path(out), files)
    print(f"wrote {', '.join(path.name for path in written)} into {out}")
