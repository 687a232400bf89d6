"""Runs in an object store: vit-train writing its config.yaml, metrics.csv, attention pictures and
checkpoints under s3://bucket/prefix, resuming from the last.ckpt there, and vit-eval reading a
checkpoint from there; bad buckets, refused credentials and missing checkpoints as one line that
writes nothing. Against moto's S3 server on 127.0.0.1 (lab/s3server.py), with its address and
credentials in the environment, as a user's come. (A store that fails in the middle of a run:
test_object_store_faults.py.)"""

from __future__ import annotations

import csv
import io
import os
import signal
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import ROOT, UnsafePayload, command_error, run_train, tiny_args
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger

from lab.s3server import S3Server
from vit import TwoCircles, ViTClassifier, ViTConfig
from vit.callbacks import Profile, log_artifact
from vit.checkpoint import read_checkpoint
from vit.commands import eval as vit_eval
from vit.commands import train as cli
from vit.commands.eval import EvalOptions, evaluate

# A few steps: 64 training images in batches of 16 (4 steps an epoch), 32 to validate and test.
SMALL = ["--data.init_args.num_train", "64", "--data.init_args.batch_size", "16",
         "--data.init_args.num_val", "32", "--data.init_args.num_test", "32"]  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_filesystems():
    """s3fs keeps one filesystem per set of arguments, with the endpoint and credentials of the
    environment it was made in: each test gets those of its own environment (another server,
    refused credentials)."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()
    yield
    S3FileSystem.clear_instance_cache()


def read_csv(s3: S3Server, bucket: str, key: str) -> list[dict]:
    body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    return list(csv.DictReader(io.StringIO(body)))


class CrashAt(Callback):
    """An exception after optimizer step 7 of 8 (4 an epoch): a run that stops mid-epoch, with
    last.ckpt from step 6 (`--last_checkpoint.every_n_train_steps 3`)."""

    step = 7

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            self.stop()

    def stop(self) -> None:
        raise RuntimeError(f"crashed at step {self.step}")


class KillAt(CrashAt):
    """SIGKILL of its own process instead: no hook of Lightning's runs after it."""

    def stop(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


STOPPED = [*SMALL, "--last_checkpoint.every_n_train_steps", "3"]


def resume_and_compare(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    """After a run under s3://bucket/runs stopped at step 7 with last.ckpt from step 6: the
    objects it wrote; `fit --ckpt_path last` continues it from that last.ckpt, in the same run
    folder, and ends with the weights of a run never stopped (written locally); vit-eval and
    vit-train test read its best.ckpt by its URL."""
    runs = f"s3://{bucket}/runs"
    run = f"{runs}/tiny/version_0"
    keys = s3.keys(bucket)
    written = {"config.yaml", "hparams.yaml", "metrics.csv", "attention/epoch_000.png"}
    written |= {"checkpoints/best.ckpt", "checkpoints/last.ckpt"}
    assert {f"runs/tiny/version_0/{name}" for name in written} <= set(keys), keys
    assert not any(".tmp" in key for key in keys)  # objects are written whole, not renamed
    assert read_checkpoint(f"{run}/checkpoints/last.ckpt")["global_step"] == 6
    config = s3.client().get_object(Bucket=bucket, Key="runs/tiny/version_0/config.yaml")
    assert "preset: micro" in config["Body"].read().decode()

    resumed = cli.run(["fit", *tiny_args(runs, *STOPPED), "--ckpt_path", "last"])
    assert resumed.trainer.ckpt_path == f"{run}/checkpoints/last.ckpt"
    got = read_checkpoint(f"{run}/checkpoints/last.ckpt")
    assert got["global_step"] == 8
    assert not any(key.startswith("runs/tiny/version_1") for key in s3.keys(bucket))
    assert "runs/tiny/version_0/attention/image_0.png" in s3.keys(bucket)  # drawn at the end of fit
    rows = read_csv(s3, bucket, "runs/tiny/version_0/metrics.csv")
    assert [int(r["epoch"]) for r in rows if r.get("val/acc")][-1] == 1  # appended to in the bucket

    local = tmp_path / "never_stopped"
    cli.run(["fit", *tiny_args(local, *STOPPED)])
    reference = local / "tiny" / "version_0" / "checkpoints"
    expected = read_checkpoint(reference / "last.ckpt")
    assert expected["global_step"] == 8
    for name, weights in expected["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], weights, rtol=0, atol=1e-6, msg=name)

    best = f"{run}/checkpoints/best.ckpt"
    measured = evaluate(EvalOptions(ckpt=best), progress=False)
    assert measured["checkpoint"] == best and measured["num_images"] == 32
    on_disk = evaluate(EvalOptions(ckpt=str(reference / "best.ckpt")), progress=False)
    assert measured["top1"] == on_disk["top1"] and measured["nll"] == pytest.approx(on_disk["nll"], abs=1e-6)
    # another preset on the command line: the checkpoint's options rebuild the model
    tested = cli.run(["test", *tiny_args(runs, *SMALL), "--model.vit.preset", "mini", "--ckpt_path", best])
    assert tested.model.hparams.vit["preset"] == "micro"
    assert measured["top1"] == pytest.approx(tested.trainer.callback_metrics["test/acc"].item(), abs=1e-6)


@pytest.mark.slow
def test_a_run_in_a_bucket_stopped_mid_epoch_resumes_from_there_and_is_evaluated_from_there(
    s3, tmp_path, monkeypatch
):
    """The run stops with an exception, in this process (the test below kills one); nothing of it
    is written locally."""
    monkeypatch.chdir(tmp_path)
    bucket = s3.bucket()
    crash = "--trainer.callbacks+=test_object_store_runs.CrashAt"
    with pytest.raises(RuntimeError, match="crashed at step 7"):
        cli.run(["fit", *tiny_args(f"s3://{bucket}/runs", *STOPPED), crash])
    resume_and_compare(s3, bucket, tmp_path / "local")
    assert [p.name for p in tmp_path.iterdir()] == ["local"]  # no s3:/ folder


@pytest.mark.slow
def test_a_run_in_a_bucket_killed_mid_epoch_and_resumed_ends_with_the_weights_of_one_never_stopped(
    s3, tmp_path, monkeypatch
):
    """kill -9 of `python train.py fit` at step 7, as a user's run dies: the same as above."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    bucket = s3.bucket()
    kill = "--trainer.callbacks+=test_object_store_runs.KillAt"
    killed = run_train("fit", *tiny_args(f"s3://{bucket}/runs", *STOPPED), kill, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resume_and_compare(s3, bucket, tmp_path)


@pytest.mark.slow
def test_a_run_without_a_logger_lives_in_the_trainers_root_in_a_bucket(s3, tmp_path, monkeypatch):
    """--trainer.default_root_dir s3://... with no logger: config.yaml and checkpoints/ under that
    root; --ckpt_path last reads its checkpoints/last.ckpt (Lightning's own search for it drops
    the s3:// of the URL and finds nothing)."""
    monkeypatch.chdir(tmp_path)
    bucket = s3.bucket()
    root = f"s3://{bucket}/root"
    args = [*tiny_args(tmp_path / "unused", *SMALL, "--trainer.max_epochs", "1"), "--trainer.logger", "false",
            "--trainer.default_root_dir", root]  # fmt: skip
    cli.run(["fit", *args])
    assert {"root/config.yaml", "root/checkpoints/best.ckpt", "root/checkpoints/last.ckpt"} <= set(
        s3.keys(bucket)
    )
    validated = cli.run(["validate", *args, "--ckpt_path", "last"])
    assert validated.trainer.ckpt_path == f"{root}/checkpoints/last.ckpt"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "where, extra, message",
    [
        ("no bucket", [], "there is no bucket"),
        ("empty prefix", ["--ckpt_path", "last"], "--ckpt_path last: no checkpoint matches s3://"),
        ("empty prefix", ["--trainer.logger.init_args.version", "0", "--ckpt_path", "last"],
         "--ckpt_path last: there is no s3://"),
        ("no bucket", ["--ckpt_path", "s3://{bucket}/runs/tiny/version_0/checkpoints/last.ckpt"],
         "there is no bucket"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_a_bad_bucket_or_prefix_is_one_line_and_writes_nothing(
    s3, tmp_path, monkeypatch, capsys, where, extra, message
):
    """Checked before anything is built: Lightning would create a missing bucket (s3fs's makedirs)
    and train into it, and start a fresh run where --ckpt_path last finds no checkpoint."""
    monkeypatch.chdir(tmp_path)
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}" if where == "no bucket" else s3.bucket()
    extra = [e.format(bucket=bucket) for e in extra]
    code, error = command_error(cli.main, ["fit", *tiny_args(f"s3://{bucket}/runs", *SMALL), *extra], capsys)
    assert code == 1 and message in error, error
    if where == "no bucket":
        assert bucket not in [b["Name"] for b in s3.client().list_buckets()["Buckets"]]
    else:
        assert s3.keys(bucket) == []
    assert list(tmp_path.iterdir()) == []


def test_an_object_store_without_its_package_is_one_line(tmp_path, monkeypatch, capsys):
    """Without s3fs: one line that says what to install, before anything is built."""
    from fsspec.registry import _registry  # the classes fsspec has imported

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs fails
    monkeypatch.delitem(_registry, "s3", raising=False)
    code, error = command_error(cli.main, ["fit", *tiny_args("s3://bucket/runs", *SMALL)], capsys)
    assert code == 2 and "Install s3fs to access S3" in error and ".[stream]" in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_refused_credentials_are_one_line_before_anything_runs(refusing_s3, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bucket = refusing_s3.bucket()
    code, error = command_error(cli.main, ["fit", *tiny_args(f"s3://{bucket}/runs", *SMALL)], capsys)
    assert code == 1 and f"s3://{bucket}/runs: {refusing_s3.url} refused access" in error, error
    assert "AWS_ACCESS_KEY_ID" in error
    code, error = command_error(vit_eval.main, ["--ckpt", f"s3://{bucket}/best.ckpt"], capsys)
    assert code == 1 and f"s3://{bucket}/best.ckpt: {refusing_s3.url} refused access" in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["missing", "text", "code"])
def test_vit_eval_reads_checkpoints_in_a_bucket_as_safely_as_files(s3, tmp_path, capsys, kind):
    """A missing object, one that is no checkpoint, one whose unpickling would run code: one line
    naming its URL, and none of its code runs."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/runs/{kind}.ckpt"
    marker = tmp_path / "marker"
    if kind == "text":
        s3.client().put_object(Bucket=bucket, Key=f"runs/{kind}.ckpt", Body=b"not a checkpoint")
    elif kind == "code":
        evil = io.BytesIO()
        torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": UnsafePayload(marker)}, evil)
        s3.client().put_object(Bucket=bucket, Key=f"runs/{kind}.ckpt", Body=evil.getvalue())
    code, error = command_error(vit_eval.main, ["--ckpt", url], capsys)
    expected = {
        "missing": f"checkpoint not found: {url}",
        "text": f"{url} is not a readable checkpoint",
        "code": f"refusing {url}: it is not a plain-tensor checkpoint",
    }
    assert code == 1 and expected[kind] in error, error
    assert not marker.exists()


@pytest.mark.slow
def test_a_profile_of_a_run_in_a_bucket_is_written_there(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bucket = s3.bucket()
    data = TwoCircles(num_train=32, num_val=16, num_test=16, batch_size=16)
    vit = ViTConfig(preset="micro", patch_size=8)
    model = ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=vit)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, logger=CSVLogger(f"s3://{bucket}/runs", name="run"),
        callbacks=[Profile(start=1, steps=1, trace=True)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, data)
    assert {"runs/run/version_0/profile.txt", "runs/run/version_0/profile.json"} <= set(s3.keys(bucket))
    assert list(tmp_path.iterdir()) == []


class ArtifactRecorder(MLFlowLogger):
    """An MLflow logger without MLflow: what `log_artifact` gives it, read at once (MLflow copies
    a local file)."""

    def __init__(self):
        self.logged = []

    @property
    def experiment(self):
        return self

    @property
    def run_id(self) -> str:
        return "run"

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self.logged.append((Path(local_path).name, Path(local_path).read_bytes(), artifact_path))


def test_mlflow_gets_a_local_copy_of_a_file_in_a_bucket(s3):
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="runs/attention/epoch_000.png", Body=b"picture")
    recorder = ArtifactRecorder()
    picture = f"s3://{bucket}/runs/attention/epoch_000.png"
    log_artifact(SimpleNamespace(loggers=[recorder]), picture, "attention")
    assert recorder.logged == [("epoch_000.png", b"picture", "attention")]
