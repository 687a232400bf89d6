"""Runs in an object store: vit-train writing its config.yaml, metrics.csv, attention pictures and
checkpoints under s3://bucket/prefix, resuming from the last.ckpt there, and vit-eval reading a
checkpoint from there; bad buckets, refused credentials and missing checkpoints as one line that
writes nothing. Against moto's S3 server on 127.0.0.1 (tests/s3server.py), with its address and
credentials in the environment, as a user's come."""

from __future__ import annotations

import io

import pytest
import torch
from helpers import UnsafePayload, command_error

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
