"""vit-train's callbacks beside Lightning's: `TimeBudget`, training to a wall-clock budget;
`LearningRate`, which logs the learning rate without stalling a GPU; `FiniteLoss`, which stops a
run whose loss has diverged; a progress bar and a model summary that say true things (the epoch
under a time budget, the learning rate, the FLOPs of the network); `EMA`, a moving average of the
weights; and `LastCheckpoint`, last.ckpt after every validation; `SameCheckpoint`, which stops
processes that resumed from different checkpoints; `ResumedMetrics`, which keeps a resumed run's
metrics.csv; `Profile`, where a few training steps' time goes; and where a run's files go
(`run_folder`) and reach MLflow (`log_artifact`).
(`AttentionMaps` and `EvidenceMass`, which follow where the model's maps look while it learns, are
in `vit.interpret.watching`.)"""

from __future__ import annotations

import csv
import io
import itertools
import tempfile
import time
from collections import Counter
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import (
    Callback,
    ModelCheckpoint,
    RichModelSummary,
    RichProgressBar,
    Timer,
    WeightAveraging,
)
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vit import storage
from vit.datamodules import every_process
from vit.errors import DataError, TrainingDiverged


def run_folder(trainer: L.Trainer) -> Path | str:
    """The folder of a run, where Lightning's ModelCheckpoint puts its `checkpoints/`: the CSV and
    TensorBoard loggers' `runs/<name>/version_N`, MLflow's `<save_dir>/<experiment id>/<run id>`
    (under `--trainer.default_root_dir` with a tracking server), that root without a logger. A
    Path, or a URL string where the run is in an object store (s3://bucket/runs/<name>/version_N:
    write into it with `vit.storage`)."""
    if not trainer.loggers:
        return storage.join(trainer.default_root_dir)
    logger = trainer.loggers[0]
    if isinstance(logger, CSVLogger | TensorBoardLogger):
        return storage.join(logger.log_dir)
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return storage.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def log_artifact(trainer: L.Trainer, path: Path | str, folder: str | None = None) -> None:
    """`path` logged as an artifact (in `folder`) to each MLflow logger of the trainer: the files
    of a run that its tracker shows beside the figures (config.yaml, the attention maps). MLflow
    logs local files: a URL's object is copied into a temporary folder first."""
    loggers = [logger for logger in trainer.loggers if isinstance(logger, MLFlowLogger)]
    if not loggers:
        return
    with tempfile.TemporaryDirectory() as temporary:
        if storage.is_url(path):
            local = Path(temporary, str(path).rsplit("/", 1)[-1])
            local.write_bytes(storage.read_bytes(path))
            path = local
        for logger in loggers:
            logger.experiment.log_artifact(logger.run_id, str(path), folder)


def training_timer(trainer: L.Trainer) -> Timer | None:
    """The trainer's clock: --trainer.max_time's Timer, or the one `Classifier` adds."""
    return next((c for c in trainer.callbacks if isinstance(c, Timer)), None)


def budget_callbacks(trainer: L.Trainer) -> list[Callback]:
    """A `TimeBudget` and its clock, each where the trainer has none. The clock is Lightning's
    Timer, which starts with training (the sanity check excluded, validation included) and keeps
    the elapsed time in checkpoints: --trainer.max_time adds one with that budget; otherwise one
    without a budget keeps `time/minutes`."""
    kinds = (Timer, TimeBudget)
    return [kind() for kind in kinds if not any(isinstance(c, kind) for c in trainer.callbacks)]


