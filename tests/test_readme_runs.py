"""Every README line that trains runs, at toy size, on the config it names: the vit-train lines
of its code blocks (a block's lines in order, in one folder, as a reader types them), the commands
of `make demo`, and the options its prose gives to add to a training command. tests/test_docs.py
checks that every command line parses; parsing misses what fails only once the run is built (a
callback the config has, given again) or trains. Each runs in a folder of its own where the
README's relative paths (configs/, photos, cifar10-jpeg, data/cifar10) are there (`workspace`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import ROOT, make_folders, run_in_process, write_idx
from test_docs import README, code_blocks

README_TEXT = README.read_text()

# Toy size: two steps, each epoch cut to two batches so that one validation (and best.ckpt) comes
# before the end, one batch of validation and of test.
TOY = [
    "--trainer.max_steps", "2", "--trainer.limit_train_batches", "2",
    "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip
# A few images of each data module, read from the workspace
TOY_DATA = {
    "vit.two_circles.TwoCircles": ["--data.init_args.num_train", "64", "--data.init_args.num_val", "16",
                                   "--data.init_args.num_test", "16", "--data.init_args.batch_size", "16"],
    "vit.datamodules.CIFAR10": ["--data.init_args.val_size", "8", "--data.init_args.batch_size", "8"],
    "vit.datamodules.ImageFolders": ["--data.init_args.batch_size", "4"],
    "vit.datamodules.FashionMNIST": ["--data.init_args.root", "fashion-mnist",
                                     "--data.init_args.val_size", "8", "--data.init_args.batch_size", "8"],
    "vit.streaming.StreamingImages": ["--data.init_args.batch_size", "4"],
}  # fmt: skip
# What else a config changes at toy size: the GPU recipe keeps one of its 7 blocks, and is not
# compiled (a minute on a CPU; test_gpu_recipe.py::test_compile_takes_a_mode compiles it), nor is
# the CPU recipe (25 s; test_cli.py::test_compile_trains_and_keeps_eager_checkpoints compiles); the
# fine-tuning config starts from a timm ViT-Ti in a weights file of the workspace, not a ViT-S
# downloaded, and reads the workspace's photos (the README's folder is /data/flowers).
TOY_CONFIG = {
    "configs/cifar10_gpu.yaml": ["--model.compile", "false", "--model.vit.depth", "1"],
    "configs/cifar10_cpu.yaml": ["--model.compile", "false"],
    "configs/finetune_folder.yaml": [
        "--model.pretrained", "timm:vit_tiny_patch16_224", "--model.weights", "vit_tiny.safetensors",
        "--data.init_args.root", "photos", "--data.init_args.image_size", "32",
    ],
}  # fmt: skip


def option_value(words: list[str], option: str) -> str | None:
    """The value the last `option VALUE` of `words` gives, or None."""
    values = [words[i + 1] for i, word in enumerate(words[:-1]) if word == option]
    return values[-1] if values else None


def data_class(words: list[str]) -> str:
    """The data module a vit-train line trains on: its --data, else its config's."""
    if (given := option_value(words, "--data")) is not None:
        return given
    config = yaml.safe_load((ROOT / option_value(words, "--config")).read_text())
    return config["data"]["class_path"]


def toy(words: list[str]) -> list[str]:
    """A vit-train line at toy size: `TOY`, its data module's and its config's toy arguments, after
    its own (the later value of an option wins). A resumed fit trains two more steps."""
    extra = [*TOY, *TOY_DATA[data_class(words)], *TOY_CONFIG.get(option_value(words, "--config"), [])]
    if words[1] == "fit" and "--ckpt_path" in words:
        extra += ["--trainer.max_steps", "4"]
    return [*words, *extra]


