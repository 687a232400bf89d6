"""The maps while a model trains: `vit.interpret.watching.AttentionMaps` (the pictures in the run
folder, TensorBoard and MLflow), the images it picks, and the run folder it writes into."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import tiny_args
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from PIL import Image

from vit import CNNClassifier, TwoCircles, ViTClassifier, ViTConfig
from vit.callbacks import run_folder
from vit.commands import train as cli
from vit.errors import UsageError
from vit.interpret.figures import training_maps
from vit.interpret.maps import method_maps
from vit.interpret.watching import AttentionMaps, EvidenceMass, spread_over_classes


def test_the_images_spread_over_the_classes_one_of_each_before_a_second():
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3])
    four = spread_over_classes(labels, 4, seed=0)
    assert labels[four].tolist() == [0, 1, 2, 3]
    six = spread_over_classes(labels, 6, seed=0)
    counts = torch.bincount(labels[six], minlength=4).tolist()
    assert sorted(counts) == [1, 1, 2, 2] and counts[3] == 1  # class 3 has only one image
    assert labels[six].tolist() == sorted(labels[six].tolist())  # in the order of their classes
    assert len(set(six.tolist())) == 6
    assert torch.equal(spread_over_classes(labels, 6, seed=0), six)  # the seed decides
    draws = {tuple(spread_over_classes(labels, 4, seed=s).tolist()) for s in range(10)}
    assert len(draws) > 1  # and it is a random draw within each class
    assert spread_over_classes(labels, 20, seed=0).sort().values.tolist() == list(range(10))


def tiny_fit(tmp_path: Path, callbacks: list, logger=None, epochs: int = 2, ckpt_path=None, model=None):
    torch.manual_seed(0)
    data = TwoCircles(num_train=128, num_val=32, num_test=32, batch_size=32)
    if model is None:
        model = ViTClassifier(
            num_classes=4, image_size=32, in_channels=1, vit=ViTConfig(preset="micro", patch_size=8)
        )
    trainer = L.Trainer(
        max_epochs=epochs,
        logger=logger or CSVLogger(tmp_path, name="run"),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        accelerator="cpu",
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer, model, data


def test_each_validation_draws_the_maps_of_the_model_it_validates(tmp_path):
    """The maps of the last validation are those of the trained model (the last validation comes
    after the last step), on the chosen images, drawn over them in the picture written."""
    maps = AttentionMaps(num_images=4)
    trainer, model, data = tiny_fit(tmp_path, [maps])
    folder = run_folder(trainer) / "attention"
    assert folder == tmp_path / "run" / "version_0" / "attention"
    names = ["epoch_000_step_000000.png", "epoch_000.png", "epoch_001.png"]  # before training, epochs
    names += [f"image_{k}.png" for k in range(4)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    assert [(h["epoch"], h["step"], h["ended"]) for h in maps.history] == [(0, 0, 0), (0, 4, 1), (1, 8, 1)]
    images, captions, evidence = maps._data
    chosen = spread_over_classes(data.split("val").labels, 4, seed=0)
    assert torch.equal(images, data.split("val")[chosen][0])
    assert captions == [data.classes[i] for i in data.split("val").labels[chosen]]
    assert evidence is not None and evidence.shape == (4, 16)  # two circles knows its circles
    model.eval()
    for spec in maps.specs:
        expected = method_maps(model.model, images, spec)
        torch.testing.assert_close(maps.history[-1]["maps"][spec.method], expected)
    picture = np.asarray(Image.open(folder / "epoch_001.png"))
    left, top, tile = 96, 30, 96  # the picture's margins and a 32-pixel image blown up 3 times
    assert picture.shape == (top + 3 * (tile + 2), left + 4 * (tile + 2), 3)
    first = images[0, 0]  # one channel, shown grey and scaled to its own range
    shown = ((first - first.min()) / (first.max() - first.min()) * 255).round()
    drawn = torch.tensor(picture[top : top + tile : 3, left : left + tile : 3, 0]).float()
    torch.testing.assert_close(drawn, shown, atol=1, rtol=0)


def test_the_maps_of_every_validation_survive_a_resume(tmp_path):
    first = AttentionMaps(num_images=2, methods=("rollout",))
    trainer, _, _ = tiny_fit(tmp_path, [first], epochs=1)
    last = run_folder(trainer) / "checkpoints" / "last.ckpt"
    if not last.exists():  # Lightning's own checkpoint of the epoch
        last = next((run_folder(trainer) / "checkpoints").glob("*.ckpt"))
    resumed = AttentionMaps(num_images=2, methods=("rollout",))
    tiny_fit(tmp_path, [resumed], epochs=2, ckpt_path=last)
    assert [h["step"] for h in resumed.history] == [0, 4, 8]  # no new start: the run goes on
    torch.testing.assert_close(resumed.history[1]["maps"]["rollout"], first.history[1]["maps"]["rollout"])


def test_the_picture_puts_each_note_in_its_tile():
    images = torch.rand(2, 1, 32, 32)
    maps = {"rollout": torch.rand(2, 4, 4)}
    plain = training_maps(images, maps, ["a", "b"], "title")
    noted = training_maps(images, maps, ["a", "b"], "title", {"rollout": ["0.50", "0.25"]})
    changed = np.nonzero((plain != noted).any(-1))
    rows, cols = changed
    tile, top, left = 96, 30, 96
    assert rows.min() >= top + tile + 2 and rows.max() < top + 2 * (tile + 2)  # the method's row
    assert {(c - left) // (tile + 2) for c in cols} == {0, 1}  # both tiles, in their corners


def test_nothing_runs_on_training_steps():
    """The callbacks act after validations only: a GPU step never waits for them."""
    for callback in (AttentionMaps, EvidenceMass):
        for hook in ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward"):
            assert getattr(callback, hook) is getattr(Callback, hook), (callback, hook)


def test_bad_choices_are_refused_before_training(tmp_path, capsys):
    with pytest.raises(UsageError, match="unknown method"):
        AttentionMaps(methods=("nope",))
    with pytest.raises(UsageError, match="query_patch"):
        AttentionMaps(methods=("query",))
    with pytest.raises(ValueError, match="num_images >= 1 and columns >= 2, not 0, 12"):
        AttentionMaps(num_images=0)
    with pytest.raises(ValueError, match="not 8, 1"):
        AttentionMaps(columns=1)
    steps = []

    class Steps(Callback):
        def on_train_batch_end(self, *args):
            steps.append(1)

    model = ViTClassifier(
        num_classes=4,
        image_size=32,
        in_channels=1,
        vit=ViTConfig(preset="micro", patch_size=8, pool="mean", class_token=False),
    )
    with pytest.raises(UsageError, match="no class token"):
        tiny_fit(tmp_path, [AttentionMaps(methods=("cls",)), Steps()], model=model)
    assert not steps


@pytest.mark.parametrize(
    "network, why", [("cnn", "not a ViT"), ("depth 0", "a ViT of depth 0 has no attention to show")]
)
@pytest.mark.slow
def test_a_model_without_attention_trains_on_with_one_line(tmp_path, capsys, network, why):
    """A CNN, or a ViT without blocks: each callback says in one line that it shows nothing."""
    vit = ViTConfig(preset="micro", patch_size=8, depth=0, pool="mean")
    model = (
        CNNClassifier(num_classes=4, image_size=32, in_channels=1)
        if network == "cnn"
        else ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=vit)
    )
    maps = AttentionMaps()
    trainer, _, _ = tiny_fit(tmp_path, [maps, EvidenceMass()], model=model, epochs=1)
    out = capsys.readouterr().out
    assert f"AttentionMaps: nothing to draw ({why})" in out and f"EvidenceMass: nothing to log ({why})" in out
    assert trainer.global_step > 0 and "val/evidence_mass_rollout" not in trainer.callback_metrics
    assert not maps.history and not (tmp_path / "run" / "version_0" / "attention").exists()


def test_tensorboard_gets_the_pictures_at_their_steps_and_the_evidence_curve(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    maps = AttentionMaps(num_images=2, methods=("rollout",))
    logger = TensorBoardLogger(tmp_path, name="run")
    trainer, _, _ = tiny_fit(tmp_path, [maps, EvidenceMass(num_images=8)], logger=logger)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    pictures = events.Images("attention")
    assert [p.step for p in pictures] == [h["step"] for h in maps.history] == [0, 4, 8]
    # the PNG written, as it is
    assert (
        pictures[-1].encoded_image_string
        == (run_folder(trainer) / "attention" / "epoch_001.png").read_bytes()
    )
    assert (pictures[-1].width, pictures[-1].height) == (96 + 2 * 98, 30 + 2 * 98)
    masses = events.Scalars("val/evidence_mass_rollout")
    assert [m.step for m in masses] == [0, 3, 7]  # before training, then at each validation's last step
    assert all(0 < m.value < 1 for m in masses)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real MLflow tracking server on 127.0.0.1 (its store and artifacts in tmp_path), stopped
    after the test."""
    pytest.importorskip("mlflow")
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
               "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"]  # fmt: skip
    log = open(tmp_path / "mlflow.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "mlflow.log").read_text()
                time.sleep(0.25)
        else:
            raise AssertionError("the MLflow server did not start in 60 s")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_mlflow_gets_the_figures_the_pictures_and_the_config(mlflow_server, runs, monkeypatch):
    """vit-train with MLflow's logger and a tracking server, as a team runs it: the scalars, the
    attention pictures and config.yaml are on the server; checkpoints in the run's own folder."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(runs.parent)
    logger = ["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger",
              "--trainer.logger.init_args.tracking_uri", mlflow_server,
              "--trainer.logger.init_args.experiment_name", "tiny",
              "--trainer.default_root_dir", str(runs)]  # fmt: skip
    args = tiny_args(runs)
    at = args.index("--trainer.logger.init_args.save_dir")
    cli.main(["fit", *args[:at], *logger, "--trainer.max_epochs", "2"])
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([experiment.experiment_id])
    accuracies = client.get_metric_history(run.info.run_id, "val/acc")
    assert len(accuracies) == 2 and all(0 <= a.value <= 1 for a in accuracies)
    assert client.get_metric_history(run.info.run_id, "val/evidence_mass_rollout")
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "attention"} <= top
    pictures = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "attention")}
    assert {"epoch_000.png", "epoch_001.png", "image_0.png", "image_7.png"} <= pictures
    folder = runs / experiment.experiment_id / run.info.run_id
    assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file()


def test_the_maps_before_training_leave_the_network_as_they_found_it(tmp_path):
    """Before the first step the network is in training mode: the maps and the evidence mass are
    computed in eval mode (no dropout, BatchNorm's statistics left alone), which is then put back."""

    class Buffers(Callback):
        @staticmethod
        def statistics(network):
            norms = [m for m in network.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            return [b.clone() for m in norms for b in m.buffers()]

        def on_fit_start(self, trainer, pl_module):
            self.before = self.statistics(pl_module.model)

        def on_train_start(self, trainer, pl_module):  # after the callbacks listed before it
            self.after, self.training = self.statistics(pl_module.model), pl_module.model.training

    buffers = Buffers()
    model = ViTClassifier(
        num_classes=4,
        image_size=32,
        in_channels=1,
        vit=ViTConfig(preset="micro", patch_size=8, conv_stem=[4]),
    )
    tiny_fit(
        tmp_path, [AttentionMaps(num_images=2), EvidenceMass(num_images=8), buffers], model=model, epochs=1
    )
    assert len(buffers.before) == 3 and buffers.training
    for before, after in zip(buffers.before, buffers.after, strict=True):
        torch.testing.assert_close(after, before, atol=0, rtol=0)