class TimeBudget(Callback):
    """Training to a wall-clock budget (--trainer.max_time) on Lightning's `Timer`: the schedule's
    progress is the further ahead of the step limit's and the budget's (`progress`, which the
    learning rate and ViTClassifier's `patch_dropout_end` read), and training stops where the
    schedule ends, early enough for the last validation and the checkpoints to fit in the budget.
    The room kept at the end is 1.5 times the last training step and the longest validation yet;
    checkpoints keep it (`time_reserve_seconds`) beside the Timer's elapsed time, so that a
    resumed run continues the same clock and schedule. After each validation, logs the minutes
    of training so far as `time/minutes`; at the end of training, the seconds on the clock
    (`time/seconds`) and those spent from each validation's start to the next training step
    (`time/paused_seconds`: validation and checkpoints). Without a budget, progress is by steps alone.
    `Classifier.configure_callbacks` adds one where the trainer has none."""

    def __init__(self):
        # the longest validation and the last training step of this fit, in seconds, on the
        # training clock (which runs through validation)
        self.seconds = {"validation": 0.0, "step": 0.0}
        self._progress = 0.0  # of the schedule, as the learning rate of the last step read it
        self._started = 0.0  # the clock's reading when the current step or validation began
        self._paused = 0.0  # seconds from each validation's start to the next step's (this fit)
        self._pause_began: float | None = None

    def budget(self, trainer: L.Trainer) -> float | None:
        """Seconds of training the schedule spans with --trainer.max_time: the budget less room
        for one more step and the last validation, or None without a budget."""
        timer = training_timer(trainer)
        if timer is None or timer.time_remaining() is None:
            return None
        budget = timer.time_elapsed() + timer.time_remaining()
        return max(budget - 1.5 * (self.seconds["validation"] + self.seconds["step"]), 0.0)

    def progress(self, trainer: L.Trainer, step: int, total: float) -> float:
        """How far training is (1 at its end): by optimizer steps of the step limit `total`, or by
        time of the time budget, whichever is further ahead."""
        progress = step / total
        if (budget := self.budget(trainer)) is not None:
            by_time = training_timer(trainer).time_elapsed() / budget if budget else 1.0
            # with several processes, rank 0's clock sets every process's learning rate
            progress = max(progress, trainer.strategy.broadcast(by_time))
        self._progress = progress
        return progress

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._started = training_timer(trainer).time_elapsed()
        self._end_pause(self._started)

    def _end_pause(self, now: float) -> None:
        if self._pause_began is not None:
            self._paused += now - self._pause_began
            self._pause_began = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.seconds["step"] = training_timer(trainer).time_elapsed() - self._started
        # The schedule's end: stop now, so that the last validation (which Lightning runs when
        # training stops early) and the checkpoints fit within --trainer.max_time.
        # Decided on the clock reading the scheduler took for this step's learning rate (before this
        # hook; rank 0's, with several processes): a later reading could stop training one step
        # short of the schedule's end, above its floor.
        if self.budget(trainer) is not None:
            trainer.should_stop = trainer.should_stop or self._progress >= 1

    def _fitting(self, trainer: L.Trainer) -> bool:
        return trainer.state.fn == "fit" and not trainer.sanity_checking

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._fitting(trainer):
            self._started = self._pause_began = training_timer(trainer).time_elapsed()

    def on_train_end(self, trainer, pl_module) -> None:
        # what validations and the checkpoints written after them cost this fit, against the whole
        # (the logger's last row): on a fast GPU they are the loop's other big cost
        elapsed = training_timer(trainer).time_elapsed()
        self._end_pause(elapsed)
        times = {"time/paused_seconds": self._paused, "time/seconds": elapsed}
        for logger in trainer.loggers:  # in the last step's row (Lightning counts rows from 0)
            logger.log_metrics(times, max(trainer.global_step - 1, 0))

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._fitting(trainer):
            seconds = training_timer(trainer).time_elapsed() - self._started
            self.seconds["validation"] = max(self.seconds["validation"], seconds)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        # minutes of training so far (across resumes), beside val/acc: accuracy against wall time
        # (every process logs its own; with several, the mean)
        if self._fitting(trainer):
            pl_module.log("time/minutes", training_timer(trainer).time_elapsed() / 60, sync_dist=True)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # at the checkpoint's top level (not under `callbacks`): the key that older checkpoints
        # hold too, so that they resume the same way
        checkpoint["time_reserve_seconds"] = dict(self.seconds)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.seconds.update(checkpoint.get("time_reserve_seconds", {}))


def training_progress(trainer: L.Trainer, step: int, total: float) -> float:
    """How far training is (1 at its end) after `step` optimizer steps of the step limit `total`,
    as the trainer's `TimeBudget` reads it: what the learning rate and any other schedule follow."""
    return next(c for c in trainer.callbacks if isinstance(c, TimeBudget)).progress(trainer, step, total)


def logged_step(trainer: L.Trainer, step: int) -> bool:
    """Whether optimizer step `step` (counted from 1) logs its figures: the first and every
    `--trainer.log_every_n_steps`-th. A figure logged is read back from the device, a wait for a
    GPU, so the step's loss and learning rate are logged on these steps only."""
    return step == 1 or step % trainer.log_every_n_steps == 0


