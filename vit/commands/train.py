r"""`vit-train` (and `python train.py`): a LightningCLI over ViTClassifier and the data modules.

    vit-train fit --config configs/two_circles.yaml
    vit-train test --config configs/two_circles.yaml \
        --ckpt_path runs/two_circles/version_0/checkpoints/best.ckpt
    vit-train fit --config configs/two_circles.yaml --ckpt_path last   # resume the latest run

Every run writes `runs/<name>/version_N/` with the resolved `config.yaml`, `metrics.csv` and
`checkpoints/best.ckpt` (highest val/acc) plus `checkpoints/last.ckpt`. Bad input is one line
`error: ...` and exit status 2 (a bad option or value) or 1 (missing data, a bad checkpoint), as
for vit-eval and vit-attention (`vit.commands.base`); a checkpoint given to --ckpt_path is read
(safely) before anything is built or written.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from jsonargparse import Namespace, get_loader, set_loader
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.callbacks.progress import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import CheckpointIO
from yaml import YAMLError

from vit import compat, optim, storage
from vit.callbacks import (
    LastCheckpoint,
    ModelSummary,
    ProgressBar,
    ResumedMetrics,
    SameCheckpoint,
    log_artifact,
    run_folder,
)
from vit.captured_step import cpu_compiler
from vit.checkpoint import AtomicCheckpointIO
from vit.classifier import Classifier
from vit.commands.base import OneLineErrors, run_command
from vit.errors import DataError, UsageError, one_line
from vit.safe_load import read_checkpoint, state_dict_mismatch

# Values of --ckpt_path that Lightning resolves itself rather than reading as a file.
SPECIAL_CKPT_PATHS = {"last", "best", "hpc", "registry"}

DESCRIPTION = (
    "Train a ViT (or a CNN baseline) on a data module, or validate, test or predict with a "
    "checkpoint: every option of the model, the data and Lightning's Trainer is a flag or a YAML "
    "key (vit-train fit --config configs/two_circles.yaml)."
)
# One line each in `vit-train --help` (Lightning's are the first lines of the Trainer's
# docstrings, cut mid-sentence: "... to make sure you never run on your").
SUBCOMMANDS = {
    "fit": "Train, validating after each epoch; checkpoints best.ckpt and last.ckpt.",
    "validate": "One pass over the validation split (--ckpt_path: which weights).",
    "test": "One pass over the test split (--ckpt_path: which weights).",
    "predict": "Class probabilities for the predict split (--ckpt_path: which weights).",
}

# What Lightning prints that is not the user's business: an advertisement, a note on how it
# counts the schedule's steps, and a deprecation inside Lightning (torch's LeafSpec).
LIGHTNING_CHATTER = (
    "💡 Tip:",
    "Loading `train_dataloader` to estimate number of stepping batches",
    "Trainer already configured with model summary callbacks",  # ours (vit.callbacks)
)
# the loggers of rank_zero_info: Fabric's, and Lightning's once lightning.pytorch is imported
RANK_ZERO_LOGGERS = ("lightning.fabric.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero")
LIGHTNING_WARNINGS = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def not_chatter(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LIGHTNING_CHATTER)


@contextmanager
def quiet_lightning():
    """Leave out Lightning's `LIGHTNING_CHATTER` and `LIGHTNING_WARNINGS` while vit-train runs."""
    loggers = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    for logger in loggers:
        logger.addFilter(not_chatter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LIGHTNING_WARNINGS, category=FutureWarning)
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(not_chatter)


# Every config value (a file, a run's saved config.yaml, a value on the command line) read as YAML,
# then with the old class paths of classes that moved made today's (vit.compat)
CONFIG_MODE = "vit"
set_loader(CONFIG_MODE, lambda text: compat.moved_class_paths(get_loader("yaml")(text)), (YAMLError,))


