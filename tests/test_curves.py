"""`vit-eval curves` and `vit.curves`: runs read from hand-written metrics.csv files and TensorBoard
events whose answers are known (series, fractional epochs, minutes, best and last figures, config
differences), runs still being written, folders without metrics, and the command end to end."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import command_error, tiny_args

from vit.commands.curves import parse_run
from vit.commands.eval import main
from vit.curves import config_changes, curves_figure, find_runs, read_run, runs_table

HEADER = "epoch,step,time/minutes,train/acc,train/loss,val/acc,val/loss\n"
# 10 steps an epoch, train/loss every 5 steps, a validation at the end of each epoch
ROWS = (
    "0,4,,,2.0,,\n0,9,,,1.5,,\n0,9,1.0,,,0.50,1.2\n0,9,,0.40,,,\n"
    "1,14,,,1.2,,\n1,19,,,1.0,,\n1,19,2.5,,,0.70,0.9\n1,19,,0.60,,,\n"
    "2,24,,,0.8,,\n2,29,,,0.7,,\n2,29,4.0,,,0.65,0.95\n2,29,,0.72,,,\n"
)
CONFIG = """# lightning.pytorch==2.6.6
seed_everything: 0
trainer:
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {{save_dir: runs, name: demo, version: {version}}}
  callbacks:
  - class_path: vit.interpret.watching.EvidenceMass
    init_args: {{num_images: {images}}}
  max_epochs: 3
model:
  init_args: {{lr: {lr}, betas: [0.9, 0.999]}}
ckpt_path: {ckpt}
"""


def write_run(folder, rows=ROWS, config=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.csv").write_text(HEADER + rows)
    if config is not None:
        (folder / "config.yaml").write_text(CONFIG.format(**config))
    return folder


def curves(*args):
    main(["curves", *[str(a) for a in args]])


def test_a_metrics_csv_is_read_as_its_series_with_epochs_and_minutes(tmp_path):
    run = read_run(write_run(tmp_path / "version_0"))
    steps, losses = run.series("train/loss")
    assert steps.tolist() == [4, 9, 14, 19, 24, 29] and losses.tolist() == [2.0, 1.5, 1.2, 1.0, 0.8, 0.7]
    assert run.series("val/acc")[0].tolist() == [9, 19, 29]
    assert run.series("train/acc")[1].tolist() == [0.4, 0.6, 0.72]
    # the last step of epoch e ends epoch e + 1; no step is done at -1
    assert run.epochs([-1, 4, 9, 14, 29]).tolist() == [0.0, 0.5, 1.0, 1.5, 3.0]
    # minutes at each validation, linear between them, on at the last pace after the last one
    np.testing.assert_allclose(run.minutes([-1, 4, 9, 14, 29, 34]), [0, 0.5, 1.0, 1.75, 4.0, 4.75])
    assert run.summary() == {
        "label": "version_0",
        "path": str(tmp_path / "version_0"),
        "best_val_acc": {"value": 0.70, "step": 19, "epoch": 2.0},
        "last_val_acc": 0.65,
        "last_val_loss": 0.95,
        "steps": 30,
        "epochs": 3.0,
        "minutes": 4.0,
    }
    assert run.config is None


def test_a_test_after_training_is_not_a_point_of_training(tmp_path):
    """`vit-train test` and tools/demo_seeds.py test into the run's metrics.csv: a row one epoch and
    one step past training's last, with test/ figures only, which would add an epoch under way."""
    folder = tmp_path / "run"
    folder.mkdir()
    rows = "".join(f"{row},\n" for row in ROWS.splitlines()) + "3,30,,,,,,0.66\n"
    (folder / "metrics.csv").write_text(HEADER.replace("\n", ",test/acc\n") + rows)
    run = read_run(folder)
    assert run.summary()["steps"] == 30 and run.summary()["epochs"] == 3.0
    assert "test/acc" not in run.metrics