class LearningRate(Callback):
    """The learning rate as `train/lr` (progress bar and metrics.csv) after the first step and on
    the steps Lightning writes to the logger, not at every step: a number logged becomes a tensor
    on the device, a copy that would make the host wait for a GPU at every step.
    `Classifier.configure_callbacks` adds one."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if trainer.lr_scheduler_configs and logged_step(trainer, step):
            lr = trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[-1]
            pl_module.log("train/lr", lr, on_step=True, on_epoch=False)  # ProgressBar shows it


class FiniteLoss(Callback):
    """Stops a run whose loss has become infinite or nan (a learning rate too large, say) with a
    `TrainingDiverged` error, rather than train on to the end of its budget and write nan weights:
    after each validation, before a checkpoint is written (Lightning calls checkpoint callbacks
    last), and at the end of each training epoch. It reads the figures already logged, and the
    processes decide together: one that stopped alone would leave the others waiting for it.
    `Classifier.configure_callbacks` adds one."""

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.check(trainer, "val/loss", "the validation loss")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check(trainer, "train/loss", "the training loss")

    @staticmethod
    def check(trainer: L.Trainer, key: str, name: str) -> None:
        value = trainer.callback_metrics.get(key)
        if value is None:  # logged at the same steps in every process
            return
        finite = bool(torch.isfinite(value).all())
        if not trainer.strategy.reduce_boolean_decision(not finite, all=False):
            return
        shown = "nan or infinite in another process" if finite else value.item()
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")
        raise TrainingDiverged(
            f"training diverged: {name} is {shown} after {trainer.global_step} steps "
            f"(epoch {trainer.current_epoch}, learning rate {float(lr):.3g}); the checkpoints written "
            "before are kept. A lower --model.lr or a longer warm-up (--model.warmup_fraction) may train"
        )


class ProgressBar(RichProgressBar):
    """Lightning's bar, with an epoch count that means something: `Epoch 3/5` with an epoch
    limit, `Epoch 17` without one (Lightning printed `Epoch 17/-2` for `max_epochs: -1`), and the
    minutes left of a time budget at the epoch's start; the learning rate in scientific notation
    (3 decimals showed 3e-05 as 0.000) and no `v_num` (the run's version, cut to its last 4
    characters: `rain` for a run named `train`). The step's loss and learning rate, logged without
    `prog_bar` (Lightning would read a device value back at every step to show it), are shown from
    the last logged values, read from the device (a wait for a GPU) only when the bar is drawn,
    every `refresh_rate` steps."""

    STEP_FIGURES = ("train/loss", "train/lr")
    _reading = True  # whether the figures are read now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._reading = (batch_idx + 1) % max(self.refresh_rate, 1) == 0
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._reading = True

    def _update_metrics(self, trainer, pl_module) -> None:
        if self._reading:
            super()._update_metrics(trainer, pl_module)

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        if (self.trainer.max_epochs or -1) > 0:
            description += f"/{self.trainer.max_epochs - 1}"
        timer = training_timer(self.trainer)
        if timer is not None and (left := timer.time_remaining()) is not None:
            description += f", {left / 60:.1f} min left"
        # as wide as "Validation", so that the bar does not jump between the two
        return f"{description:{len(self.validation_description)}}"

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        logged = trainer.callback_metrics
        metrics.update({key: float(logged[key]) for key in self.STEP_FIGURES if key in logged})
        return {k: f"{v:.2e}" if k.endswith("/lr") else v for k, v in metrics.items()}


def forward_flops(network: torch.nn.Module, images: torch.Tensor) -> int:
    """FLOPs of one forward pass of `images` in eval mode, counted as benchmarks/throughput.py
    counts them: `torch.utils.flop_counter` with attention spelled out as matmuls (the counter
    does not see the CPU's fused attention kernel). `.forward` runs a compiled network eagerly."""
    training = network.training
    network.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            network.forward(images)
    finally:
        network.train(training)
    return counter.get_total_flops()


class ModelSummary(RichModelSummary):
    """Lightning's summary with the real FLOPs of the network: Lightning counts them only for a
    module with an `example_input_array`, and printed `Total FLOPs: 0` for every model here."""

    def on_fit_start(self, trainer, pl_module) -> None:
        hparams = pl_module.hparams
        size = hparams.get("image_size")
        self._flops = None
        if size is not None and hparams.get("in_channels") is not None:
            height, width = (size, size) if isinstance(size, int) else size
            image = torch.zeros(1, hparams.in_channels, height, width, device=pl_module.device)
            self._flops = forward_flops(pl_module.model, image)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, *args, total_flops: int, **kwargs) -> None:
        if self._flops is None:  # a module of someone else's: Lightning's summary as it is
            return super().summarize(summary_data, *args, total_flops=total_flops, **kwargs)
        columns = dict(summary_data)
        flops = [
            get_human_readable_count(self._flops) if name == "model" else "0" for name in columns["Name"]
        ]
        summary_data = [(name, flops if name == "FLOPs" else values) for name, values in summary_data]
        super().summarize(summary_data, *args, total_flops=self._flops, **kwargs)
        print("FLOPs: one image's forward pass (a training step costs about 3 times that per image)")