def run(words: list[str], cwd: Path) -> str:
    """A README command line run in `cwd` (in this process: `run_in_process`), vit-train's at toy
    size; its output, after checking that it succeeded."""
    words = toy(words) if words[0] == "vit-train" else words
    result = run_in_process(words, cwd=cwd, capture_output=True, text=True)
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"{shlex.join(words)}:\n{output[-3000:]}"
    return output


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The data the README's lines read, made once: photos (image folders of 3 classes, train and
    test), CIFAR-10 as image folders in data/cifar10 (where the configs look) and cifar10-jpeg,
    and Fashion-MNIST's files in fashion-mnist."""
    from lab.cifar10_pack import fake_cifar10

    root = tmp_path_factory.mktemp("data")
    make_folders(root / "photos")
    for folder in ("data/cifar10", "cifar10-jpeg"):
        fake_cifar10(root / folder, per_class=4)
    for prefix, n in (("train", 40), ("t10k", 8)):
        pictures = np.arange(n * 28 * 28).reshape(n, 28, 28) % 251
        write_idx(root / "fashion-mnist" / f"{prefix}-images-idx3-ubyte.gz", pictures)
        write_idx(root / "fashion-mnist" / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


@pytest.fixture
def workspace(tmp_path: Path, data: Path) -> Path:
    """A folder of its own where the README's relative paths are there: configs/ (this
    checkout's) and the `data`; the runs go into its runs/."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for path in data.iterdir():
        (tmp_path / path.name).symlink_to(path)
    return tmp_path


@pytest.fixture
def vit_tiny(workspace: Path) -> Path:
    """timm's ViT-Ti (randomly initialised) as a weights file in the workspace, where a user puts
    downloaded weights for `--model.weights`."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    save_file(timm.create_model("vit_tiny_patch16_224").state_dict(), workspace / "vit_tiny.safetensors")
    return workspace


def last_checkpoint(run_folder: Path) -> dict:
    return torch.load(run_folder / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")


# ---- the code blocks ----


def training_blocks() -> list[list[list[str]]]:
    """The vit-train lines (not --help) of each bash code block that has one, continuation lines
    joined, comments dropped."""
    blocks = []
    for block in code_blocks(README_TEXT, "bash"):
        lines = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
        lines = [w for w in lines if w[:1] == ["vit-train"] and "--help" not in w]
        if lines:
            blocks.append(lines)
    return blocks


BLOCKS = training_blocks()


def test_the_readme_has_training_blocks_to_run():
    configs = {option_value(words, "--config") for block in BLOCKS for words in block}
    assert configs >= {f"configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}
    assert any(words[1] == "test" for block in BLOCKS for words in block)


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[" | ".join(shlex.join(w[2:4]) for w in b) for b in BLOCKS])
def test_every_training_line_of_a_code_block_runs(block, workspace, vit_tiny):
    """A block's vit-train lines, in order in one folder: a resumed run (--ckpt_path last)
    continues the run before it, a test reads the checkpoint a fit before it wrote."""
    for words in block:
        run(words, workspace)
        if words[1] == "fit" and option_value(words, "--ckpt_path") == "last":
            runs = sorted((workspace / "runs").glob("*/version_*"), key=lambda p: p.stat().st_mtime)
            assert last_checkpoint(runs[-1])["global_step"] == 4  # two steps more than the run it resumed


# ---- make demo ----


def demo_commands() -> list[list[str]]:
    """The commands of `make demo`, its Makefile variables replaced ($(BIN)/vit-train -> vit-train)."""
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) :?= (.*)$", makefile, re.M))
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1).replace("\\\n", " ")
    recipe = recipe.replace("$(BIN)/", "").replace("$(DEMO)", variables["DEMO"])
    return [shlex.split(part) for part in recipe.split(";") if part.strip().startswith("vit-")]


@pytest.mark.slow
def test_make_demo_trains_evaluates_and_draws(workspace):
    commands = demo_commands()
    assert [words[0] for words in commands] == ["vit-train", "vit-eval", "vit-attention"]
    for words in commands:
        run(words, workspace)
    demo = workspace / "runs" / "demo"
    assert (demo / "train" / "checkpoints" / "best.ckpt").is_file()
    assert (demo / "eval" / "metrics.json").is_file() and (demo / "attention" / "rollout.png").is_file()


# ---- the options of the prose ----