def test_a_run_still_being_written_is_read_as_far_as_it_is_complete(tmp_path):
    # epoch 3 under way: one whole row, a row with fewer fields, and a last line cut in its last
    # number (0.9123 being written), without its line end
    write_run(tmp_path / "run", ROWS + "3,34,,,0.6,,\n3,36,,\n3,39,6.0,,,0.80,0.9")
    run = read_run(tmp_path / "run")
    assert run.series("train/loss")[0].tolist() == [4, 9, 14, 19, 24, 29, 34]
    assert run.epochs([34]).tolist() == [3.5]  # the epoch under way goes on at the pace of those before
    assert run.summary()["steps"] == 35 and run.summary()["epochs"] == 3.5
    assert run.summary()["last_val_acc"] == 0.65 and run.summary()["minutes"] == 4.0
    write_run(tmp_path / "header", "")  # no row yet
    empty = read_run(tmp_path / "header")
    assert empty.metrics == {} and empty.summary()["steps"] == 0
    figures = ("best_val_acc", "last_val_acc", "last_val_loss", "epochs", "minutes")
    assert [empty.summary()[k] for k in figures] == [None] * 5


def test_a_resumed_run_extrapolates_back_to_its_first_steps(tmp_path):
    """A run resumed at step 20 (its metrics.csv starts in epoch 2) is not anchored at step -1."""
    rows = "2,24,,,0.8,,\n2,29,3.0,,,0.65,0.95\n3,34,,,0.6,,\n3,39,5.0,,,0.7,0.9\n4,44,,,0.5,,\n"
    run = read_run(write_run(tmp_path / "resumed", rows))
    assert run.epochs([24, 29, 34, 39, 44]).tolist() == [2.5, 3.0, 3.5, 4.0, 4.5]
    assert run.minutes([24, 34, 44]).tolist() == [2.0, 4.0, 6.0]


def test_the_config_differences_leave_out_where_each_run_was_written(tmp_path):
    first = {"version": 0, "images": 64, "lr": 0.003, "ckpt": "null"}
    runs = [
        read_run(write_run(tmp_path / "version_0", config=first)),
        read_run(write_run(tmp_path / "version_1", config={**first, "version": 1, "ckpt": "last"})),
        read_run(write_run(tmp_path / "version_2", config={**first, "version": 2, "lr": 0.001, "images": 8})),
        read_run(write_run(tmp_path / "version_3")),  # no config.yaml
    ]
    assert runs[0].config["model.init_args.betas"] == [0.9, 0.999]  # a list of values whole
    assert runs[0].config["trainer.callbacks.0.init_args.num_images"] == 64  # a list of dicts by index
    assert config_changes(runs) == [
        {},
        {},
        {"model.init_args.lr": [0.003, 0.001], "trainer.callbacks.0.init_args.num_images": [64, 8]},
        None,
    ]


