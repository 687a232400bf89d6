"""Runs in an object store: vit-train writing its config.yaml, metrics.csv, attention pictures and
checkpoints under s3://bucket/prefix, resuming from the last.ckpt there, and vit-eval reading a
checkpoint from there; bad buckets, refused credentials and missing checkpoints as one line that
writes nothing. Against moto's S3 server on 127.0.0.1 (tests/s3server.py), with its address and
credentials in the environment, as a user's come."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import UnsafePayload, command_error
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger

from vit import TwoCircles, ViTClassifier, ViTConfig
from vit.callbacks import Profile, log_artifact
from vit.commands import eval as vit_eval


@pytest.fixture(autouse=True)
def fresh_filesystems():
    """s3fs keeps one filesystem per set of arguments, with the endpoint and credentials of the
    environment it was made in: each test gets those of its own environment (another server,
    refused credentials)."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()
    yield
    S3FileSystem.clear_instance_cache()


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