# A backticked span of the prose (not of a code block) that adds to a training command: an option
# of the trainer, model, data, checkpoint or resumption, or a whole vit-train or torchrun line.
TRAINING = re.compile(
    r"--(trainer|model|data|last_checkpoint)[.+]|--ckpt_path |--model [A-Z]|--data vit\.|vit-train |torchrun "
)


def prose_options(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)}
    return sorted(span for span in spans if TRAINING.match(span))


DEMO = ["vit-train", "fit", "--config", "configs/two_circles.yaml"]
CIFAR10 = ["vit-train", "fit", "--config", "configs/cifar10_cpu.yaml"]
OWN_IMAGES = ["vit-train", "fit", "--data", "vit.datamodules.ImageFolders", "--model.vit.preset", "micro",
              "--model.vit.patch_size", "8"]  # fmt: skip
# The README's "Watch it learn" option, on the demo's config, which has that callback already
WATCH = "--trainer.callbacks+=vit.interpret.watching.AttentionMaps"


@dataclass
class Run:
    """A toy run of some of the README's options: `options` maps each to what is added for it to
    `command` (None: the option as written; a value where the README gives a placeholder, such as
    N, or none), after `before` (a command of the README that makes what the run reads)."""

    command: list[str]
    options: dict[str, str | None]
    before: str | None = None

    def words(self) -> list[str]:
        added = [shlex.split(option if given is None else given) for option, given in self.options.items()]
        return [*self.command, *(word for words in added for word in words)]


# The prose's options, each in a run at toy size; those that go together share one. Added to the
# demo's command unless the README gives them for other data (augmentation: the in-memory image
# data sets, here CIFAR-10's config); the other values the README lists run too
# (`--data.policy none|trivial|randaugment`, `--model.arch bag`, `resnet`, `airbench`).
# `--trainer.logger ... MLFlowLogger` needs the tracking store of docs/watching.md's commands.
PROSE_RUNS = {
    "the demo trained otherwise": Run(DEMO, {
        "--model.vit.depth 4": None,
        "--last_checkpoint.every_n_train_steps N": "--last_checkpoint.every_n_train_steps 1",
        "--trainer.max_time 00:00:30:00": None,
        "--trainer.precision bf16-mixed": None,
        "--model.decay linear": None,
        "--trainer.callbacks+=vit.callbacks.EMA --trainer.callbacks.decay 0.998": None,
        "--data.seed": "--data.seed 1",
    }),
    "CIFAR-10 augmented otherwise": Run(CIFAR10, {
        "--data.crop_padding": "--data.crop_padding 2",
        "--data.crop_padding_mode reflect": None,
        "--data.flip": "--data.flip true",
        "--data.policy none|trivial|randaugment": "--data.policy trivial",
        "--data.mixup_alpha": "--data.mixup_alpha 0.2",
        "--data.cutmix_alpha": "--data.cutmix_alpha 0.2",
    }),
    "CIFAR-10 with RandAugment, no attention": Run(CIFAR10, {
        "--data.policy none|trivial|randaugment": "--data.policy randaugment",
        "--model.vit.depth 0": None,
    }),
    **{f"a CNN, {arch}": Run(DEMO, {
        "--model CNNClassifier": None, "--model.arch bag": f"--model.arch {arch}",
    })
       for arch in ("bag", "resnet", "airbench")},
    "TensorBoard": Run(DEMO, {"--trainer.logger TensorBoardLogger": None}),
    "own images": Run(OWN_IMAGES, {
        "--data.root": "--data.root damaged",
        "--data.image_size": "--data.image_size 16",
        "--data.resize center_crop": None,
        "--data.channels 1": None,
        "--data.classes": "--data.classes [ant,bee,cat]",
        "--data.val_size": "--data.val_size 3",
        "--data.on_bad_file skip": None,
    }),
    "Fashion-MNIST padded": Run(["vit-train", "fit", "--config", "configs/fashion_mnist.yaml"], {
        "--data.image_size 32": None,
    }),
    "streamed": Run(OWN_IMAGES[:2] + OWN_IMAGES[4:], {
        "--data vit.streaming.StreamingImages": None,
        "--data.root": "--data.root photos-chunks",
    }, before="vit-chunks --root photos --out photos-chunks"),
    "fine-tuned": Run(OWN_IMAGES, {
        "vit-train fit --model.pretrained SOURCE [--model.weights FILE]": "--data.root photos "
            "--model.pretrained timm:vit_tiny_patch16_224 --model.weights vit_tiny.safetensors",
        "--model.layer_decay 0.75": None,
    }),
}  # fmt: skip
# Options run by other tests: a README code block here, or a test of their own where a toy run
# costs more than a few seconds (compilation, processes).
ELSEWHERE = {
    "--ckpt_path last": "test_readme_runs.py::test_every_training_line_of_a_code_block_runs",
    "--ckpt_path PATH": "test_compat.py::test_vit_train_resumes_an_old_checkpoint",
    "--model.compile true": "test_cli.py::test_compile_trains_and_keeps_eager_checkpoints",
    "--model.capture_step true":
        "test_captured_step.py::test_inductor_compiles_the_step_that_trains_as_the_eager_step",
    "--trainer.devices 4 --trainer.strategy ddp": "test_cli.py::test_learns_two_circles_alone_and_with_ddp",
    "torchrun --nnodes N --node_rank R ... --no-python vit-train fit ... --trainer.num_nodes N":
        "test_cluster.py::test_two_nodes_train_the_weights_one_node_of_two_processes_trains",
    "vit-train fit --data mydm.Pets":
        "test_own_datamodule.py::test_vit_train_records_the_class_path_the_flag_takes",
}  # fmt: skip


