"""Chunks in an object store: `vit-chunks --out s3://...` uploads them, `StreamingImages` streams
them (vit-train, vit-eval), and what goes wrong there (no bucket, refused credentials, no chunks, a
server that goes away mid-epoch) is one line that writes nothing. The server is moto's, on
127.0.0.1 (lab/s3server.py); the endpoint and keys reach every client through the environment."""

import json
import os
import signal
import tempfile
import time
import urllib.request
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import command_error, make_folders, tiny_args

pytest.importorskip("litdata")

import vit.streaming  # noqa: E402
from vit.commands import chunks, eval, train  # noqa: E402
from vit.errors import DataError  # noqa: E402
from vit.streaming import SPLITS, Store, StreamingImages, chunks_dataset, read_manifest, write_chunks  # noqa: E402

FIT = ["--data", "vit.streaming.StreamingImages", "--data.image_size", "16", "--data.batch_size", "8"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """litdata's cache of the chunks it downloads, in the test's folder, not ~/.lightning/chunks
    (litdata reads $LITDATA_CACHE_DIR when it is imported: here it is, already)."""
    import litdata.utilities.dataset_utilities as utilities

    monkeypatch.setattr(utilities, "_LITDATA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def streamed(folder: str) -> list[tuple[bytes, int]]:
    """Every item of a split's chunks, as litdata streams them: (file bytes, label), sorted. (A
    slice: litdata reads an item alone, `dataset[i]`, from a store by ranges, and gets nothing.)"""
    dataset = chunks_dataset(folder)
    return sorted((bytes(item["image"]), int(item["label"])) for item in dataset[: len(dataset)])


def files_under(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
@pytest.mark.slow
def test_chunks_written_to_s3_stream_the_items_of_chunks_on_a_disk(s3, tmp_path, monkeypatch, capsys, cache):
    """The same objects as the files of a local write, uploaded with vit.json last, out of a
    temporary folder that is then removed; a neighbouring prefix (photos-old/) is no obstacle."""
    root = make_folders(tmp_path / "data", per_class={"train": 4, "val": 1, "test": 2})
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="photos-old/vit.json", Body=b"{}")
    uploaded, paths, put = [], [], Store.put

    def recorded(self, path, name):
        uploaded.append(name)
        paths.append(path)
        put(self, path, name)

    monkeypatch.setattr(Store, "put", recorded)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    on_disk = write_chunks(root, tmp_path / "chunks", chunk_bytes=256)
    in_s3 = write_chunks(root, f"s3://{bucket}/photos/", chunk_bytes=256)  # several chunks a split
    assert in_s3 == on_disk == read_manifest(f"s3://{bucket}/photos")
    assert f"images into s3://{bucket}/photos in " in capsys.readouterr().out
    files = files_under(tmp_path / "chunks")
    assert len([f for f in files if f.startswith("train/chunk-")]) > 1
    assert s3.keys(bucket) == sorted(["photos-old/vit.json", *(f"photos/{f}" for f in files)])
    assert sorted(uploaded) == files and uploaded[-1] == "vit.json"
    assert all(path.relative_to(tmp_path / "tmp").parts[0].startswith("vit-chunks-") for path in paths)
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary folder is gone
    for split in SPLITS:
        assert streamed(f"s3://{bucket}/photos/{split}") == streamed(str(tmp_path / "chunks" / split))
    assert any(cache.rglob("chunk-*.bin"))  # downloaded into litdata's cache

    remote, local = (
        StreamingImages(where, image_size=8, batch_size=4)
        for where in (f"s3://{bucket}/photos/", str(tmp_path / "chunks"))
    )
    assert remote.root == f"s3://{bucket}/photos" and remote.folder("val") == f"s3://{bucket}/photos/val"
    assert remote.classes == local.classes == ["ant", "bee", "cat"]

    def pairs(split):
        images, labels = split[: len(split)]
        return sorted(zip(labels.tolist(), images.flatten(1).tolist(), strict=True))

    test = remote.split("test")
    assert pairs(test) == pairs(local.split("test")) and len(test) == 6
    images, labels = test[3]
    assert images.shape == (3, 8, 8) and labels.ndim == 0
    batches = list(remote.train_dataloader())
    assert [len(labels) for _, labels in batches] == [4, 4, 4]
    assert sorted(torch.cat([labels for _, labels in batches]).tolist()) == [0] * 4 + [1] * 4 + [2] * 4


def test_an_upload_that_fails_deletes_what_it_uploaded(s3, tmp_path, monkeypatch, capsys):
    """A failure on the third object: the two before it are deleted, and the error goes on. Where
    the store refuses the deletions too, a warning says how many objects are left (none of them
    vit.json, so no reader takes them for chunks)."""
    folder = tmp_path / "chunks"
    for name in ("vit.json", "train/index.json", "train/chunk-0-0.bin", "val/index.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    bucket = s3.bucket()
    store, put, calls = Store(f"s3://{bucket}/photos"), Store.put, []

    def fail_third(self, path, name):
        calls.append(name)
        if len(calls) == 3:
            raise DataError("connection reset")
        put(self, path, name)

    monkeypatch.setattr(Store, "put", fail_third)
    with pytest.raises(DataError, match="^connection reset$"):
        store.upload(folder)
    assert calls == ["train/chunk-0-0.bin", "train/index.json", "val/index.json"] and s3.keys(bucket) == []
    assert capsys.readouterr().out == ""
    calls.clear()
    deleted, delete = [], store.client.delete_object

    def refuse_second(**kwargs):
        deleted.append(kwargs["Key"])
        if len(deleted) == 2:
            raise ConnectionError("gone")
        return delete(**kwargs)

    monkeypatch.setattr(store.client, "delete_object", refuse_second)
    with pytest.raises(DataError, match="^connection reset$"):
        store.upload(folder)
    assert deleted == ["photos/train/chunk-0-0.bin", "photos/train/index.json"]  # stops at the first refusal
    assert s3.keys(bucket) == ["photos/train/index.json"]
    assert (
        capsys.readouterr().out
        == f"warning: could not delete 1 objects uploaded to s3://{bucket}/photos; delete them\n"
    )
    monkeypatch.setattr(Store, "put", put)
    store.upload(folder)
    assert s3.keys(bucket) == [f"photos/{name}" for name in files_under(folder)]


@pytest.mark.parametrize(
    "out, message, status",
    [
        ("s3://{missing}/photos", "s3://{missing}/photos: no bucket '{missing}' at http://127.0.0.1:", 1),
        ("s3://{bucket}/old/", "s3://{bucket}/old already holds objects; delete them, or write", 2),
        ("s3://{bucket}", "s3://{bucket} already holds objects", 2),  # the whole bucket
        (
            "gs://{bucket}/photos",
            "gs://{bucket}/photos: only s3:// object stores are supported, not gs://",
            2,
        ),
        ("s3:///photos", "s3:///photos names no bucket (s3://bucket/prefix)", 2),
    ],
)
def test_a_bad_destination_is_one_line_before_any_image_is_decoded(
    s3, tmp_path, monkeypatch, capsys, out, message, status
):
    root = make_folders(tmp_path / "data", per_class={"train": 2})
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="old/vit.json", Body=b"{}")
    decoded = []
    monkeypatch.setattr(vit.streaming, "readable", lambda *args: decoded.append(args))
    names = {"bucket": bucket, "missing": f"missing-{bucket}"}
    found, error = command_error(chunks.main, ["--root", root, "--out", out.format(**names)], capsys)
    assert found == status and message.format(**names) in error, error
    assert decoded == [] and s3.keys(bucket) == ["old/vit.json"]
    assert f"missing-{bucket}" not in [b["Name"] for b in s3.client().list_buckets()["Buckets"]]


def set_auth(server, on: bool) -> None:
    """moto's IAM checks on or off: on, it accepts no key it has not issued (ours: "testing")."""
    request = urllib.request.Request(
        f"{server.url}/moto-api/reset-auth",
        data=b"0" if on else b"inf",  # how many requests to let through first
        headers={"Content-Type": "text/plain"},  # else moto reads the body as a form, and fails
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()


@pytest.mark.slow
def test_refused_credentials_are_one_line_and_write_nothing(own_s3_server, tmp_path, capsys):
    root = make_folders(tmp_path / "data", per_class={"train": 2})
    bucket = own_s3_server.bucket()
    write_chunks(root, f"s3://{bucket}/photos")
    written = own_s3_server.keys(bucket)
    set_auth(own_s3_server, on=True)
    try:
        found, error = command_error(chunks.main, ["--root", root, "--out", f"s3://{bucket}/more"], capsys)
        assert found == 1 and error.startswith(
            f"error: s3://{bucket}/more: {own_s3_server.url} refused the credentials (InvalidAccessKeyId: "
        ), error
        assert error.endswith("they are read from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
        with pytest.raises(
            DataError, match=f"^s3://{bucket}/photos: .* refused the credentials \\(InvalidAccessKeyId"
        ):
            StreamingImages(f"s3://{bucket}/photos")
    finally:
        set_auth(own_s3_server, on=False)
    assert own_s3_server.keys(bucket) == written and "photos/vit.json" in written


@pytest.mark.slow
def test_vit_train_on_a_prefix_without_chunks_or_a_missing_bucket_is_one_line(s3, runs, capsys):
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="half/train/index.json", Body=b"{}")  # an upload under way
    for root, message in (
        (
            f"s3://{bucket}/half",
            f"chunks s3://{bucket}/half: no vit.json: not written by vit-chunks, or not yet",
        ),
        (f"s3://missing-{bucket}/photos", f"s3://missing-{bucket}/photos: no bucket 'missing-{bucket}'"),
    ):
        found, error = command_error(train.main, ["fit", *tiny_args(runs, *FIT, "--data.root", root)], capsys)
        assert found == 1 and message in error, error
    assert not runs.exists() and s3.keys(bucket) == ["half/train/index.json"]
    s3.client().put_object(Bucket=bucket, Key="vit.json", Body=b"{not json")
    with pytest.raises(ValueError, match=f"^s3://{bucket}/vit.json is not JSON \\(Expecting property name"):
        read_manifest(f"s3://{bucket}/")


@pytest.mark.slow
def test_vit_train_fits_on_chunks_in_s3_and_vit_eval_reads_them(s3, tmp_path, runs):
    """The whole bucket holds the chunks (no prefix); the checkpoint names the URL, from which
    vit-eval streams the test split."""
    root = make_folders(tmp_path / "data", per_class={"train": 8, "test": 2})
    bucket = s3.bucket()
    write_chunks(root, f"s3://{bucket}")
    assert "vit.json" in s3.keys(bucket)
    train.main(["fit", *tiny_args(runs, *FIT, "--data.root", f"s3://{bucket}", "--trainer.max_epochs", "1")])
    ckpt = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True)["datamodule_hyper_parameters"]["root"] == f"s3://{bucket}"
    eval.main(["--ckpt", ckpt, "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_images"] == 6 and metrics["data_module"] == "StreamingImages"


class StopServer(L.Callback):
    """Kills the process `pid` (the S3 server) after training step `step`: to the run, a server
    that went away mid-epoch."""

    def __init__(self, pid: int, step: int):
        self.pid, self.step = pid, step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(self.pid, signal.SIGKILL)


@pytest.mark.slow  # two runs stopped by a dead server: seconds each, out of the fast subset
@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_gone_mid_epoch_stops_the_run_with_one_line_and_keeps_the_last_checkpoint(
    own_s3_server, tmp_path, runs, capfd, workers
):
    """One image a chunk, 87 training chunks: litdata downloads up to 32 chunks ahead of each
    reader, so the server killed after step 2 leaves chunks of the first epoch undownloaded, in
    this process or in each of two workers. The run stops with one line within seconds, and
    last.ckpt, written on the disk after step 2 (and every 2 steps after), loads."""
    from vit.checkpoint import read_checkpoint

    root = make_folders(tmp_path / "data", per_class={"train": 32})  # 96 images, 9 held out for val
    bucket = own_s3_server.bucket()
    write_chunks(root, f"s3://{bucket}/photos", chunk_bytes=100)
    stop = {
        "class_path": "test_object_store.StopServer",
        "init_args": {"pid": own_s3_server.process.pid, "step": 2},
    }
    args = [
        *FIT,
        "--data.root",
        f"s3://{bucket}/photos",
        "--data.batch_size",
        "4",
        "--data.num_workers",
        str(workers),
    ]
    args += ["--last_checkpoint.every_n_train_steps", "2", f"--trainer.callbacks+={json.dumps(stop)}"]
    args += ["--trainer.num_sanity_val_steps", "0", "--trainer.limit_val_batches", "0"]
    started = time.monotonic()
    found, error = command_error(train.main, ["fit", *tiny_args(runs, *args)], capfd)
    assert time.monotonic() - started < 60
    assert found == 1 and error.startswith(f"error: reading the chunks of s3://{bucket}/photos/train: "), (
        error
    )
    assert "Could not connect to the endpoint URL" in error
    assert own_s3_server.process.poll() is not None  # killed, by the callback
    checkpoint = read_checkpoint(runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt")
    assert checkpoint["epoch"] == 0 and 2 <= checkpoint["global_step"] < 87 // 4  # in the first epoch


def test_a_url_names_a_bucket_and_a_prefix_and_the_clients_give_up_soon(s3, tmp_path):
    store, whole = Store("s3://bucket/a/b/"), Store("s3://bucket")
    assert (store.url, store.bucket, store.prefix) == ("s3://bucket/a/b", "bucket", "a/b")
    assert store.key("vit.json") == "a/b/vit.json" and store.key("") == "a/b/"
    assert (whole.url, whole.prefix, whole.key("vit.json"), whole.key("")) == (
        "s3://bucket",
        "",
        "vit.json",
        "",
    )
    config = store.client.meta.config  # not litdata's 1000 tries: a dead server is an error within seconds
    assert (config.connect_timeout, config.read_timeout) == (5, 30)
    assert config.retries == {"total_max_attempts": 3, "mode": "standard"}
    assert store.client.meta.endpoint_url == s3.url  # from the environment
    bucket = s3.bucket()
    write_chunks(make_folders(tmp_path / "data", per_class={"train": 2}), f"s3://{bucket}/c")
    dataset = chunks_dataset(f"s3://{bucket}/c/train")  # litdata's client: the same options
    assert dataset.storage_options["config"].retries == {"total_max_attempts": 3, "mode": "standard"}
    assert dataset.storage_options["config"].connect_timeout == 5


def client_error(code: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"the {code}\nmessage"}}, "GetObject")


@pytest.mark.parametrize(
    "raised, kind, message",
    [
        *(
            (
                code,
                DataError,
                "^s3://b/p: {url} refused the credentials \\(" + code + ": the " + code + " message\\); "
                "they are read from the environment \\(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY\\)$",
            )
            for code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
                "InvalidToken",
                "ExpiredToken",
            )
        ),
        ("NoSuchBucket", FileNotFoundError, "^s3://b/p: no bucket 'b' at {url}$"),
        ("SlowDown", DataError, "^s3://b/p: SlowDown: the SlowDown message$"),
        (
            "EndpointConnectionError",
            DataError,
            '^s3://b/p: Could not connect to the endpoint URL: "http://x/b"$',
        ),
        (
            "NoCredentialsError",
            DataError,
            "^s3://b/p: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \\(or AWS_PROFILE\\)",
        ),
    ],
)
def test_what_the_store_answers_is_one_line_naming_the_url(s3, raised, kind, message):
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    store = Store("s3://b/p/")
    errors = {
        "EndpointConnectionError": EndpointConnectionError(endpoint_url="http://x/b"),
        "NoCredentialsError": NoCredentialsError(),
    }
    error = errors.get(raised) or client_error(raised)
    with pytest.raises(kind, match=message.format(url=s3.url)):
        with store.errors():
            raise error


def test_an_error_reading_chunks_from_a_store_is_one_line_from_a_worker_or_not():
    from vit.streaming import reading

    worker = RuntimeError(
        "Caught RuntimeError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    g()\nRuntimeError: Chunk prefetch thread crashed: gone\n'
    )
    with pytest.raises(
        DataError,
        match="^reading the chunks of s3://b/p/train: RuntimeError: Chunk prefetch thread crashed: gone$",
    ):
        with reading("s3://b/p/train"):
            raise worker
    with pytest.raises(
        DataError, match="^reading the chunks of s3://b/p/train: OSError: Caught nothing\\. lost$"
    ):
        with reading("s3://b/p/train"):
            raise OSError("Caught nothing.\nlost")
    with pytest.raises(
        DataError, match="^reading the chunks of s3://b/p/train: OSError: no Traceback, no Caught$"
    ):
        with reading("s3://b/p/train"):
            raise OSError("no Traceback,\nno Caught")
    with pytest.raises(RuntimeError) as raised:  # chunks on a disk: as raised
        with reading("/data/chunks/train"):
            raise worker
    assert raised.value is worker
