"""A store that fails in the middle of the work is one line, wherever it fails, and loses nothing:
the server stopped (the store gone: connections refused) or refusing the keys, while vit-chunks
uploads, while vit-train writes a checkpoint or its logs, while it resumes, while vit-eval or
vit-attention read a checkpoint. Each ends with exit status 1, one line `error: URL: ...` naming the
object or the run and the endpoint, no traceback; what was written before is whole, and read once
the store is back. (Chunks read in the middle of an epoch: test_object_store.py.) Against moto's
server in this process (lab/s3server.py's RestartableS3Server), which comes back with its objects."""

from __future__ import annotations

import json

import pytest
from helpers import make_folders, tiny_args
from s3_fixtures import fault_line

from vit import storage
from vit.checkpoint import AtomicCheckpointIO, read_checkpoint
from vit.chunk_reader import read_manifest
from vit.commands import attention, chunks, train
from vit.commands import eval as vit_eval
from vit.commands.eval import EvalOptions, evaluate
from vit.errors import DataNotFoundError

# 64 training images in batches of 16: 4 steps an epoch, checkpoints after each; none of the
# config's callbacks (the attention pictures take longer than the training)
SMALL = ["--data.init_args.num_train", "64", "--data.init_args.batch_size", "16",
         "--data.init_args.num_val", "32", "--data.init_args.num_test", "32",
         "--trainer.callbacks=[]"]  # fmt: skip
FAULTS = ["gone", "refused"]
# gone: each request a failing command makes waits out the client's 3 tries (seconds)
SLOW_FAULTS = [pytest.param("gone", marks=pytest.mark.slow), "refused"]


def exit_status(main, args: list) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


def fault(server, kind: str, when: str = "step", at: int = 0) -> str:
    """--trainer.callbacks=[a `StoreFault` of `server`]."""
    init = {"url": server.url, "fault": kind, "when": when, "at": at}
    return f"--trainer.callbacks={json.dumps([{'class_path': 's3_fixtures.StoreFault', 'init_args': init}])}"


def break_store(server, kind: str) -> None:
    if kind == "gone":
        server.stop()
    else:
        server.refuse_keys()


def mend_store(server, kind: str) -> None:
    if kind == "gone":
        server.start()
    else:
        server.refuse_keys(False)


def reason(server, kind: str) -> str:
    """What the one line says of the endpoint."""
    return f"cannot reach {server.url} (" if kind == "gone" else f"{server.url} refused access ("


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAULTS)
def test_a_checkpoint_write_or_a_resume_that_meets_a_store_fault_is_one_line_and_loses_nothing(
    restartable_s3, tmp_path, monkeypatch, capsys, kind
):
    """The store fails as epoch 1's first checkpoint is written: one line naming it, and epoch
    0's last.ckpt and best.ckpt load once the store is back (an object is one PUT). Resuming from
    there meets the store failing before anything is built, then as Lightning loads last.ckpt
    (after vit-train's checks, the config.yaml and the model): one line each; once the store is
    back, the run resumes and finishes."""
    monkeypatch.chdir(tmp_path)
    server, bucket = restartable_s3, restartable_s3.bucket()
    runs, run = f"s3://{bucket}/runs", f"s3://{bucket}/runs/tiny/version_0"
    status = exit_status(train.main, ["fit", *tiny_args(runs, *SMALL), fault(server, kind, "checkpoint", 1)])
    assert reason(server, kind) in fault_line(status, capsys.readouterr(), f"{run}/checkpoints/")
    mend_store(server, kind)
    last = read_checkpoint(f"{run}/checkpoints/last.ckpt")
    assert (last["epoch"], last["global_step"]) == (0, 4)
    assert read_checkpoint(f"{run}/checkpoints/best.ckpt")["global_step"] == 4

    resume = ["fit", *tiny_args(runs, *SMALL), "--ckpt_path", "last"]
    break_store(server, kind)
    status = exit_status(train.main, resume)
    assert reason(server, kind) in fault_line(status, capsys.readouterr(), runs)
    mend_store(server, kind)
    load = AtomicCheckpointIO.load_checkpoint

    def load_from_a_failing_store(*args, **kwargs):
        break_store(server, kind)
        return load(*args, **kwargs)

    with monkeypatch.context() as patch:  # after the checks, the config.yaml, the model
        patch.setattr(AtomicCheckpointIO, "load_checkpoint", load_from_a_failing_store)
        status = exit_status(train.main, resume)
    assert reason(server, kind) in fault_line(status, capsys.readouterr(), f"{run}/checkpoints/last.ckpt")
    mend_store(server, kind)
    if kind == "gone":
        train.run(resume)
        assert read_checkpoint(f"{run}/checkpoints/last.ckpt")["global_step"] == 8
    assert list(tmp_path.iterdir()) == []  # nothing written locally


