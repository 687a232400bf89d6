"""What the commands share: parsing with one-line errors, and exit codes.

Every error a user can cause ends a command with one line `error: ...` on stderr and, as argparse
users expect, exit status 2 for bad usage (an unknown option, a bad value: `UsageError`) or 1 for
a failure (a missing or unreadable file, a bad checkpoint, bad data). vit-train's LightningCLI
parser uses the same `OneLineErrors`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from jsonargparse import ArgumentParser

from vit.commands.inputs import DEVICES, parse_data_options
from vit.compat import old_option_hint
from vit.errors import UsageError, one_line

USAGE, FAILURE = 2, 1  # exit statuses


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


def add_source_arguments(parser: Parser) -> None:
    """--ckpt (with --datamodule for a data module of the user's own), or --model with an optional
    --weights: where a command's network comes from."""
    parser.add_argument("--ckpt", default=None, metavar="PATH", help="checkpoint written by vit-train")
    parser.add_argument(
        "--datamodule",
        dest="datamodule_class",
        default=None,
        metavar="CLASS_PATH",
        help="the class of the checkpoint's data module when it is your own (vit-train fit --data "
        "mydm.Pets): mydm.Pets, imported because you name it; a checkpoint alone never imports code",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="SOURCE",
        help="instead of --ckpt: timm:NAME, hf:REPO_ID_OR_FOLDER or a folder written by vit-export",
    )
    parser.add_argument(
        "--weights",
        default=None,
        metavar="FILE",
        help="the --model's weights (.safetensors, .pth, .bin): nothing is downloaded",
    )


def add_images_argument(parser: Parser) -> None:
    """--images: image files instead of the checkpoint's test images (`vit.commands.inputs`)."""
    parser.add_argument(
        "--images",
        nargs="+",
        default=None,
        metavar="PATH",
        help="image files or folders of them; default: test images of the checkpoint's data set",
    )


def add_data_argument(parser: Parser) -> None:
    """--data KEY=VALUE, repeatable: the checkpoint's data module built with other arguments
    (`vit.commands.inputs.parse_data_options` reads them)."""
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an argument of the checkpoint's data module, as YAML (repeat for more): another "
        "folder (root=/data/other) or test set (test_split=far)",
    )


def add_device_argument(parser: Parser) -> None:
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: a GPU if there is one")


def check_out_folder(out: str | Path | None) -> None:
    """An output folder given by the user is a folder, or not there yet (checked before any work)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")


def is_misconfiguration(error: BaseException) -> bool:
    """Whether `error` is Lightning's MisconfigurationException (a bad option or value). Lightning
    is not imported to find out: importing it takes seconds, and where no module has imported it,
    nothing can have raised its exception."""
    exceptions = sys.modules.get("lightning.fabric.utilities.exceptions")
    return exceptions is not None and isinstance(error, exceptions.MisconfigurationException)


def run_command(command: Callable[..., object], *args, **kwargs) -> None:
    """Call `command`; an error the user caused ends the process with one line and its status:
    a bad option or value (`UsageError`, Lightning's MisconfigurationException) 2, a file that is
    missing, unreadable or unwritable, or bad data or a bad checkpoint (`OSError`, `ValueError`) 1."""
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


def run_parsed(command: Callable[..., object], parser: Parser, args: list[str], **derived) -> None:
    """Parse `args` with `parser` and `run_command` `command` with the options as keywords, the
    `--data KEY=VALUE` items read into a dict; `derived` maps an option to a function of its value
    that gives (keyword, value) instead."""
    options = vars(parser.parse_args(args))
    for name, derive in derived.items():
        key, value = derive(options.pop(name))
        options[key] = value
    options["data"] = parse_data_options(options.get("data") or [])
    run_command(lambda: command(**options))


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
