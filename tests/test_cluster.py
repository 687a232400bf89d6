"""vit-train on several machines, started as a cluster starts it: one `torchrun` a node, all
started together, meeting at 127.0.0.1 (gloo on the CPU), each running `train.py fit ...
--trainer.num_nodes N --trainer.devices G`. Each node runs in a folder of its own, as each
machine of a cluster without a shared disk has its own disk: every node reads the data at the same
(absolute) path, and writes its runs where it runs (relative `runs/`). docs/cluster.md says how to
run it; these are the commands it shows. How litdata deals the chunks to the processes of two
nodes is checked in this process, where litdata reads the world from the environment."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, command_error, noise_folders
from seen import digest

from vit.commands.train import main

# A micro ViT on 64 two-circles images in batches of 8: with 2 processes, 4 steps each an epoch.
TWO_CIRCLES = [
    "--seed_everything", "0",
    "--data", "vit.two_circles.TwoCircles",
    "--data.init_args.num_train", "64",
    "--data.init_args.num_val", "16",
    "--data.init_args.num_test", "16",
    "--data.init_args.batch_size", "8",
]  # fmt: skip
TINY = [
    "--model.vit.preset", "micro",
    "--model.vit.patch_size", "8",
    "--trainer.max_epochs", "2",
    "--trainer.accelerator", "cpu",
    "--trainer.strategy", "ddp",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--trainer.logger.init_args.name", "cluster",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(
    nodes: int, devices: int, args: list[str], folders: list[Path], timeout: float = 300
) -> list[tuple[str, bool]]:
    """`train.py fit ARGS` on `nodes` nodes of `devices` processes each, node r in `folders[r]`:
    one torchrun a node, all started together (the command of docs/cluster.md), told the number
    of nodes and devices. Each node's output, and whether its torchrun succeeded; nodes still
    running after `timeout` seconds are killed, and fail."""
    port = free_port()
    tests = [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(tests)  # seen.SeenImages
    logs = [folder.parent / f"{folder.name}.log" for folder in folders]
    launched = []
    deadline = time.monotonic() + timeout
    try:
        for rank, (folder, log) in enumerate(zip(folders, logs, strict=True)):
            folder.mkdir(parents=True, exist_ok=True)
            command = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(nodes), "--node_rank", str(rank), "--nproc_per_node", str(devices),
                "--master_addr", "127.0.0.1", "--master_port", str(port),
                str(ROOT / "train.py"), "fit", *args,
                "--trainer.num_nodes", str(nodes), "--trainer.devices", str(devices),
            ]  # fmt: skip
            with open(log, "w") as out:
                output = dict(stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                launched.append(subprocess.Popen(command, cwd=folder, env=env, **output))
        for process in launched:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in launched:
            if process.poll() is None:
                stop(process)
    return [(log.read_text(), process.returncode == 0) for log, process in zip(logs, launched, strict=True)]


def stop(torchrun: subprocess.Popen) -> None:
    """Kill a torchrun and the processes it started, which it starts in sessions of their own: they
    would outlive it, waiting on each other."""
    workers = []
    for children in Path(f"/proc/{torchrun.pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            workers += [int(pid) for pid in children.read_text().split()]
    for pid in (torchrun.pid, *workers):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    torchrun.wait()


def ran(results) -> None:
    for rank, (log, ok) in enumerate(results):
        assert ok, f"node {rank}:\n{log[-3000:]}"


def seen(folder: Path, ranks: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(ranks)]


def epochs(batches: list[list[str]], per_epoch: int) -> list[set[str]]:
    """The images of each epoch, from one process's batches."""
    starts = range(0, len(batches), per_epoch)
    return [{d for batch in batches[i : i + per_epoch] for d in batch} for i in starts]


def weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Path:
    """The two-circles run on two nodes of one process each, with a profile of two steps:
    `node0/`, `node1/` (where each ran) and `seen/` (the images each process trained on)."""
    root = tmp_path_factory.mktemp("two_nodes")
    (root / "seen").mkdir()
    record = ["--trainer.callbacks+=seen.SeenImages", "--trainer.callbacks.folder", str(root / "seen")]
    profile = ["--trainer.callbacks+=vit.callbacks.Profile", "--trainer.callbacks.start", "1",
               "--trainer.callbacks.steps", "2"]  # fmt: skip
    ran(cluster(2, 1, [*TWO_CIRCLES, *TINY, *record, *profile], [root / "node0", root / "node1"]))
    return root


@pytest.mark.slow
def test_two_nodes_see_disjoint_images_that_together_make_the_epoch(two_nodes):
    """Lightning reads the node's rank from torchrun (GROUP_RANK) and gives each process its share
    of each epoch's shuffled images (a distributed sampler over the world's 2 processes): 32 each,
    in 4 batches of 8, no image seen by both, none left out, shares drawn anew each epoch."""
    from vit.two_circles import TwoCircles

    ranks = seen(two_nodes / "seen", 2)
    assert [(r["node"], r["local_rank"]) for r in ranks] == [(0, 0), (1, 0)]
    assert [[len(batch) for batch in r["batches"]] for r in ranks] == [[8] * 8] * 2  # 2 epochs of 4
    train = TwoCircles(num_train=64, num_val=16, num_test=16, batch_size=8).split("train")[:][0]
    every = {digest(image) for image in train}
    assert len(every) == 64
    first, second = (epochs(r["batches"], 4) for r in ranks)
    for epoch in (0, 1):
        assert len(first[epoch]) == len(second[epoch]) == 32
        assert not first[epoch] & second[epoch] and first[epoch] | second[epoch] == every
    assert first[0] != first[1]