class Parser(OneLineErrors, LightningArgumentParser):
    """vit-train's parser."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parser_mode", CONFIG_MODE)  # the subcommands' parsers are given their parent's
        super().__init__(*args, **kwargs)


def on_cpu(accelerator) -> bool:
    accelerator = str(accelerator)
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def compile_for_this_cpu(model: Namespace, accelerator) -> None:
    """torch.compile on a CPU writes C++ kernels (inductor): where no C++ compiler is found, the
    model (`model.init_args`: compile, capture_step) trains eagerly, the same maths more slowly
    (configs/cifar10_cpu.yaml compiles: 1.20x the steps), and vit-train says so in one line."""
    options = model.get("init_args") or {}
    if not options.get("compile") or not on_cpu(accelerator) or cpu_compiler() is not None:
        return
    print(
        "note: torch.compile on a CPU needs a C++ compiler (g++ or clang++, or $CXX) and none was "
        "found: training eagerly, the same maths more slowly (install one to compile)",
        file=sys.stderr,
    )
    options.compile, options.capture_step = False, False


def precision_for_this_cpu(precision: str | int | None, accelerator) -> str | int | None:
    """The precision to train in. bf16 on a CPU without native bf16 instructions (AVX-512 BF16 or
    AMX) is emulated: on a 2-core AMD EPYC with AVX2 only, configs/cifar10_cpu.yaml trained 18x
    slower in bf16-mixed than in fp32 (0.13 against 2.4 steps/s), so a config written for bf16
    CPUs would spend its time budget on a few hundred steps. There we train in 32-true instead and
    say so in one line; everywhere else the precision is kept as given (None included)."""
    if str(precision).startswith("bf16") and on_cpu(accelerator) and not optim.cpu_has_native_bf16():
        print(
            f"note: this CPU has no native bf16 (AVX-512 BF16 or AMX), where precision {precision} "
            f"is emulated and many times slower than fp32: training in 32-true",
            file=sys.stderr,
        )
        return "32-true"
    return precision


class SaveConfig(SaveConfigCallback):
    """LightningCLI's config.yaml, written into the run's own folder, where its checkpoints go
    (`vit.callbacks.run_folder`), and logged to MLflow as an artifact. Lightning's default writes it
    into `trainer.log_dir`, which for an MLflow logger is the store that every run shares (or None
    with a tracking server: its assertion failed before training began); with
    `save_to_log_dir=False` it calls this `save_config` instead, on the first process only."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        path = storage.join(run_folder(trainer), self.config_filename)
        if storage.is_url(path):  # one object, as vit.storage writes them
            storage.write_text(path, self.parser.dump(self.config, skip_unset=False))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.parser.save(
                self.config, path, skip_none=False, overwrite=self.overwrite, multifile=self.multifile
            )
        log_artifact(trainer, path)


