"""Each command's options are one dataclass (`vit.commands.base.option`): its parser and a Python
caller read the same declaration, so their defaults, help and conversions cannot drift apart."""

from dataclasses import fields

import pytest

from vit.commands import attention, chunks, eval, export
from vit.commands.base import Command, Images, read_options

COMMANDS = [attention.COMMAND, eval.COMMAND, export.COMMAND, chunks.COMMAND]
COMMANDS += [sub for command in list(COMMANDS) for sub in command.subcommands.values()]
REQUIRED = {"ckpt": "x.ckpt", "out": "folder", "root": "images", "images": ["a.png"], "runs": ["runs/a"]}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.prog for c in COMMANDS])
def test_the_command_line_and_python_read_one_declaration(command: Command):
    parser = command.parser()
    actions = {action.dest: action for action in parser._actions}
    for spec in fields(command.options):
        assert actions[spec.name].help == spec.metadata["help"], spec.name
    required = {a.dest for a in parser._actions if a.required}
    given = {name: REQUIRED[name] for name in required}
    args = [word for value in given.values() if isinstance(value, list) for word in value]  # positional
    for name, value in given.items():
        if not isinstance(value, list):
            args += [f"--{name}", value]
    parsed = read_options(command.options, vars(parser.parse_args(args)))
    assert parsed == command.options(**given)  # no option given: the dataclass's own defaults


def test_an_option_is_read_as_declared():
    parsed = vars(
        attention.COMMAND.parser().parse_args(["--ckpt", "x", "--data", "a=1", "--data", "b=[2, 3]"])
    )
    options = read_options(attention.AttentionOptions, parsed)
    assert options.data == {"a": 1, "b": [2, 3]} and options.num_images == 8
    score = attention.COMMAND.subcommands["score"]
    assert read_options(score.options, vars(score.parser().parse_args(["--no_sanity"]))).sanity is False
    parsed = vars(chunks.COMMAND.parser().parse_args(["--root", "r", "--out", "o", "--val_size", "500"]))
    assert read_options(chunks.ChunksOptions, parsed).val_size == 500  # a count, not a fraction


def test_the_subcommands_are_named_in_one_place():
    assert set(attention.COMMAND.subcommands) == {"score", "heads", "patch"}
    assert set(eval.COMMAND.subcommands) == {"predict", "curves"}
    for sub in attention.COMMAND.subcommands.values():
        assert issubclass(sub.options, Images) and sub.prog.startswith("vit-attention ")


def test_a_python_caller_gets_the_checks_of_the_command_line():
    from vit.errors import UsageError

    with pytest.raises(UsageError, match="one of them"):
        Images().check()
    with pytest.raises(UsageError, match="--model has no test set"):
        Images(model="timm:vit_tiny_patch16_224").check()
    with pytest.raises(UsageError, match="must be at least 1"):
        Images(ckpt="x.ckpt", num_images=0).check()