class EMA(WeightAveraging):
    """An exponential moving average of the weights and buffers (BatchNorm's statistics), kept in
    fp32 beside the network: validation, the checkpoints (so best.ckpt and vit-eval) and the
    network after training are the average; training goes on from its own weights (Lightning's
    `WeightAveraging` swaps them). The decay warms up as timm's `ModelEmaV3` does,
    min(decay, (1 + t) / (10 + t)) after optimizer step t, so that a short run keeps little of
    its random start. One multi-tensor lerp a step over tensor lists made at the first step, and
    nothing read back from the device: torch's
    `AveragedModel.update_parameters` reads its step counter from the GPU at every step, a
    synchronisation that would stall a fast GPU loop. Use it with `--trainer.callbacks+=vit.callbacks.EMA`."""

    def __init__(self, decay: float = 0.999):
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay={decay} must lie in (0, 1)")
        super().__init__(use_buffers=True)
        self.decay = decay
        # True while a captured training step updates the average in its graph instead
        # (`vit.captured_step.CapturedStep.take_over`)
        self.step_updates = False

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps so far; the same while gradients accumulate
        if step <= self._latest_update_step:
            return
        self._latest_update_step = step
        if not self.step_updates:
            self.update(self.pairs(pl_module), self.weight(step))

    def weight(self, step: int | torch.Tensor) -> float | torch.Tensor:
        """The share of the network's current values in the average after optimizer step `step`
        (a tensor in a compiled step, where a number would recompile)."""
        warm = (1 + step) / (10 + step)
        return 1 - (warm.clamp(max=self.decay) if torch.is_tensor(warm) else min(self.decay, warm))

    def pairs(self, pl_module: L.LightningModule) -> tuple[list, list, list, list]:
        """`pair_up` of the average and `pl_module`, made at the first call and kept."""
        average = self._average_model.module
        if getattr(self, "_pairs", (None,))[0] != (id(average), id(pl_module)):
            self._pairs = ((id(average), id(pl_module)), *self.pair_up(average, pl_module))
        return self._pairs[1:]

    @staticmethod
    def update(pairs: tuple[list, list, list, list], weight: float | torch.Tensor) -> None:
        """One multi-tensor lerp of the average towards the network; counters copied."""
        averages, currents, counters, current_counters = pairs
        torch._foreach_lerp_(averages, currents, weight)
        if counters:  # counters (BatchNorm's num_batches_tracked) follow the network
            torch._foreach_copy_(counters, current_counters)

    @staticmethod
    def pair_up(average: torch.nn.Module, network: torch.nn.Module) -> tuple[list, list, list, list]:
        """The average's tensors and the network's, in order: floating-point ones (averaged) and
        counters (copied). Made once and kept: the tensors are updated in place, never replaced."""
        averages, currents, counters, current_counters = [], [], [], []
        pairs = zip(
            itertools.chain(average.parameters(), average.buffers()),
            itertools.chain(network.parameters(), network.buffers()),
            strict=True,
        )
        for mine, theirs in pairs:
            if mine.is_floating_point():
                averages.append(mine)
                currents.append(theirs.detach())
            else:
                counters.append(mine)
                current_counters.append(theirs.detach())
        return averages, currents, counters, current_counters