def test_every_training_option_of_the_prose_runs_somewhere():
    """Each option the prose gives is in a toy run here or names the test that runs it (where its
    options appear); a new one fails here until it is given a run."""
    options = prose_options(README_TEXT)
    assert "--trainer.callbacks+=vit.interpret.watching.AttentionMaps" in options and len(options) > 30
    here = {option for run in PROSE_RUNS.values() for option in run.options} | {WATCH}
    assert sorted(set(options) - here - set(ELSEWHERE)) == []
    assert sorted((here | set(ELSEWHERE)) - set(options)) == []  # none that the README lost
    for option, test in ELSEWHERE.items():
        file, name = test.split("::")
        source = (ROOT / "tests" / file).read_text()
        assert f"def {name}(" in source, test
        names = {word.split("+=")[0].split(".")[-1] for word in option.split() if TRAINING.match(f"{word} ")}
        assert names and all(name in source for name in names), (option, test)


@pytest.mark.slow
@pytest.mark.parametrize("name", PROSE_RUNS)
def test_every_training_option_of_the_prose_runs(name, workspace, vit_tiny):
    spec = PROSE_RUNS[name]
    if "--data.on_bad_file skip" in spec.options:  # a folder with an image that does not decode
        make_folders(workspace / "damaged")
        (workspace / "damaged" / "train" / "ant" / "bad.png").write_bytes(b"not an image")
    if "TensorBoardLogger" in shlex.join(spec.words()):
        pytest.importorskip("tensorboard")
    if spec.before is not None:
        run(shlex.split(spec.before), workspace)
    run(spec.words(), workspace)


def test_watch_it_learn_on_the_demo_config(workspace):
    """The option as the README gives it, added to the demo's command: one AttentionMaps (the
    config's), drawing before training and after the validation, where Lightning alone refuses
    the second with a traceback."""
    assert f"`{WATCH}` (on in the demo)" in README_TEXT
    run([*DEMO, WATCH], workspace)
    run_folder = workspace / "runs" / "two_circles" / "version_0"
    saved = yaml.safe_load((run_folder / "config.yaml").read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in saved].count("vit.interpret.watching.AttentionMaps") == 1
    drawn = sorted(p.name for p in (run_folder / "attention").glob("epoch_*.png"))
    assert drawn == ["epoch_000.png", "epoch_000_step_000000.png"]