class ViTCLI(LightningCLI):
    def _add_subcommands(self, parser, **kwargs) -> None:
        for name, text in SUBCOMMANDS.items():
            kwargs.setdefault(name, {}).setdefault("description", text)
        super()._add_subcommands(parser, **kwargs)
        for action in parser._subcommands_action._choices_actions:
            action.help = SUBCOMMANDS.get(action.dest, action.help)

    def instantiate_trainer(self, **kwargs):
        """Lightning's Trainer with our progress bar and model summary (`vit.callbacks`) in place of
        its defaults, unless the config turns them off or names its own, a check that every
        process resumed from the same checkpoint (`SameCheckpoint`), and checkpoints written
        atomically (`AtomicCheckpointIO`) unless it names another CheckpointIO."""
        config = self._get(self.config_init, "trainer", default={})
        callbacks = config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        for kind, ours, switch in (
            (LightningProgressBar, ProgressBar, "enable_progress_bar"),
            (LightningModelSummary, ModelSummary, "enable_model_summary"),
        ):
            if config.get(switch) is not False and not any(isinstance(c, kind) for c in callbacks):
                callbacks.append(ours())
        if not any(isinstance(c, SameCheckpoint) for c in callbacks):
            callbacks.append(SameCheckpoint())  # every process resumes from the same checkpoint
        plugins = config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())  # a run killed while it writes keeps last.ckpt
        try:
            return super().instantiate_trainer(**kwargs, callbacks=callbacks, plugins=plugins)
        except RuntimeError as e:
            # two callbacks of one kind that `one_callback_a_kind` leaves apart and Lightning cannot
            # keep apart in checkpoints, such as a ModelCheckpoint beside vit-train's own on its metric
            if (clash := re.search(r"more than one stateful callback of type `(\w+)`", str(e))) is None:
                raise
        # raised here, outside the handler: `instantiate_classes` reports the end of a chain
        raise UsageError(
            f"two {clash.group(1)} callbacks would keep their state under one key in checkpoints: leave "
            "one out, or give them other arguments (vit-train's own checkpoints are --checkpoint.* and "
            "--last_checkpoint.*)"
        )

    def before_fit(self) -> None:
        """A run resumed in its own folder keeps the rows of its metrics.csv (`ResumedMetrics`),
        without Lightning's warning that it deletes them."""
        if self.config.fit.get("ckpt_path") is None or not self.trainer.is_global_zero:
            return
        for logger in self.trainer.loggers:
            if isinstance(logger, CSVLogger) and storage.is_file(storage.join(logger.log_dir, "metrics.csv")):
                warnings.filterwarnings(
                    "ignore", message=f"Experiment logs directory {re.escape(logger.log_dir)} "
                )
                self.trainer.callbacks.append(ResumedMetrics(logger))

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        self._args = args  # parsed again by `_given_callbacks`

    def _given_callbacks(self) -> list:
        """The entries of `trainer.callbacks` with only the arguments the config and command line
        give (none of the defaults that parsing fills in), in the order of the parsed config's."""
        if isinstance(self._args, dict | Namespace):
            given = self.parser.parse_object(self._args, defaults=False)
        else:
            given = self.parser.parse_args(self._args, defaults=False)
        return given[self.subcommand].trainer.callbacks

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, MisconfigurationException) as e:  # raised by constructors
            # jsonargparse wraps ours; a DataError is ours even when it wraps an OSError
            cause = e
            while not isinstance(cause, DataError) and (cause.__cause__ or cause.__context__) is not None:
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, (ValueError, OSError, MisconfigurationException)):
                raise cause from e
            raise UsageError(one_line(cause)) from e

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.filename": "best",
                "checkpoint.save_last": False,  # LastCheckpoint writes last.ckpt
                "model": {"class_path": "vit.classifier.ViTClassifier"},
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": "runs", "name": "vit"},
                },
            }
        )
        # Facts of the data set are stated once, by the data module.
        for key in ("num_classes", "image_size", "in_channels"):
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        """Lightning's, which applies a --ckpt_path's hyper-parameters to the config right after
        parsing, before anything else of ours runs, with the checkpoint read as `read_checkpoint`
        reads it: a truncated file or code to unpickle is one line instead of a traceback, and
        older versions are upgraded (vit.compat), whose flat ViT options the parser would refuse."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if ckpt_path in (None, *SPECIAL_CKPT_PATHS) or not storage.is_file(ckpt_path):
            return
        self._read_model_of(ckpt_path)

    def _read_model_of(self, ckpt_path: Path | str) -> None:
        """Read the checkpoint at `ckpt_path` safely (`read_checkpoint`) and put the model's
        hyper-parameters it holds into the config, over the config's and the command line's, as
        Lightning does for a --ckpt_path FILE: the model built is the one whose weights it holds.
        `--ckpt_path last` gets the same once `_resolve_last` has found its file."""
        hparams = dict(read_checkpoint(ckpt_path).get("hyper_parameters", {}))
        self._checked_ckpt_path = ckpt_path
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        subcommand = self.config.subcommand
        parsed = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        self.config[subcommand].model = parsed[subcommand].model  # in place: callers hold the config

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        trainer = config.trainer
        callbacks = trainer.get("callbacks")
        if isinstance(callbacks, list) and len({callback_kind(c) for c in callbacks}) < len(callbacks):
            trainer.callbacks = one_callback_a_kind(callbacks, self._given_callbacks())
        unlimited = trainer.max_epochs == -1 and trainer.max_steps in (None, -1) and trainer.max_time is None
        if self.subcommand == "fit" and unlimited:
            raise UsageError(
                "max_epochs=-1 needs max_steps or max_time: the learning-rate schedule needs an end"
            )
        trainer.precision = precision_for_this_cpu(trainer.precision, trainer.accelerator)
        compile_for_this_cpu(config.model, trainer.accelerator)
        for url in object_store_locations(config):  # before anything is built or written
            storage.check_bucket(url)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            self._resolve_last(config)
        elif ckpt_path == "best":
            raise UsageError(
                "--ckpt_path best only means something in the process that ran fit; "
                "give a file, for example runs/<name>/version_N/checkpoints/best.ckpt"
            )
        ckpt_path = config.get("ckpt_path")
        checked = getattr(self, "_checked_ckpt_path", None)
        if ckpt_path not in (None, checked, *SPECIAL_CKPT_PATHS):
            # missing, truncated, or code to unpickle: one line now, before Lightning writes
            # config.yaml and builds the data (it reads the file only after that)
            read_checkpoint(ckpt_path)

    def _run_subcommand(self, subcommand: str) -> None:
        """Lightning's, with an error of the object store raised inside Lightning (its loggers and
        ModelCheckpoint reach the store through fsspec themselves) made one line naming the run's
        folder (`vit.storage.store_error`); what `vit.storage` raises names its object already."""
        try:
            super()._run_subcommand(subcommand)
        except Exception as e:
            folder = str(run_folder(self.trainer))
            where = [folder] if storage.is_url(folder) else object_store_locations(self.config[subcommand])
            if isinstance(e, DataError) or not where or not storage.is_store_error(e):
                raise
            raise storage.store_error(where[0], e) from e

    def _resolve_last(self, config) -> None:
        """`--ckpt_path last` means the newest last.ckpt among the runs of the configured logger
        (runs/<name>/*/checkpoints). `fit` continues that run in its own folder, so its logs and
        checkpoints go on; `validate`, `test` and `predict` read that file.

        In an object store (save_dir s3://..., or default_root_dir s3://... without a logger,
        whose run keeps <root>/checkpoints/last.ckpt), the command is given that file by its URL, since
        Lightning's own search for "last" drops the URL's scheme and finds nothing; and a prefix
        with no last.ckpt is an error rather than a fresh start, as a mistyped prefix would
        otherwise start a new run in the bucket unnoticed."""
        root_dir = config.trainer.get("default_root_dir")
        if config.trainer.logger is False and root_dir is not None and storage.is_url(root_dir):
            # no logger: the run is the Trainer's root, its checkpoints in <root>/checkpoints
            return self._named_last(config, storage.join(root_dir, "checkpoints", "last.ckpt"))
        args = getattr(config.trainer.logger, "init_args", None)
        if args is None or "save_dir" not in args:
            return  # an unusual logger: leave "last" to Lightning
        root = storage.join(args.save_dir, str(args.get("name") or ""))
        in_bucket = storage.is_url(root)
        if self.subcommand == "fit" and args.get("version") is not None:
            # the user named the run; Lightning finds its last.ckpt (read safely here first)
            version = args.version if isinstance(args.version, str) else f"version_{args.version}"
            return self._named_last(config, storage.join(root, version, "checkpoints", "last.ckpt"))
        candidates = storage.glob(root, "*/checkpoints/last.ckpt")
        if not candidates:
            if self.subcommand == "fit" and not in_bucket:
                return  # Lightning warns and starts from scratch, as for a first run
            raise FileNotFoundError(f"--ckpt_path last: no checkpoint matches {root}/*/checkpoints/last.ckpt")
        newest = max(candidates, key=storage.modified)
        self._read_model_of(newest)  # Lightning reads it only after writing config.yaml
        if self.subcommand != "fit" or in_bucket:
            config.ckpt_path = self._checked_ckpt_path = str(newest)
        if self.subcommand != "fit":
            return
        version = Path(newest).parent.parent.name  # also of a URL: the run folder's name
        match = re.fullmatch(r"version_(\d+)", version)
        args.version = int(match.group(1)) if match else version

    def _named_last(self, config, last: Path | str) -> None:
        """--ckpt_path last where the run's folder is known: its last.ckpt is read safely here
        first (with the model it holds), and Lightning finds it; in an object store, Lightning is
        given its URL, which must exist."""
        if storage.is_file(last):
            self._read_model_of(last)
            if storage.is_url(last):
                config.ckpt_path = self._checked_ckpt_path = last
        elif storage.is_url(last):
            raise FileNotFoundError(f"--ckpt_path last: there is no {last}")


def callback_kind(entry) -> tuple:
    """What makes an entry of a parsed config's `trainer.callbacks` one of a kind: its class, and
    for a callback that watches a metric (ModelCheckpoint, EarlyStopping: `monitor`), that metric.
    A callback given as an object is its own kind."""
    if not isinstance(entry, Namespace) or "class_path" not in entry:
        return (id(entry),)
    module, _, name = entry.class_path.rpartition(".")
    kind = getattr(importlib.import_module(module), name)  # an old path finds the class it names now
    args = entry.get("init_args") or Namespace()
    return (kind, args.get("monitor")) if "monitor" in args else (kind,)


def one_callback_a_kind(callbacks: list, given: list) -> list:
    """`callbacks` (a parsed config's `trainer.callbacks`) with each kind (`callback_kind`) once,
    where it first stood: its arguments those of its first entry, then those that each later entry
    gives (`given`: the same entries with only the arguments given) over them.

    Lightning runs each entry as a callback of its own, and refuses two that would keep their
    state under one key, such as the AttentionMaps of configs/two_circles.yaml and
    --trainer.callbacks+=vit.interpret.callbacks.AttentionMaps. A user who names a callback the
    config already has means that callback, with what they add: as LightningCLI reads a class given
    again for --model or --data (jsonargparse keeps the arguments given before, the new ones over
    them), and as Lightning lets a callback of the LightningModule's configure_callbacks replace the
    trainer's of its type. Lightning's docs do keep several ModelCheckpoints, each on its own
    metric: those stay apart."""
    kept: dict[tuple, Namespace] = {}
    for entry, said in zip(callbacks, given, strict=True):
        kind = callback_kind(entry)
        if kind not in kept:
            kept[kind] = entry.clone() if isinstance(entry, Namespace) else entry
        elif "init_args" in said:
            kept[kind].init_args = kept[kind].get("init_args") or Namespace()
            kept[kind].init_args.update(said.init_args)
    return list(kept.values())


def object_store_locations(config) -> list[str]:
    """The URLs (s3://...) a run's configuration names for its files, whose buckets are checked
    before anything is built: the Trainer's root, each logger's save_dir, the best checkpoint's
    folder and the checkpoint to read."""
    trainer = config.trainer
    loggers = trainer.logger if isinstance(trainer.logger, list) else [trainer.logger]
    locations = [trainer.get("default_root_dir"), config.get("checkpoint", {}).get("dirpath")]
    locations += [(getattr(logger, "init_args", None) or {}).get("save_dir") for logger in loggers]
    locations.append(config.get("ckpt_path"))
    return list(dict.fromkeys(str(p) for p in locations if p is not None and storage.is_url(p)))


def run(args: list[str] | None = None) -> ViTCLI:
    """Parse `args` (default: the command line), build everything and run the subcommand."""
    return ViTCLI(
        Classifier,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveConfig,
        # into the run's folder (SaveConfig.save_config); a resumed run rewrites its own config
        save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
        auto_configure_optimizers=False,
        parser_class=Parser,
        parser_kwargs={"description": DESCRIPTION},
        args=compat.moved_class_args(sys.argv[1:] if args is None else args),
    )


def run_and_explain_mismatches(args: list[str] | None = None) -> None:
    """`run`, with weights that do not fit the model (--ckpt_path) reported as a ValueError."""
    try:
        run(args)
    except RuntimeError as e:  # --ckpt_path: weights that do not fit the model built from the
        # checkpoint's hyper-parameters and the data module's num_classes, image_size, in_channels
        if (reason := state_dict_mismatch(e)) is None:
            raise
        hint = "another data set, or another version of vit?"
        message = f"the checkpoint does not fit the model built from it and the data ({hint}): {reason}"
        raise ValueError(message) from e


def main(args: list[str] | None = None) -> None:
    with quiet_lightning():
        run_command(run_and_explain_mismatches, args)


if __name__ == "__main__":
    main()