class LastCheckpoint(ModelCheckpoint):
    """Writes `last.ckpt` after every validation (each epoch by default), every
    `every_n_train_steps` steps if set, and when training ends.

    Lightning's `ModelCheckpoint(save_last=True)` rewrites last.ckpt only when the monitored
    best checkpoint is saved too, so after an epoch that did not improve val/acc, "last" would
    be an older epoch. This callback monitors nothing, so it always saves.
    """

    def __init__(self, every_n_train_steps: int | None = None):
        super().__init__(
            filename=self.CHECKPOINT_NAME_LAST,
            monitor=None,
            save_top_k=1,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,
        )

    def _save_unless_saved(self, trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skips if this step is saved
            self._save_none_monitor_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if not trainer.sanity_checking:
            self._save_unless_saved(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_unless_saved(trainer)


class SameCheckpoint(Callback):
    """Stops a run whose processes did not all restore the same checkpoint, before its first
    step, with one line on every process naming what each read.

    Under DDP every process reads `--ckpt_path` itself, as it resolves on its own machine. Where a
    node cannot read it (`--ckpt_path last` with the run folder on node 0's disk alone), that
    node starts again from scratch without a word (Lightning warns on rank 0 only, which did read
    it): DDP hands it rank 0's weights, but its optimizer, schedule and epoch start again, so its
    steps differ from the others' and the run hangs, the processes waiting on each other.
    vit-train adds this callback to every run. It checks at `on_fit_start`, which DDP reaches
    after restoring (strategies that restore later, FSDP and DeepSpeed, pass unchecked)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        read = every_process(None if trainer.ckpt_path is None else str(trainer.ckpt_path))
        if len(set(read)) == 1:
            return
        ranks: dict[str | None, list[int]] = {}
        for rank, path in enumerate(read):
            ranks.setdefault(path, []).append(rank)
        said = [f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {p or 'none'}" for p, r in ranks.items()]
        what = "; ".join(said)
        raise DataError(
            f"the processes read different checkpoints ({what}): every node must read the run's "
            f"checkpoints at the same path (a shared file system, or a copy on each node; docs/cluster.md)"
        )


class ResumedMetrics(Callback):
    """Keeps the rows of a run's `metrics.csv` when `fit --ckpt_path` resumes the run in its own
    folder (`--ckpt_path last`, or `--trainer.logger.init_args.version N`): the file ends with the
    rows a run never stopped writes, in the order of their steps.

    Lightning's CSVLogger deletes that file when it opens a folder that has one (it warns that
    "previous log files ... will be deleted"), so the curves of a resumed run (`vit-curves`) would
    start where it resumed. This callback, made before training starts, reads the rows, opens the
    logger's folder itself and writes them all back at once (a resume that fails keeps them).
    Once the checkpoint is restored (`on_train_start`), only the rows of steps before the
    checkpoint's are kept: Lightning stamps a step's rows with the steps done before it, so a
    checkpoint after k steps follows rows stamped 0 to k - 1, and rows stamped k or later, which
    a run killed after that checkpoint had logged, are logged again. A row outside the epochs (no
    `epoch`) at step 0 or at the checkpoint's last step, which describes a fit (its compilation
    time, its clock at the end of training), gives way to a row of the same figures that the
    resumed fit logs, up to `on_fit_end`. `vit-train fit` adds one for each CSVLogger whose folder
    has a metrics.csv when it resumes from a checkpoint."""

    def __init__(self, logger: CSVLogger):
        self.logger = logger
        self.path = storage.join(logger.log_dir, "metrics.csv")
        self.rows = self._read()
        self.before = float("inf")  # the first step the resumed run stamps
        self.logged: list[dict] = []  # the rows this run has logged, as far as they are written
        self.count = 0  # the rows of the file as this callback last wrote it
        self._write()

    def on_train_start(self, trainer, pl_module) -> None:
        self.before = trainer.global_step
        self._write(trainer)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write(trainer)

    def _read(self) -> list[dict]:
        text = storage.read_bytes(self.path).decode() if storage.is_file(self.path) else ""
        text = text[: text.rfind("\n") + 1]  # without a last line a killed run did not finish
        rows = csv.DictReader(io.StringIO(text))
        return [{k: v for k, v in row.items() if k is not None} for row in rows]  # None: extra fields

    def _write(self, trainer: L.Trainer | None = None) -> None:
        """The rows kept and those this run has logged, as the file and the logger's header."""
        if not self.rows or (trainer is not None and not trainer.is_global_zero):  # rank 0 writes
            return
        writer = self.logger.experiment  # made here first: where Lightning deletes the file
        writer.save()  # this run's rows so far, appended to the file as it was written here
        self.logged += self._read()[self.count :]

        def figures(row: dict) -> frozenset:
            return frozenset(k for k, v in row.items() if v and k not in ("epoch", "step"))

        again = Counter(figures(row) for row in self.logged if not row.get("epoch"))
        kept = []
        for row in reversed(self.rows):  # the latest rows give way first
            step, fit = float(row["step"]), figures(row)
            if step >= self.before:
                continue
            at_an_end = step in (0, self.before - 1)  # a fit's first or last step
            if not row.get("epoch") and at_an_end and again[fit] > 0:
                again[fit] -= 1
                continue
            kept.append(row)
        kept.reverse()
        rows = sorted([*kept, *self.logged], key=lambda row: float(row["step"]))  # stable
        writer.metrics_keys[:] = sorted(set(writer.metrics_keys).union(*rows))
        out = io.StringIO()
        table = csv.DictWriter(out, fieldnames=writer.metrics_keys)  # as the logger appends later
        table.writeheader()
        table.writerows(rows)
        storage.write_text(self.path, out.getvalue())
        self.count = len(rows)


