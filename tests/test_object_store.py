"""Chunks in an object store: `vit-chunks --out s3://...` uploads them, `StreamingImages` streams
them (vit-train, vit-eval), every request through `vit.storage`, and what goes wrong there (no
bucket, refused credentials, no chunks, a server that goes away mid-epoch) is one line that writes
nothing. The server is moto's, on 127.0.0.1 (lab/s3server.py); the endpoint and keys reach every
client through the environment."""

import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers import command_error, make_folders, tiny_args
from s3_fixtures import fault_line

pytest.importorskip("litdata")

import vit.chunk_writer  # noqa: E402
from vit import storage  # noqa: E402
from vit.chunk_reader import chunks_dataset, read_manifest, reading  # noqa: E402
from vit.chunk_writer import SPLITS, upload, write_chunks  # noqa: E402
from vit.commands import chunks, eval, train  # noqa: E402
from vit.errors import DataError, DataNotFoundError, StoreError  # noqa: E402
from vit.streaming import StreamingImages  # noqa: E402

FIT = ["--data", "vit.streaming.StreamingImages", "--data.image_size", "16", "--data.batch_size", "8"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """litdata's cache of the chunks it downloads, in the test's folder, not ~/.lightning/chunks
    (litdata reads $LITDATA_CACHE_DIR when it is imported: here it is, already; 0.2.50 reads none)."""
    import litdata.utilities.dataset_utilities as utilities

    monkeypatch.setattr(utilities, "_LITDATA_CACHE_DIR", None, raising=False)
    monkeypatch.setattr(utilities, "_DEFAULT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def streamed(folder: str) -> list[tuple[bytes, int]]:
    """Every item of a split's chunks, as litdata streams them: (file bytes, label), sorted. (A
    slice: litdata reads an item alone, `dataset[i]`, from a store by ranges, and gets nothing.)"""
    dataset = chunks_dataset(folder)
    return sorted((bytes(item["image"]), int(item["label"])) for item in dataset[: len(dataset)])


def files_under(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


@contextmanager
def other_clients_refused(monkeypatch):
    """boto3's clients and obstore's S3 stores, which litdata reaches a store with by itself (and
    the tests' own look with, `S3Server.client`), made to fail in the block: what still works
    goes through `vit.storage`."""
    import boto3
    import obstore.store

    def refused(*args, **kwargs):
        raise AssertionError("a request outside vit.storage")

    with monkeypatch.context() as patch:
        patch.setattr(boto3, "client", refused)
        patch.setattr(boto3.Session, "client", refused)
        patch.setattr(obstore.store, "S3Store", refused)
        yield


@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
@pytest.mark.slow
def test_chunks_written_to_s3_stream_the_items_of_chunks_on_a_disk(s3, tmp_path, monkeypatch, capsys, cache):
    """The same objects as the files of a local write, uploaded with vit.json last, out of a
    temporary folder that is then removed; a neighbouring prefix (photos-old/) is no obstacle.
    Every request, writing and reading, goes through `vit.storage`: litdata's own clients fail."""
    root = make_folders(tmp_path / "data", per_class={"train": 4, "val": 1, "test": 2})
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="photos-old/vit.json", Body=b"{}")
    uploaded, paths, put = [], [], storage.upload

    def recorded(path, url):
        uploaded.append(url)
        paths.append(path)
        put(path, url)

    monkeypatch.setattr(storage, "upload", recorded)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    on_disk = write_chunks(root, tmp_path / "chunks", chunk_bytes=256)
    with other_clients_refused(monkeypatch):
        in_s3 = write_chunks(root, f"s3://{bucket}/photos/", chunk_bytes=256)  # several chunks a split
        assert in_s3 == on_disk == read_manifest(f"s3://{bucket}/photos")
    assert f"images into s3://{bucket}/photos in " in capsys.readouterr().out
    files = files_under(tmp_path / "chunks")
    assert len([f for f in files if f.startswith("train/chunk-")]) > 1
    assert s3.keys(bucket) == sorted(["photos-old/vit.json", *(f"photos/{f}" for f in files)])
    assert sorted(uploaded) == [f"s3://{bucket}/photos/{f}" for f in files]
    assert uploaded[-1] == f"s3://{bucket}/photos/vit.json"
    assert all(path.relative_to(tmp_path / "tmp").parts[0].startswith("vit-chunks-") for path in paths)
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary folder is gone
    with other_clients_refused(monkeypatch):
        for split in SPLITS:
            assert streamed(f"s3://{bucket}/photos/{split}") == streamed(str(tmp_path / "chunks" / split))
    assert any(cache.rglob("chunk-*.bin"))  # downloaded into litdata's cache

    remote = StreamingImages(f"s3://{bucket}/photos/", image_size=8, batch_size=4, num_workers=2)
    local = StreamingImages(str(tmp_path / "chunks"), image_size=8, batch_size=4)
    assert remote.root == f"s3://{bucket}/photos" and remote.folder("val") == f"s3://{bucket}/photos/val"
    assert remote.classes == local.classes == ["ant", "bee", "cat"]

    def pairs(split):
        images, labels = split[: len(split)]
        return sorted(zip(labels.tolist(), images.flatten(1).tolist(), strict=True))

    with other_clients_refused(monkeypatch):
        test = remote.split("test")
        assert pairs(test) == pairs(local.split("test")) and len(test) == 6
        images, labels = test[3]
        assert images.shape == (3, 8, 8) and labels.ndim == 0
        batches = list(remote.train_dataloader())  # read by two workers
    assert [len(labels) for _, labels in batches] == [4, 4, 4]
    assert sorted(torch.cat([labels for _, labels in batches]).tolist()) == [0] * 4 + [1] * 4 + [2] * 4


def test_an_upload_that_fails_deletes_what_it_uploaded(s3, tmp_path, monkeypatch, capsys):
    """A failure on the third object: the two before it are deleted, and the error goes on. Where
    the store refuses the deletion too, a warning says how many objects are left (none of them
    vit.json, so no reader takes them for chunks)."""
    folder = tmp_path / "chunks"
    for name in ("vit.json", "train/index.json", "train/chunk-0-0.bin", "val/index.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    bucket = s3.bucket()
    url, put, calls = f"s3://{bucket}/photos", storage.upload, []

    def fail_third(path, to):
        calls.append(to.removeprefix(f"{url}/"))
        if len(calls) == 3:
            raise StoreError("connection reset")
        put(path, to)

    monkeypatch.setattr(storage, "upload", fail_third)
    with pytest.raises(StoreError, match="^connection reset$"):
        upload(folder, url)
    assert calls == ["train/chunk-0-0.bin", "train/index.json", "val/index.json"] and s3.keys(bucket) == []
    assert capsys.readouterr().out == ""
    calls.clear()

    def refuse(urls):
        raise StoreError(f"{urls[0]}: gone")

    monkeypatch.setattr(storage, "remove", refuse)
    with pytest.raises(StoreError, match="^connection reset$"):
        upload(folder, url)
    assert s3.keys(bucket) == ["photos/train/chunk-0-0.bin", "photos/train/index.json"]
    assert (
        capsys.readouterr().out == f"warning: could not delete the 2 objects uploaded to {url}; delete them\n"
    )
    monkeypatch.setattr(storage, "upload", put)
    upload(folder, url)
    assert s3.keys(bucket) == [f"photos/{name}" for name in files_under(folder)]


@pytest.mark.parametrize(
    "out, message, status",
    [
        (
            "s3://{missing}/photos",
            "s3://{missing}/photos: there is no bucket '{missing}' at http://127.0.0.1:",
            1,
        ),
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
    monkeypatch.setattr(vit.chunk_writer, "readable", lambda *args: decoded.append(args))
    names = {"bucket": bucket, "missing": f"missing-{bucket}"}
    found, error = command_error(chunks.main, ["--root", root, "--out", out.format(**names)], capsys)
    assert found == status and message.format(**names) in error, error
    assert decoded == [] and s3.keys(bucket) == ["old/vit.json"]
    assert f"missing-{bucket}" not in [b["Name"] for b in s3.client().list_buckets()["Buckets"]]


@pytest.mark.slow
def test_refused_credentials_are_one_line_and_write_nothing(s3, tmp_path, capsys):
    root = make_folders(tmp_path / "data", per_class={"train": 2})
    bucket = s3.bucket()
    write_chunks(root, f"s3://{bucket}/photos")
    written = s3.keys(bucket)
    s3.refuse_keys()
    try:
        found, error = command_error(chunks.main, ["--root", root, "--out", f"s3://{bucket}/more"], capsys)
        assert found == 1 and error.startswith(f"error: s3://{bucket}/more: {s3.url} refused access ("), error
        assert error.endswith(
            "come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )
        with pytest.raises(StoreError, match=f"^s3://{bucket}/photos: .* refused access \\(403: Forbidden"):
            StreamingImages(f"s3://{bucket}/photos")
    finally:
        s3.refuse_keys(False)
    assert s3.keys(bucket) == written and "photos/vit.json" in written


@pytest.mark.slow
def test_vit_train_on_a_prefix_without_chunks_or_a_missing_bucket_is_one_line(s3, runs, capsys):
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="half/train/index.json", Body=b"{}")  # an upload under way
    for root, message in (
        (
            f"s3://{bucket}/half",
            f"chunks s3://{bucket}/half: no vit.json: not written by vit-chunks, or not yet",
        ),
        (
            f"s3://missing-{bucket}/photos",
            f"s3://missing-{bucket}/photos: there is no bucket 'missing-{bucket}'",
        ),
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


@pytest.mark.slow  # runs stopped by a store that fails: seconds each, out of the fast subset
@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
@pytest.mark.parametrize("fault, workers", [("gone", 0), ("gone", 2), ("refused", 0)])
def test_a_store_gone_or_refusing_mid_epoch_stops_the_run_with_one_line_and_keeps_the_last_checkpoint(
    own_s3_server, tmp_path, runs, capfd, fault, workers
):
    """One image a chunk, 87 training chunks: litdata downloads up to 32 chunks ahead of each
    reader, so the server killed (or refusing the keys) after step 2 leaves chunks of the first
    epoch undownloaded, in this process or in each of two workers. The run stops with one line
    naming a chunk within seconds, and last.ckpt, written on the disk after step 2 (and every 2
    steps after), loads."""
    from vit.checkpoint import read_checkpoint

    root = make_folders(tmp_path / "data", per_class={"train": 32})  # 96 images, 9 held out for val
    bucket = own_s3_server.bucket()
    write_chunks(root, f"s3://{bucket}/photos", chunk_bytes=100)
    stop = {
        "class_path": "s3_fixtures.StoreFault",
        "init_args": {"url": own_s3_server.url, "fault": fault, "at": 2},
    }
    args = [*FIT, "--data.root", f"s3://{bucket}/photos", "--data.batch_size", "4",
            "--data.num_workers", str(workers),
            "--last_checkpoint.every_n_train_steps", "2", f"--trainer.callbacks={json.dumps([stop])}",
            "--trainer.num_sanity_val_steps", "0", "--trainer.limit_val_batches", "0"]  # fmt: skip
    capfd.readouterr()
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        train.main(["fit", *tiny_args(runs, *args)])
    assert time.monotonic() - started < 60
    error = fault_line(exit_info.value.code, capfd.readouterr(), f"s3://{bucket}/photos/train/chunk-")
    said = (
        f"cannot reach {own_s3_server.url} (" if fault == "gone" else f"{own_s3_server.url} refused access ("
    )
    assert said in error, error
    checkpoint = read_checkpoint(runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt")
    assert checkpoint["epoch"] == 0 and 2 <= checkpoint["global_step"] < 87 // 4  # in the first epoch


def test_a_url_names_a_bucket_and_every_client_gives_up_soon(s3, tmp_path):
    """vit.storage's client settings reach every S3 filesystem of the process, Lightning's too;
    litdata reads s3:// through vit.storage."""
    import fsspec
    from litdata.streaming.downloader import get_downloader

    from vit.chunk_download import Downloader
    from vit.chunk_writer import store_url

    assert store_url("s3://bucket/a/b/") == "s3://bucket/a/b" and store_url("s3://bucket") == "s3://bucket"
    storage.filesystem("s3://bucket")
    lightnings = fsspec.filesystem("s3")  # made as Lightning makes its own: no options
    assert lightnings.config_kwargs == storage.CLIENT  # not a minute to connect, and five tries
    assert lightnings.s3.meta.endpoint_url == s3.url  # from the environment
    bucket = s3.bucket()
    write_chunks(make_folders(tmp_path / "data", per_class={"train": 2}), f"s3://{bucket}/c")
    chunks_dataset(f"s3://{bucket}/c/train")
    assert isinstance(get_downloader(f"s3://{bucket}/c/train", str(tmp_path), []), Downloader)


def client_error(code: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"the {code}\nmessage"}}, "GetObject")


@pytest.mark.parametrize(
    "raised, kind, message",
    [
        *(
            (
                code,
                StoreError,
                "^s3://b/p: {url} refused access \\("
                + code
                + ": the "
                + code
                + " message\\); the credentials "
                "come from the environment \\(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or AWS_PROFILE\\)$",
            )
            for code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
                "InvalidToken",
                "ExpiredToken",
            )
        ),
        ("NoSuchBucket", DataNotFoundError, "^s3://b/p: there is no bucket 'b' at {url}$"),
        ("NoSuchKey", DataNotFoundError, "^s3://b/p: not found at {url}$"),
        ("SlowDown", StoreError, "^s3://b/p: SlowDown: the SlowDown message \\({url}\\)$"),
        (
            "EndpointConnectionError",
            StoreError,
            '^s3://b/p: cannot reach {url} \\(EndpointConnectionError: Could not connect to the endpoint URL: "http://x/b"\\)$',
        ),
        (
            "NoCredentialsError",
            StoreError,
            "^s3://b/p: no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "\\(or AWS_PROFILE\\)",
        ),
    ],
)
def test_what_the_store_answers_is_one_line_naming_the_url_and_the_endpoint(s3, raised, kind, message):
    """botocore's errors, and the OSErrors s3fs makes of them (FileNotFoundError, PermissionError)."""
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError
    from s3fs.errors import translate_boto_error

    errors = {
        "EndpointConnectionError": EndpointConnectionError(endpoint_url="http://x/b"),
        "NoCredentialsError": NoCredentialsError(),
    }
    error = errors.get(raised) or client_error(raised)
    for as_raised in (error, translate_boto_error(error)):
        with pytest.raises(kind, match=message.format(url=s3.url)), storage.errors("s3://b/p"):
            raise as_raised


def test_an_error_reading_chunks_from_a_store_is_one_line_from_a_worker_or_not():
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
    ours = StoreError(  # torch raises a worker's error again as its type, with the traceback
        "Caught StoreError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    g()\n'
        "vit.errors.StoreError: s3://b/p/train/chunk-0-1.bin: cannot reach x\n"
    )
    with pytest.raises(StoreError, match="^s3://b/p/train/chunk-0-1.bin: cannot reach x$"):
        with reading("s3://b/p/train"):
            raise ours
    with pytest.raises(StoreError, match="^s3://b/p/train/chunk-0-1.bin: gone$"):  # ours: as raised
        with reading("s3://b/p/train"):
            raise StoreError("s3://b/p/train/chunk-0-1.bin: gone")
    with pytest.raises(
        DataError, match="^reading the chunks of s3://b/p/train: OSError: Caught nothing\\. lost$"
    ):
        with reading("s3://b/p/train"):
            raise OSError("Caught nothing.\nlost")
    with pytest.raises(RuntimeError) as raised:  # chunks on a disk: as raised
        with reading("/data/chunks/train"):
            raise worker
    assert raised.value is worker
