"""The training CLI end to end, on tiny models and data: fit, test, predict, attention overlays,
resume after SIGKILL, two-process DDP, bf16, and one-line errors for bad input."""

import csv
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers import ROOT, UnsafePayload, command_error, run_train, start_training, tiny_args

from vit import CNNClassifier, TwoCircles, ViTClassifier, ViTConfig
from vit.callbacks import LastCheckpoint
from vit.checkpoint import load_checkpoint
from vit.commands import train as cli
from vit.commands.attention import AttentionOptions, attention
from vit.commands.eval import EvalOptions, evaluate


def metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def last_value(rows: list[dict], key: str) -> float:
    return [float(r[key]) for r in rows if r.get(key)][-1]


@pytest.mark.slow
def test_fit_test_predict_and_attention(runs, capsys):
    cli.main(["fit", *tiny_args(runs)])
    run = runs / "tiny" / "version_0"
    assert (run / "config.yaml").is_file()
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    rows = metrics(run)
    assert {"train/loss", "val/loss", "val/acc", "train/acc", "time/minutes"} <= set(rows[0])
    assert 0.0 <= last_value(rows, "val/acc") <= 1.0
    minutes = [float(r["time/minutes"]) for r in rows if r.get("time/minutes")]  # one per epoch
    assert len(minutes) == len([r for r in rows if r.get("val/acc")]) and 0 < minutes[0] <= minutes[-1]
    saved = (run / "config.yaml").read_text()
    assert "preset: micro" in saved and "class_path: vit.two_circles.TwoCircles" in saved

    best = run / "checkpoints" / "best.ckpt"
    tested = cli.run(["test", *tiny_args(runs), "--ckpt_path", str(best)])
    assert "test/acc" in capsys.readouterr().out
    # vit-eval, from the checkpoint alone, measures what vit-train test measured
    measured = evaluate(EvalOptions(ckpt=best), progress=False)
    assert measured["top1"] == pytest.approx(tested.trainer.callback_metrics["test/acc"].item(), abs=1e-6)
    assert measured["num_images"] == 128

    result = cli.run(["predict", *tiny_args(runs), "--ckpt_path", str(best)])
    probabilities = torch.cat(result.trainer.predict_loop.predictions)
    assert probabilities.shape == (128, 4)
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(128))
    # `--ckpt_path last` outside fit reads the newest last.ckpt, not a fresh model
    result = cli.run(["test", *tiny_args(runs), "--ckpt_path", "last"])
    assert Path(result.trainer.ckpt_path) == run / "checkpoints" / "last.ckpt"

    # a checkpoint with weights its model does not have (another version): one line, no traceback
    other = torch.load(best, weights_only=True)
    other["state_dict"]["model.stem.weight"] = torch.zeros(3)
    torch.save(other, runs / "other.ckpt")
    status, message = command_error(
        cli.main, ["test", *tiny_args(runs), "--ckpt_path", runs / "other.ckpt"], capsys
    )
    assert status == 1
    assert message.startswith("error: the checkpoint does not fit the model built from it and the data")
    assert '"model.stem.weight"' in message

    # the checkpoint alone rebuilds the model and the data module
    model, datamodule = load_checkpoint(best)
    assert model.hparams.vit["preset"] == "micro" and model.hparams.num_classes == 4
    assert datamodule.hparams.num_train == 512

    [png] = attention(AttentionOptions(ckpt=best, out=runs / "attention", num_images=3, layer=-1, head=0))
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_print_config_shows_the_resolved_config(runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", *tiny_args(runs), "--print_config"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    assert "preset: micro" in out and "monitor: val/acc" in out and "last_checkpoint:" in out
    assert not runs.exists()


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_config_parses(config, capsys):
    """A misspelt key or a value of the wrong type in a shipped config fails here, not after a
    user's data has been decoded."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(ROOT / "configs" / config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "model:\n  class_path: vit." in capsys.readouterr().out


def test_a_callback_given_again_is_one_callback_with_the_arguments_given_last(runs):
    """configs/two_circles.yaml has AttentionMaps and EvidenceMass; the command line names both
    again, AttentionMaps twice with one argument each: one of each, where the config put them, with
    the arguments given on the command line over the config's and the earlier ones kept (the
    second `num_images` is not reset to its default by an entry that does not give it), where
    Lightning alone refuses the second AttentionMaps with a traceback. The first names it where it
    lived before (vit.compat): the same class."""
    from vit.interpret.watching import AttentionMaps, EvidenceMass

    again = [
        "--trainer.callbacks+=vit.interpret.callbacks.AttentionMaps", "--trainer.callbacks.num_images", "2",
        "--trainer.callbacks+=vit.interpret.watching.AttentionMaps", "--trainer.callbacks.seed", "5",
        "--trainer.callbacks+=vit.interpret.watching.EvidenceMass",
    ]  # fmt: skip
    short = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"]
    result = cli.run(["fit", *tiny_args(runs, *again, *short)])
    ours = [c for c in result.trainer.callbacks if isinstance(c, AttentionMaps | EvidenceMass)]
    assert [type(c) for c in ours] == [EvidenceMass, AttentionMaps]
    assert (ours[1].num_images, ours[1].seed, ours[1].columns) == (2, 5, 12)
    saved = yaml.safe_load((runs / "tiny" / "version_0" / "config.yaml").read_text())
    assert [c["class_path"].rsplit(".", 1)[1] for c in saved["trainer"]["callbacks"]] == [
        "EvidenceMass",
        "AttentionMaps",
    ]


def test_callbacks_that_watch_different_metrics_stay_apart():
    """Lightning keeps several checkpoints, each on its own metric: those are not merged; the
    same metric twice is one callback, the later arguments over the earlier."""
    from jsonargparse import Namespace

    def checkpoint(**args):
        path = "lightning.pytorch.callbacks.ModelCheckpoint"
        return Namespace(class_path=path, init_args=Namespace(**args))

    full = [checkpoint(monitor="val/acc", save_top_k=1), checkpoint(monitor="val/loss", save_top_k=1),
            checkpoint(monitor="val/acc", save_top_k=3)]  # fmt: skip
    given = [checkpoint(monitor="val/acc"), checkpoint(monitor="val/loss"), checkpoint(save_top_k=3)]
    kept = cli.one_callback_a_kind(full, given)
    assert [(c.init_args.monitor, c.init_args.save_top_k) for c in kept] == [("val/acc", 3), ("val/loss", 1)]
    assert full[0].init_args.save_top_k == 1  # the parsed config's entries are left as they were


def test_a_callback_that_clashes_with_vit_trains_own_is_one_line(runs, capsys):
    """A ModelCheckpoint on the metric and mode of vit-train's own best checkpoint keeps its state
    under the same key: Lightning refuses it; here in one line that says what to do."""
    clash = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/acc",
             "--trainer.callbacks.mode", "max"]  # fmt: skip
    status, message = command_error(cli.main, ["fit", *tiny_args(runs, *clash)], capsys)
    assert status == 2
    assert message.startswith("error: two ModelCheckpoint callbacks would keep their state under one key")
    assert "--checkpoint.*" in message
    assert not runs.exists()


@pytest.mark.slow
def test_bf16_mixed_trains_on_cpu(monkeypatch, runs):
    import vit.optim

    # as on a CPU with native bf16: elsewhere vit-train trains in 32-true (test below)
    monkeypatch.setattr(vit.optim, "cpu_has_native_bf16", lambda: True)
    result = cli.run(
        ["fit", *tiny_args(runs, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "1")]
    )
    assert result.trainer.precision == "bf16-mixed"
    images = torch.rand(2, 1, 32, 32)
    with result.trainer.precision_plugin.forward_context():
        assert result.model(images).dtype == torch.bfloat16  # autocast really ran in bf16
    rows = metrics(runs / "tiny" / "version_0")
    assert torch.isfinite(torch.tensor(last_value(rows, "val/loss")))


class Snapshots(L.Callback):
    """The network's buffers and gradients when fit starts and when training starts: between the
    two, `compile: true` compiles (vit.captured_step.compile_now)."""

    @staticmethod
    def statistics(network) -> list[torch.Tensor]:
        norms = [m for m in network.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        return [b.clone() for m in norms for b in m.buffers()]

    def on_fit_start(self, trainer, pl_module):
        self.before = self.statistics(pl_module.model)

    def on_train_start(self, trainer, pl_module):
        self.after = self.statistics(pl_module.model)
        self.grads = [p.grad for p in pl_module.model.parameters()]
        self.compiled_calls = torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_compile_trains_and_keeps_eager_checkpoints(runs):
    """`--model.compile true` trains through torch.compile, compiled before the training clock
    starts (BatchNorm's statistics and the gradients left as they were, the seconds logged); the
    compiled network computes what the eager one does, and the checkpoint holds the eager
    parameter names, so it loads without it."""
    snapshots = Snapshots()
    torch._dynamo.utils.counters.clear()
    args = ["--model.compile", "true", "--trainer.max_epochs", "1", "--model.vit.conv_stem", "[4]"]
    original = ViTClassifier.configure_callbacks
    with pytest.MonkeyPatch.context() as patch:  # the module's callbacks, and the snapshots beside them
        patch.setattr(ViTClassifier, "configure_callbacks", lambda self: [snapshots, *original(self)])
        result = cli.run(["fit", *tiny_args(runs, *args)])
    assert snapshots.compiled_calls > 0  # graphs were compiled before training started
    assert len(snapshots.before) == 3  # BatchNorm's mean, variance and count
    for before, after in zip(snapshots.before, snapshots.after, strict=True):
        torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert all(grad is None for grad in snapshots.grads)
    assert last_value(metrics(runs / "tiny" / "version_0"), "time/compile_seconds") > 0
    network = result.model.model
    assert network._compiled_call_impl is not None  # training ran the compiled network
    images = torch.rand(4, 1, 32, 32)
    network.eval()
    torch.testing.assert_close(network(images), network.forward(images), atol=1e-5, rtol=1e-5)
    best = runs / "tiny" / "version_0" / "checkpoints" / "best.ckpt"
    names = torch.load(best, weights_only=True)["state_dict"].keys()
    assert not any("_orig_mod" in name for name in names)
    model, _ = load_checkpoint(best)
    assert model.hparams.compile and model.model._compiled_call_impl is None  # eager outside fit


def test_compile_without_a_cpp_compiler_trains_eagerly_and_says_so(runs, capsys, monkeypatch):
    """On a CPU, torch.compile writes C++ kernels: without a compiler, vit-train trains the same
    network eagerly and says so in one line (as it trains bf16 in fp32 where bf16 is emulated)."""
    monkeypatch.setattr("vit.commands.train.cpu_compiler", lambda: None)
    args = ["--model.compile", "true", "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu"]
    result = cli.run(["fit", *tiny_args(runs, *args)])
    notes = [line for line in capsys.readouterr().err.splitlines() if "C++ compiler" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "training eagerly" in notes[0]
    assert result.model.model._compiled_call_impl is None and not result.model.hparams.compile
    assert last_value(metrics(runs / "tiny" / "version_0"), "val/acc") is not None


# A short run that learns: 8000 images, 4 epochs of the demo's model, about 10 s.
# The bounded canvas, learned positions and class token of the first demo config, which learn
# within these 500 steps.
LEARN = ["--model.vit.preset", "mini", "--data.init_args.num_train", "8000",
         "--model.vit.rel_pos_bias", "false", "--model.vit.pos_embed", "learned",
         "--data.init_args.num_val", "400",
         "--data.init_args.batch_size", "64", "--trainer.max_epochs", "4", "--data.init_args.wrap", "false",
         "--data.init_args.separation", "[10.0, 16.0]", "--model.vit.pool", "cls",
         "--model.lr", "0.002"]  # fmt: skip


@pytest.mark.slow
def test_learns_two_circles_alone_and_with_ddp(runs, tmp_path):
    """The same run in one process and in two DDP processes (gloo on CPU): both learn well above
    chance (0.25), and with DDP each process takes half the data, so there are half the steps."""
    cli.main(["fit", *tiny_args(runs, *LEARN, name="single")])  # in this process, its imports done
    ddp_args = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    ddp = run_train("fit", *tiny_args(runs, *LEARN, *ddp_args, name="ddp"), cwd=tmp_path)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    steps = {
        name: torch.load(runs / name / "version_0/checkpoints/last.ckpt", weights_only=True)["global_step"]
        for name in ("single", "ddp")
    }
    assert steps == {"single": 4 * 125, "ddp": 4 * 62}  # 8000 / 64 = 125; 4000 / 64, last one dropped
    assert last_value(metrics(runs / "single" / "version_0"), "val/acc") > 0.6
    assert last_value(metrics(runs / "ddp" / "version_0"), "val/acc") > 0.4


@pytest.mark.slow
def test_last_checkpoint_is_written_after_each_epoch_as_well_as_every_n_steps(tmp_path):
    """Lightning's own save_last skips epochs where val/acc did not improve, and with
    every_n_train_steps set it stops saving at epoch ends; LastCheckpoint does both."""
    seen = []

    class Recorder(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch > 0:
                seen.append(torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"])

    last = LastCheckpoint(every_n_train_steps=5)
    last.dirpath = str(tmp_path)
    trainer = L.Trainer(
        max_epochs=3, callbacks=[last, Recorder()], logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    data = TwoCircles(num_train=16 * 8, num_val=16, num_test=16, batch_size=8)
    trainer.fit(
        ViTClassifier(num_classes=4, in_channels=1, vit=ViTConfig(preset="micro", patch_size=8)), data
    )
    assert seen == [16, 32]  # 16 steps an epoch, not a multiple of 5
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 48


@pytest.mark.slow
def test_a_run_killed_mid_epoch_and_resumed_ends_with_the_weights_of_one_never_stopped(
    runs, tmp_path, monkeypatch
):
    """kill -9 mid-epoch, then `fit --ckpt_path last`: the resumed run continues the same run and
    the same epoch (the batches it had not seen, in the same order, then the next epoch's), so it
    ends with the weights of a run never stopped. A loader that started its epoch again would
    train on some images twice and others not at all, and end elsewhere."""
    # 2048 images in batches of 16: 128 steps an epoch, two epochs; a checkpoint every 20 steps
    args = tiny_args(
        runs, "--data.init_args.num_train", "2048", "--data.init_args.batch_size", "16",
        "--last_checkpoint.every_n_train_steps", "20", "--trainer.max_epochs", "2",
    )  # fmt: skip
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    process = start_training(["fit", *args])
    try:
        deadline = time.time() + 240
        while not last.exists() and process.is_alive() and time.time() < deadline:
            time.sleep(0.01)
        process.kill()  # SIGKILL
    finally:
        process.join()
    assert process.exitcode == -signal.SIGKILL, "training ended before it could be killed"
    killed_at = torch.load(last, weights_only=True)["global_step"]  # intact after the kill
    assert killed_at % 128, f"the kill should land mid-epoch, not at step {killed_at}"
    csv_path = runs / "tiny" / "version_0" / "metrics.csv"

    def written(rows):  # each row by its figures, whatever columns the file has
        return [frozenset((k, v) for k, v in row.items() if v) for row in rows]

    before = written(metrics(csv_path.parent)) if csv_path.exists() else []

    # the resumed run and the reference in this process, whose imports are done (12 s each on a
    # 2-core Zen 3): the subject is the checkpoint the killed process left
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        cli.main(["fit", *args, "--ckpt_path", "last"])
    assert not [w for w in warned if "not resumable" in str(w.message)]  # Lightning's, were it not
    assert torch.load(last, weights_only=True)["global_step"] == 256  # ran to the end
    assert not (runs / "tiny" / "version_1").exists()  # the same run, not a new one
    # the resumed process logged only steps after the checkpoint: it did not start again at 0
    rows = metrics(runs / "tiny" / "version_0")
    new_steps = [int(r["step"]) for r, w in zip(rows, written(rows), strict=True) if w not in before]
    assert new_steps and min(new_steps) > killed_at and max(new_steps) >= 250
    load_checkpoint(runs / "tiny" / "version_0" / "checkpoints" / "best.ckpt")

    never_stopped = tmp_path / "never_stopped"
    cli.main(["fit", *tiny_args(never_stopped, *args[len(tiny_args(runs)) :])])
    reference = never_stopped / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    expected = torch.load(reference, weights_only=True)
    got = torch.load(last, weights_only=True)
    assert got["global_step"] == expected["global_step"] == 256
    for name, weights in expected["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], weights, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_ckpt_path_last_builds_the_model_its_checkpoint_holds(runs):
    """As a --ckpt_path FILE does (Lightning applies the hyper-parameters it holds), `--ckpt_path
    last` builds the model of the checkpoint it finds, not the config's, to resume it or to test
    it: the README trains two_circles.yaml at preset micro, then resumes "the newest run" with the
    config alone (preset mini), which stopped with weights that did not fit the model."""
    short = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "1"]
    short += ["--trainer.limit_test_batches", "1"]
    cli.main(["fit", *tiny_args(runs, *short)])  # preset micro
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    mini = [*short, "--model.vit.preset", "mini", "--trainer.max_steps", "2"]
    for subcommand in ("fit", "test"):
        result = cli.run([subcommand, *tiny_args(runs, *mini), "--ckpt_path", "last"])
        assert result.model.hparams.vit["preset"] == "micro" and Path(result.trainer.ckpt_path) == last
        if subcommand == "fit":  # resumed in its own folder
            assert torch.load(last, weights_only=True)["global_step"] == 2
            assert not (runs / "tiny" / "version_1").exists()


@pytest.mark.slow
def test_a_resumed_run_keeps_the_rows_its_metrics_csv_had(runs, tmp_path, capsys):
    """Lightning's CSVLogger deletes metrics.csv when it opens a run's folder again: `fit
    --ckpt_path last` puts back the rows of the steps before the checkpoint. Here a run of one
    epoch (16 steps, its rows stamped 0-15) is trained to two; its file had, as a run killed after
    its last checkpoint has, rows stamped 16 and later and a last line cut short. The resumed file
    has the rows of a run never stopped: the same epochs and steps, the same figures on each row
    (the first part's clock at its end gives way to the whole run's). A resume that fails once the
    file is deleted (weights that do not fit the model) leaves the file as it was."""
    run = runs / "tiny" / "version_0"
    cli.main(["fit", *tiny_args(runs, "--trainer.max_epochs", "1")])
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    with open(run / "metrics.csv", "a") as f:
        for step in (16, 99):  # steps after the checkpoint, which the resumed run logs again
            past = {"epoch": "1", "step": str(step), "train/loss": "0.5"}
            f.write(",".join(past.get(key, "") for key in header) + "\n")
    other = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    other["state_dict"]["model.stem.weight"] = torch.zeros(3)
    torch.save(other, runs / "other.ckpt")
    before = metrics(run)
    version = ["--trainer.logger.init_args.version", "0"]
    status, message = command_error(
        cli.main, ["fit", *tiny_args(runs, *version), "--ckpt_path", runs / "other.ckpt"], capsys
    )
    assert status == 1 and "the checkpoint does not fit the model" in message
    assert metrics(run) == before
    with open(run / "metrics.csv", "a") as f:
        f.write("1,100,0.4")  # a line cut short

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        cli.main(["fit", *tiny_args(runs, "--trainer.max_epochs", "2"), "--ckpt_path", "last"])
    assert not [w for w in warned if "will be deleted" in str(w.message)]  # Lightning's, were it true
    assert not (runs / "tiny" / "version_1").exists()
    cli.main(["fit", *tiny_args(tmp_path / "never_stopped", "--trainer.max_epochs", "2")])

    def logged(rows):
        return [(r["epoch"], r["step"], sorted(k for k, v in r.items() if v)) for r in rows]

    resumed, never_stopped = metrics(run), metrics(tmp_path / "never_stopped" / "tiny" / "version_0")
    assert {r["epoch"] for r in resumed} - {""} == {"0", "1"}
    assert logged(resumed) == logged(never_stopped)


@pytest.mark.parametrize(
    "extra, message, status",
    [
        (["fit", "--model.prest", "mini"], "model (vit.ViTClassifier): Option 'prest' is not accepted", 2),
        (["fit", "--nodel.preset", "mini"], "unrecognized arguments: --nodel.preset", 2),
        (["fit", "--model.lr", "fast"], 'model (vit.ViTClassifier): Parser key "lr": Expected a', 2),
        (["fit", "--model.lr", "-1"], "lr=-1.0 must be positive", 2),
        (["fit", "--model.vit.preset", "huge"], "unknown preset 'huge'", 2),
        (["fit", "--model.vit.patch_size", "5"], "not divisible by patch size 5", 2),
        (["fit", "--data.init_args.batch_size", "0"], "batch_size=0 must be at least 1", 2),
        (["fit", "--trainer.max_epochs", "-1"], "max_epochs=-1 needs max_steps", 2),
        (["fit", "--ckpt_path", "missing.ckpt"], "checkpoint not found: missing.ckpt", 1),
        (["test", "--ckpt_path", "best"], "--ckpt_path best only means something", 2),
        (["test", "--ckpt_path", "last"], "--ckpt_path last: no checkpoint matches", 1),
        (
            ["fit", "--checkpoint.every_n_train_steps", "5", "--checkpoint.every_n_epochs", "1"],
            "mutually exclusive",
            2,
        ),
    ],
)
def test_bad_input_is_one_line_error_and_leaves_nothing(
    runs, tmp_path, monkeypatch, capsys, extra, message, status
):
    """In-process; command_error checks the line starts with `error: ` and that no traceback or
    usage text was printed."""
    monkeypatch.chdir(tmp_path)  # relative paths (missing.ckpt) are read from here, as a user's are
    subcommand, *options = extra
    code, error = command_error(cli.main, [subcommand, *tiny_args(runs), *options], capsys)
    assert code == status
    assert message in error, error
    assert not runs.exists()


@pytest.mark.parametrize(
    "extra, loss",
    [([], "the validation loss"), (["--trainer.limit_val_batches", "0"], "the training loss")],
    ids=["validated", "not-validated"],
)
def test_a_diverging_run_stops_with_one_line_and_writes_no_nan_checkpoint(runs, capsys, extra, loss):
    """SGD at a learning rate far too large: the loss is nan within the first epoch. The run stops
    at that epoch's validation, before its checkpoint, or without validation at the epoch's end,
    rather than train on and save nan weights."""
    options = ["--model.optimizer", "sgd", "--model.lr", "1e4", "--trainer.max_epochs", "3", *extra]
    code, error = command_error(cli.main, ["fit", *tiny_args(runs), *options], capsys)
    assert code == 1
    assert error.startswith(f"error: training diverged: {loss} is nan after "), error
    assert "(epoch 0, learning rate" in error, error
    for path in runs.rglob("*.ckpt"):
        weights = torch.load(path, map_location="cpu", weights_only=False)["state_dict"].values()
        assert all(torch.isfinite(w).all() for w in weights if w.is_floating_point()), path


def test_every_process_stops_where_one_process_loss_diverged():
    """The processes decide together: a process whose own loss is finite stops too when another's
    is not (the strategy's decision says so), and none stops where no loss diverged."""
    from types import SimpleNamespace

    from vit.callbacks import FiniteLoss
    from vit.errors import TrainingDiverged

    def trainer(loss: float, elsewhere: bool):
        def decide(diverged: bool, all: bool) -> bool:  # this process's and the other's
            return (diverged and elsewhere) if all else (diverged or elsewhere)

        return SimpleNamespace(
            callback_metrics={"train/loss": torch.tensor(loss)},
            strategy=SimpleNamespace(reduce_boolean_decision=decide),
            optimizers=[SimpleNamespace(param_groups=[{"lr": 0.5}])],
            global_step=7,
            current_epoch=1,
        )

    FiniteLoss.check(trainer(1.0, elsewhere=False), "train/loss", "the training loss")
    with pytest.raises(TrainingDiverged, match="loss is nan or infinite in another process after 7 steps"):
        FiniteLoss.check(trainer(1.0, elsewhere=True), "train/loss", "the training loss")
    with pytest.raises(TrainingDiverged, match=r"loss is inf after 7 steps \(epoch 1, learning rate 0.5\)"):
        FiniteLoss.check(trainer(float("inf"), elsewhere=False), "train/loss", "the training loss")


@pytest.mark.slow
def test_bad_input_from_the_command_line_is_one_line_error_and_leaves_nothing(runs, tmp_path):
    """One of the cases above end to end, as a user meets it: `python train.py` in a process of
    its own, a relative path read from its working folder, and its exit status."""
    result = run_train("fit", *tiny_args(runs), "--ckpt_path", "missing.ckpt", cwd=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors[-1] == "error: checkpoint not found: missing.ckpt", result.stderr
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr
    assert not runs.exists()


@pytest.mark.slow
def test_attention_cli_errors_are_one_line(tmp_path):
    command = [
        "-m",
        "vit.commands.attention",
        "--ckpt",
        str(tmp_path / "nope.ckpt"),
        "--out",
        str(tmp_path / "o"),
    ]
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=ROOT)
    assert (
        result.returncode == 1
        and result.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'nope.ckpt'}"
    )
    assert not (tmp_path / "o").exists()


def test_unsafe_checkpoint_is_refused(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "x": UnsafePayload(tmp_path / "marker")}, path)
    with pytest.raises(ValueError, match="refusing"):
        load_checkpoint(path)
    assert not (tmp_path / "marker").exists()  # its code never ran


@pytest.mark.slow
def test_vit_train_command_exits_zero(runs, tmp_path):
    """The installed command wraps main() in sys.exit(): a finished run must exit 0."""
    script = Path(sys.executable).parent / "vit-train"
    if not script.exists():
        pytest.skip("vit-train is not installed next to this Python")
    args = tiny_args(runs, "--trainer.max_epochs", "1", "--data.init_args.num_train", "64")
    result = subprocess.run([str(script), "fit", *args], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_cnn_baseline_trains_from_the_same_cli(runs):
    cnn = ["--model", "CNNClassifier", "--model.receptive_field", "5", "--model.width", "8"]
    cli.main(["fit", *tiny_args(runs, *cnn, "--trainer.max_epochs", "1")])
    model, datamodule = load_checkpoint(runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt")
    assert isinstance(model, CNNClassifier) and model.model.receptive_field == 5
    assert isinstance(datamodule, TwoCircles)


@pytest.mark.slow
def test_the_cifar10_cpu_config_at_depth_0_trains_evaluates_and_exports(runs, tmp_path, capsys):
    """configs/cifar10_cpu.yaml's control without attention, `--model.vit.depth 0`, at toy size
    (a width-32 network, a stem of 8 channels, one epoch of 32 fake CIFAR-10 images): it trains
    (its options that shape blocks, such as locality_attention, ignored), vit-eval measures its
    checkpoint, vit-export writes it and reads it back, and vit-attention refuses it in one line."""
    from lab.cifar10_pack import fake_cifar10
    from vit.commands import export as export_command
    from vit.commands.attention import main as attention_main
    from vit.export import read_folder

    root = fake_cifar10(tmp_path / "data", per_class=4)
    cli.main(
        [
            "fit", "--config", str(ROOT / "configs" / "cifar10_cpu.yaml"), "--model.vit.depth", "0",
            "--model.vit.dim", "32", "--model.vit.conv_stem", "[8, 8, 8, 8, 8]",
            "--data.init_args.root", str(root), "--data.init_args.download", "false",
            "--data.init_args.val_size", "8", "--data.init_args.batch_size", "8",
            "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.logger.init_args.save_dir", str(runs), "--model.compile", "false",  # 16 s
        ]
    )  # fmt: skip
    run = runs / "cifar10_cpu" / "version_0"
    assert "Total FLOPs" in capsys.readouterr().out  # the model summary counted them
    assert 0.0 <= last_value(metrics(run), "val/acc") <= 1.0
    best = run / "checkpoints" / "best.ckpt"
    classifier, _ = load_checkpoint(best)
    assert len(classifier.model.blocks) == 0 and classifier.hparams.vit["locality_attention"]

    measured = evaluate(EvalOptions(ckpt=best), progress=False)
    assert measured["num_images"] == 40 and 0.0 <= measured["top1"] <= 1.0
    export_command.main(["--ckpt", str(best), "--out", str(tmp_path / "exported")])
    exported, _ = read_folder(tmp_path / "exported")
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(exported(images), classifier.model.eval()(images))
    status, message = command_error(attention_main, ["--ckpt", best, "--out", tmp_path / "maps"], capsys)
    assert status == 2 and message.endswith("depth 0 (no transformer blocks): it has no attention to show")


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_that_emulates_it_trains_in_fp32(monkeypatch, capsys, runs, native):
    """The CIFAR-10 CPU config asks for bf16-mixed; on an AVX2-only CPU that is 18x slower than
    fp32, so vit-train trains in 32-true there and says so (before: a warning, then bf16 anyway)."""
    import vit.optim

    monkeypatch.setattr(vit.optim, "cpu_has_native_bf16", lambda: native)
    args = tiny_args(runs, "--trainer.precision", "bf16-mixed", "--trainer.max_steps", "1")
    result = cli.run(["fit", *args, "--trainer.limit_val_batches", "0"])
    assert result.trainer.precision == ("bf16-mixed" if native else "32-true")
    saved = (runs / "tiny" / "version_0" / "config.yaml").read_text()
    assert ("precision: 32-true" in saved) is not native  # the run's config says what it ran
    message = "no native bf16 (AVX-512 BF16 or AMX), where precision bf16-mixed is emulated"
    assert (message in capsys.readouterr().err) is not native
    assert cli.precision_for_this_cpu("32-true", "cpu") == "32-true"
    assert cli.precision_for_this_cpu("bf16-mixed", "cuda") == "bf16-mixed"
    assert cli.precision_for_this_cpu(None, "cpu") is None  # unset stays Lightning's default


@pytest.mark.slow
def test_tensorboard_logger_replaces_the_csv_one(runs):
    """`--trainer.logger TensorBoardLogger` (the tensorboard extra) keeps the config's folder and
    name and writes TensorBoard's event file instead of metrics.csv."""
    pytest.importorskip("tensorboard")
    logger = ["--trainer.logger", "TensorBoardLogger", "--trainer.max_epochs", "1"]
    cli.main(["fit", *tiny_args_with_logger(runs, logger)])
    events = list(runs.rglob("events.out.tfevents.*"))
    assert events and not list(runs.rglob("metrics.csv"))
    assert (events[0].parent / "checkpoints" / "best.ckpt").exists()


def tiny_args_with_logger(runs: Path, logger: list[str]) -> list[str]:
    # the logger's class first, then its arguments (jsonargparse applies them in order)
    args = tiny_args(runs)
    at = args.index("--trainer.logger.init_args.save_dir")
    return [*args[:at], *logger, *args[at:]]