class Profile(Callback):
    """`torch.profiler` around `steps` training steps from optimizer step `start` (past compilation
    and warm-up): the host's wall time a step (from the first profiled step's start to the last's
    end, no wait in between) against the device's (the sum of its kernels' own times; on a CPU,
    the operators' own times, which the host's include), and the costliest operators of each,
    written to `profile.txt` in the run folder (`run_folder`), with a Chrome trace `profile.json`
    if `trace`, and logged as `profile/*`. Where the host's time a step exceeds the device's, the
    GPU waits for Python; the table says for what. `--trainer.callbacks+=vit.callbacks.Profile`.
    Under DDP each process profiles its own steps and the first writes its report: the others
    write nothing, as they write no other file of the run."""

    def __init__(self, start: int = 50, steps: int = 20, trace: bool = False, rows: int = 25):
        if start < 0 or steps < 1:
            raise ValueError(f"Profile: start={start} must be >= 0 and steps={steps} >= 1")
        self.start, self.steps, self.trace, self.rows = start, steps, trace, rows
        self.profiler: torch.profiler.profile | None = None
        self.began = 0.0
        self.report: dict | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.profiler is None and self.report is None and trainer.global_step >= self.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if pl_module.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.first, self.began = trainer.global_step, time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.profiler is None or trainer.global_step < self.first + self.steps:
            return
        host = time.perf_counter() - self.began  # before the wait below: the host's own time
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.began
        self.profiler.__exit__(None, None, None)
        steps = trainer.global_step - self.first
        events = self.profiler.key_averages()
        if pl_module.device.type == "cuda":
            kernels = sum(e.self_device_time_total for e in events)
        else:  # the host runs the kernels: the operators' own time
            kernels = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
        device = kernels / 1e6 / steps  # from microseconds
        self.report = dict(
            steps=steps, host_seconds=host / steps, wall_seconds=wall / steps, device_seconds=device
        )
        lines = [
            f"{steps} training steps from step {self.first}: the host {host / steps * 1e3:.2f} ms a step, "
            f"the device's kernels {device * 1e3:.2f} ms, the wall clock {wall / steps * 1e3:.2f} ms",
            "",
        ]
        sorts = ["self_cpu_time_total"] + ["self_device_time_total"] * (pl_module.device.type == "cuda")
        for sort in sorts:
            lines += [f"by {sort}:", events.table(sort_by=sort, row_limit=self.rows), ""]
        if trainer.is_global_zero:  # the run folder is rank 0's: another node's may be elsewhere
            folder = run_folder(trainer)
            storage.write_text(storage.join(folder, "profile.txt"), "\n".join(lines))
            trace = storage.join(folder, "profile.json")
            if self.trace and storage.is_url(trace):  # torch writes a trace into a local file only
                with tempfile.TemporaryDirectory() as temporary:
                    self.profiler.export_chrome_trace(str(Path(temporary, "profile.json")))
                    storage.write_bytes(trace, Path(temporary, "profile.json").read_bytes())
            elif self.trace:
                self.profiler.export_chrome_trace(str(trace))
            print(lines[0])
        self.profiler = None
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"profile/{k}": float(v) for k, v in self.report.items()}, trainer.global_step
            )