@pytest.mark.slow
def test_two_nodes_train_the_weights_one_node_of_two_processes_trains(two_nodes, tmp_path):
    """The same command on one node of two processes (`--nnodes 1 --nproc_per_node 2`,
    `--trainer.devices 2 --trainer.num_nodes 1`): each global rank sees the same batches as on two
    nodes, and the weights after the 8 steps are the same, to the bit."""
    record = ["--trainer.callbacks+=seen.SeenImages", "--trainer.callbacks.folder", str(tmp_path)]
    ran(cluster(1, 2, [*TWO_CIRCLES, *TINY, *record], [tmp_path / "node0"]))
    one = seen(tmp_path, 2)
    assert [(r["node"], r["local_rank"]) for r in one] == [(0, 0), (0, 1)]
    assert [r["batches"] for r in one] == [r["batches"] for r in seen(two_nodes / "seen", 2)]
    nodes = weights(two_nodes / "node0" / "runs" / "cluster" / "version_0")
    processes = weights(tmp_path / "node0" / "runs" / "cluster" / "version_0")
    assert nodes["global_step"] == processes["global_step"] == 8
    assert nodes["state_dict"].keys() == processes["state_dict"].keys()
    for name, value in nodes["state_dict"].items():
        assert torch.equal(value, processes["state_dict"][name]), name


@pytest.mark.slow
def test_the_first_node_writes_the_run_and_the_others_write_nothing(two_nodes):
    """Checkpoints, config, metrics and the profile are written by global rank 0 alone, into one
    run folder (`version_0`, numbered on node 0); node 1, on its own disk, has no runs/ at all."""
    run = two_nodes / "node0" / "runs" / "cluster"
    assert [p.name for p in run.iterdir()] == ["version_0"]
    files = {str(p.relative_to(run / "version_0")) for p in (run / "version_0").rglob("*") if p.is_file()}
    checkpoints = {"checkpoints/best.ckpt", "checkpoints/last.ckpt"}
    assert files == {"config.yaml", "hparams.yaml", "metrics.csv", "profile.txt", *checkpoints}
    assert list((two_nodes / "node1").iterdir()) == []


@pytest.mark.slow
def test_resuming_where_a_node_cannot_read_the_checkpoint_stops_every_node(two_nodes, tmp_path):
    """`--ckpt_path last` with the run on node 0's disk alone: node 1 finds no checkpoint and would
    start again from step 0 beside node 0 at step 8 (Lightning says so on rank 0 only, which did
    find it). Every node stops instead, before a step, with one line naming what each read."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(two_nodes / "node0", node0)
    results = cluster(2, 1, [*TWO_CIRCLES, *TINY, "--trainer.max_epochs", "3", "--ckpt_path", "last"],
                      [node0, node1], timeout=120)  # fmt: skip
    last = r"\S*/runs/cluster/version_0/checkpoints/last.ckpt"
    said = rf"error: the processes read different checkpoints \(rank 0: {last}; rank 1: none\)"
    for log, ok in results:
        assert not ok and re.search(said, log), log[-3000:]
    assert weights(node0 / "runs" / "cluster" / "version_0")["global_step"] == 8  # nothing trained
    assert list(node1.iterdir()) == []


def test_each_epoch_of_the_chunks_is_dealt_across_the_processes_of_all_nodes(tmp_path, monkeypatch):
    """The training loaders of 2 processes on 2 nodes, as litdata sees them (WORLD_SIZE,
    GLOBAL_RANK, NNODES: what it reads where no process group is set up), over 3 epochs of 48
    images in chunks of 7 to 9: each epoch, 24 images a process, none seen by both, none left out.
    Counting two nodes, litdata keeps each node from the second epoch on to the chunks it was dealt
    in the first, where a chunk split between the nodes goes to both: images seen twice, others
    never, and shares of different lengths (the processes would wait on each other)."""
    pytest.importorskip("litdata")
    from vit.chunk_writer import write_chunks
    from vit.streaming import StreamingImages

    write_chunks(noise_folders(tmp_path / "data"), tmp_path / "chunks", chunk_bytes=9000)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("NNODES", "2")
    loaders = []
    for rank in (0, 1):
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        data = StreamingImages(str(tmp_path / "chunks"), image_size=16, batch_size=4)
        loaders.append(data.train_dataloader())
    for epoch in range(3):
        first, second = ([digest(image) for images, _ in loader for image in images] for loader in loaders)
        assert len(first) == len(second) == 24, epoch
        assert not set(first) & set(second) and len(set(first) | set(second)) == 48, epoch


def test_nodes_times_devices_must_be_the_processes_torchrun_started(tmp_path, monkeypatch, capsys):
    """A process torchrun started (its environment) told a world of 4 processes, and a command line
    that says 2 nodes of 1 device: one line naming both, before anything is written."""
    torchrun = {"TORCHELASTIC_RUN_ID": "test", "WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0",
                "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    args = ["fit", *TWO_CIRCLES, *TINY, "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    status, error = command_error(main, args, capsys)
    assert status == 1
    assert "`devices=1` and `num_nodes=2`" in error and "world size (4)" in error
    assert list(tmp_path.iterdir()) == []