@pytest.mark.parametrize("kind", SLOW_FAULTS)
def test_a_log_write_that_meets_a_store_fault_is_one_line_and_the_log_written_before_is_whole(
    restartable_s3, capsys, kind
):
    """The store fails after step 3 of 4 in the first epoch: the next request is the CSV logger's
    (Lightning's, through fsspec itself), writing the rows of step 4 into metrics.csv; it holds
    step 2's, whole, once the store is back."""
    server, bucket = restartable_s3, restartable_s3.bucket()
    run = f"s3://{bucket}/runs/tiny/version_0"
    args = tiny_args(f"s3://{bucket}/runs", *SMALL, "--trainer.log_every_n_steps", "2")
    status = exit_status(train.main, ["fit", *args, fault(server, kind, "step", 3)])
    assert reason(server, kind) in fault_line(status, capsys.readouterr(), run)
    mend_store(server, kind)
    rows = storage.read_bytes(f"{run}/metrics.csv").decode().splitlines()
    assert rows[0].startswith("epoch,") and [row.split(",")[1] for row in rows[1:]] == ["1"], rows  # step 2's
    assert storage.is_file(f"{run}/config.yaml")


@pytest.mark.parametrize("kind", SLOW_FAULTS)
def test_vit_eval_and_vit_attention_reading_a_checkpoint_from_a_failing_store_are_one_line(
    restartable_s3, trained_checkpoint, tmp_path, capsys, kind
):
    server, bucket = restartable_s3, restartable_s3.bucket()
    url = f"s3://{bucket}/runs/best.ckpt"
    storage.upload(trained_checkpoint, url)
    break_store(server, kind)
    for main, args in ((vit_eval.main, []), (attention.main, ["--out", tmp_path / "maps"])):
        status = exit_status(main, ["--ckpt", url, *args])
        assert reason(server, kind) in fault_line(status, capsys.readouterr(), url)
    mend_store(server, kind)
    assert evaluate(EvalOptions(ckpt=url), progress=False)["checkpoint"] == url
    assert not (tmp_path / "maps").exists()


@pytest.mark.parametrize("kind", SLOW_FAULTS)
def test_an_upload_of_chunks_that_meets_a_store_fault_is_one_line_and_leaves_no_chunks(
    restartable_s3, tmp_path, monkeypatch, capsys, kind
):
    """The store fails before the third object: one line naming it; the deletion of the two
    uploaded fails too, and a warning counts them; without vit.json, nothing takes them for
    chunks once the store is back."""
    server, bucket = restartable_s3, restartable_s3.bucket()
    root = make_folders(tmp_path / "data", per_class={"train": 2})
    put, calls = storage.upload, []

    def upload(path, url):
        calls.append(url)
        if len(calls) == 3:
            break_store(server, kind)
        put(path, url)

    monkeypatch.setattr(storage, "upload", upload)
    status = exit_status(chunks.main, ["--root", root, "--out", f"s3://{bucket}/photos"])
    captured = capsys.readouterr()
    assert reason(server, kind) in fault_line(status, captured, calls[2])
    warning = f"warning: could not delete the 2 objects uploaded to s3://{bucket}/photos; delete them\n"
    assert captured.out == warning
    mend_store(server, kind)
    assert len(server.keys(bucket)) == 2 and "photos/vit.json" not in server.keys(bucket)
    with pytest.raises(DataNotFoundError, match="no vit.json: not written by vit-chunks, or not yet"):
        read_manifest(f"s3://{bucket}/photos")