def test_tensorboard_events_are_read_as_written(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path / "tb" / "version_0"
    writer = SummaryWriter(str(folder))
    start = 1_000_000.0
    for step, loss in ((4, 2.0), (9, 1.5), (14, 1.25), (19, 1.0)):
        writer.add_scalar("train/loss", loss, step, walltime=start + 6 * (step + 1))
        writer.add_scalar("epoch", step // 10, step, walltime=start + 6 * (step + 1))
    for step, acc in ((9, 0.5), (19, 0.75)):
        writer.add_scalar("val/acc", acc, step, walltime=start + 6 * (step + 1))
    writer.close()
    [found] = find_runs(tmp_path / "tb")
    run = read_run(found)
    assert run.series("train/loss")[0].tolist() == [4, 9, 14, 19]
    assert run.series("train/loss")[1].tolist() == [2.0, 1.5, 1.25, 1.0]
    assert run.series("val/acc")[1].tolist() == [0.5, 0.75]
    assert run.epochs([4, 19]).tolist() == [0.5, 2.0]
    # no time/minutes logged: the wall times from the first event (step 4, 30 s after `start`)
    np.testing.assert_allclose(run.series("time/minutes")[1], [0, 0.5, 1.0, 1.5])
    assert run.summary()["best_val_acc"] == {"value": 0.75, "step": 19, "epoch": 2.0}


def test_a_run_argument_is_a_path_with_a_label_and_a_factor_where_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lr=0.1").mkdir()  # an existing path is read as a path, whatever it holds
    assert parse_run("runs/a") == (None, Path("runs/a"), 1.0)
    assert parse_run("lr=0.1") == (None, Path("lr=0.1"), 1.0)
    assert parse_run("fast, seed 0=lr=0.1*1.39") == ("fast, seed 0", Path("lr=0.1"), 1.39)


def test_tensorboard_events_without_tensorboard_say_what_to_install(tmp_path, monkeypatch, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.out.tfevents.1.host.0.0").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    status, error = command_error(main, ["curves", tmp_path / "run", "--out", tmp_path / "out"], capsys)
    assert status == 1 and error.endswith('reading them needs tensorboard (pip install -e ".[tensorboard]")')


@pytest.mark.slow
def test_a_parent_folder_holds_one_run_per_version_in_natural_order(tmp_path, capsys):
    for version in (10, 2):
        write_run(tmp_path / "runs" / "demo" / f"version_{version}")
    (tmp_path / "runs" / "demo" / "notes").mkdir()
    assert [p.name for p in find_runs(tmp_path / "runs")] == ["version_2", "version_10"]
    curves(tmp_path / "runs", "--out", tmp_path / "out")
    written = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert [run["label"] for run in written] == ["version_2", "version_10"]
    curves(f"lr={tmp_path / 'runs'}", "--out", tmp_path / "named")  # a label for a folder of runs
    written = json.loads((tmp_path / "named" / "runs.json").read_text())
    assert [run["label"] for run in written] == ["lr/demo/version_2", "lr/demo/version_10"]
    runs = [read_run(p, p.name) for p in find_runs(tmp_path / "runs")]
    figure = curves_figure(runs)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["version_2", "version_10"]
    loss_by_step = figure.axes[0]
    assert len(loss_by_step.lines) == 4  # train/loss and val/loss of each run
    assert loss_by_step.lines[0].get_ydata().tolist() == [2.0, 1.5, 1.2, 1.0, 0.8, 0.7]


def test_the_command_prints_its_table_and_writes_the_figure_and_runs_json(tmp_path, capsys):
    first = {"version": 0, "images": 64, "lr": 0.003, "ckpt": "null"}
    write_run(tmp_path / "a" / "version_0", config=first)
    faster = ROWS.replace("0.70,0.9", "0.80,0.8")
    write_run(tmp_path / "b" / "version_0", faster, config={**first, "lr": 0.001})
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    curves(tmp_path / "a", tmp_path / "empty", f"fast={tmp_path / 'b'}*0.5", "--out", out, "--title", "t")
    captured = capsys.readouterr()
    assert captured.err == f"{tmp_path / 'empty'}: no metrics.csv or TensorBoard events; left out\n"
    lines = captured.out.splitlines()
    header = "run best val/acc (epoch) last val/acc last val/loss epochs minutes"
    assert " ".join(lines[0].split()) == header
    assert lines[1].split() == ["a/version_0", "0.7000", "(2.00)", "0.6500", "0.9500", "3.00", "4.00"]
    assert lines[2].split() == ["fast", "0.8000", "(2.00)", "0.6500", "0.9500", "3.00", "2.00"]
    assert lines[4:6] == ["config differences from a/version_0:", "  fast: model.init_args.lr 0.003 -> 0.001"]
    assert lines[-1] == f"wrote curves.png, runs.json into {out}"
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "runs.json"]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    written = json.loads((out / "runs.json").read_text())
    assert [run["label"] for run in written] == ["a/version_0", "fast"]
    assert written[1]["minutes"] == 2.0 and written[1]["minutes_factor"] == 0.5
    assert written[1]["config_changes"] == {"model.init_args.lr": [0.003, 0.001]}
    assert written[1]["best_val_acc"] == {"value": 0.8, "step": 19, "epoch": 2.0}


def test_without_any_run_the_command_stops_with_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty" / "version_0").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    out = tmp_path / "out"
    status, error = command_error(
        main, ["curves", tmp_path / "empty", tmp_path / "other", "--out", out], capsys
    )
    assert (status, error) == (
        1,
        "error: no run to draw: no metrics.csv or TensorBoard events in the folders given",
    )
    missing = tmp_path / "nowhere"
    status, error = command_error(main, ["curves", missing, "--out", out], capsys)
    assert (status, error) == (1, f"error: {missing}: no such file or folder")
    write_run(tmp_path / "run")
    status, error = command_error(main, ["curves", f"{tmp_path / 'run'}*x", "--out", out], capsys)
    assert status == 2 and error.endswith("the factor after * must be a number")
    assert not out.exists()


def test_help_names_the_runs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["curves", "--help"])
    assert exit_info.value.code == 0
    help = capsys.readouterr().out
    assert help.startswith("usage: vit-eval curves") and "RUN [RUN ...]" in help and "--out DIR" in help


@pytest.mark.slow
def test_a_run_of_vit_train_is_read_as_lightning_wrote_it(runs, tmp_path, capsys):
    from vit.commands import train

    train.main(["fit", *tiny_args(runs)])  # 2 epochs of 16 steps, a validation after each
    curves(runs, "--out", tmp_path / "out")
    [written] = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert written["label"] == "version_0" and written["config_changes"] == {}
    assert (written["steps"], written["epochs"]) == (32, 2.0)
    assert written["best_val_acc"]["step"] in (15, 31) and written["best_val_acc"]["epoch"] in (1.0, 2.0)
    assert 0 < written["minutes"] < 5


def test_a_run_without_epochs_or_minutes_is_drawn_against_steps_alone(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("step,val/acc\n9,0.5\n19,0.75\n")
    run = read_run(tmp_path / "run")
    summary = run.summary()
    assert summary["best_val_acc"] == {"value": 0.75, "step": 19, "epoch": None}
    assert (summary["steps"], summary["epochs"], summary["minutes"]) == (20, None, None)
    json.dumps(summary, allow_nan=False)  # runs.json stays JSON
    row = runs_table([summary | {"config_changes": None}]).splitlines()[1]
    assert row.split() == ["run", "0.7500", "0.7500", "-", "-", "-"]  # no epoch after the best
    steps, epochs, minutes = curves_figure([run]).axes[3:6]  # the accuracy row
    assert steps.lines[0].get_xdata().tolist() == [9, 19]
    assert np.isnan(epochs.lines[0].get_xdata()).all() and np.isnan(minutes.lines[0].get_xdata()).all()


def test_values_between_and_beyond_known_points_follow_the_nearest_segments():
    from vit.curves import along

    known = {0: 0.0, 10: 1.0, 20: 3.0, 30: 4.0}  # slopes 0.1, 0.2, 0.1
    np.testing.assert_allclose(along([-10, 5, 15, 25, 40], known), [-1.0, 0.5, 2.0, 3.5, 5.0])
    np.testing.assert_allclose(along([-5, 7], {3: 2.0}), [2.0, 2.0])  # one point: that value
    assert np.isnan(along([1, 2], {})).all()  # none: not drawn


def test_a_config_key_of_one_run_only_is_a_difference():
    from vit.curves import Run

    first = Run(Path("a"), "a", {}, {"model.lr": 0.1})
    second = Run(Path("b"), "b", {}, {"model.lr": 0.1, "trainer.callbacks.1.class_path": "EMA"})
    assert config_changes([first, second]) == [{}, {"trainer.callbacks.1.class_path": [None, "EMA"]}]


def test_a_csv_file_is_a_run_and_metrics_csv_stands_for_its_folder(tmp_path):
    write_run(tmp_path / "demo", config={"version": 0, "images": 64, "lr": 0.003, "ckpt": "null"})
    copy = tmp_path / "other.csv"
    copy.write_text((tmp_path / "demo" / "metrics.csv").read_text())
    assert find_runs(copy) == [copy] and find_runs(tmp_path / "demo" / "metrics.csv") == [tmp_path / "demo"]
    from vit.curves import short_labels

    assert short_labels([copy, tmp_path / "demo"]) == ["other", "demo"]
    run = read_run(copy)
    assert run.series("val/acc")[1].tolist() == [0.50, 0.70, 0.65] and run.config is None
    assert read_run(tmp_path / "demo").config["model.init_args.lr"] == 0.003


def test_what_cannot_be_read_is_named_with_its_place(tmp_path):
    from vit.errors import DataError

    bad = write_run(tmp_path / "bad", "0,4,,,2.0,,\n0,9,,,nan?,,\n")
    with pytest.raises(DataError, match=r"bad/metrics.csv, line 3: 'nan\?' is not a number"):
        read_run(bad)
    (bad / "metrics.csv").write_text(HEADER.replace("step", "iteration") + "0,4,,,2.0,,\n")
    with pytest.raises(DataError, match="has no step column"):
        read_run(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: no metrics.csv or TensorBoard events"):
        read_run(tmp_path / "empty")
    good = write_run(tmp_path / "good")
    (good / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(DataError, match="config.yaml is not YAML"):
        read_run(good)


@pytest.mark.slow
def test_every_tensorboard_event_is_read_and_logged_minutes_are_kept(tmp_path):
    """TensorBoard's reader keeps a sample of 10,000 scalars a tag unless told to keep all."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(10_050):
        writer.add_scalar("train/loss", 1 / (1 + step), step, walltime=1000.0 + step)
    writer.add_scalar("time/minutes", 7.5, 10_049, walltime=20_000.0)
    writer.close()
    run = read_run(tmp_path / "tb")
    assert run.series("train/loss")[0].tolist() == list(range(10_050))
    assert run.series("time/minutes")[1].tolist() == [7.5]  # logged: not made from wall times


def test_the_figure_draws_each_run_in_its_colour_against_steps_epochs_and_minutes(tmp_path):
    runs = [read_run(write_run(tmp_path / "a")), read_run(write_run(tmp_path / "b"))]
    axes = curves_figure(runs, "two runs").axes  # loss row, then accuracy row; steps, epochs, minutes
    titles = ["against optimizer steps", "against epochs", "against training minutes", "", "", ""]
    assert [ax.get_title() for ax in axes] == titles
    xlabels = ["optimizer step", "epoch", "minutes of training (validation included)"]
    assert [ax.get_xlabel() for ax in axes[3:]] == xlabels
    assert axes[0].get_ylabel().startswith("loss") and axes[3].get_ylabel().startswith("accuracy")
    assert not any(ax.get_ylabel() for ax in (*axes[1:3], *axes[4:]))
    for ax in axes:  # each run: its two metrics of the row, in one colour, the runs in two
        colours = [line.get_color() for line in ax.lines]
        assert len(ax.lines) == 4 and colours[0] == colours[1] != colours[2] == colours[3]
    val_acc = axes[4].lines[0]  # the first run's val/acc against epochs
    assert val_acc.get_xdata().tolist() == [1.0, 2.0, 3.0] and val_acc.get_ydata().tolist() == [
        0.5,
        0.7,
        0.65,
    ]
    assert axes[5].lines[0].get_xdata().tolist() == [1.0, 2.5, 4.0]  # against minutes
    assert val_acc.get_marker() == "o" and axes[3].lines[1].get_linestyle() == "--"  # train/acc dashed
    legend = axes[0].figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b"]
    first, second = axes[0].lines[0].get_color(), axes[0].lines[2].get_color()
    assert [h.get_color() for h in legend.legend_handles] == [first, second]


def test_the_table_says_how_each_config_differs_or_that_there_is_none(tmp_path):
    first = {"version": 0, "images": 64, "lr": 0.003, "ckpt": "null"}
    runs = [
        read_run(write_run(tmp_path / "a", config=first)),
        read_run(write_run(tmp_path / "b", config={**first, "version": 1})),
        read_run(write_run(tmp_path / "c")),
    ]
    summaries = [r.summary() | {"config_changes": c} for r, c in zip(runs, config_changes(runs), strict=True)]
    lines = runs_table(summaries).splitlines()
    assert lines[0].split()[0] == "run" and lines[0].index("run") == 0
    assert lines[-4:] == ["", "config differences from a:", "  b: the same config", "  c: no config.yaml"]
