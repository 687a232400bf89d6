"""What a user's terminal shows: help texts without accidents, a progress bar and a
model summary that say true things, and none of Lightning's advertisements or deprecations."""

import re
import warnings

import pytest
import torch
from helpers import tiny_args
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from vit import ViT, ViTConfig
from vit.callbacks import forward_flops
from vit.commands import attention, eval, export
from vit.commands import train as cli

MEMORY_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")


@pytest.mark.parametrize(
    "command",
    [attention.COMMAND.parser, eval.COMMAND.parser, eval.PREDICT.parser, export.COMMAND.parser],
)
def test_help_reads_as_written_for_a_user(command, capsys):
    text = command().format_help()
    assert not MEMORY_ADDRESS.search(text), text  # was: type: <function patch at 0x7fd09be91da0>
    description = text.split("\n\n")[1]
    assert description[0].isupper() and description.rstrip().endswith("."), description


def test_vit_train_help_says_what_it_trains_and_each_subcommand_in_full(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0
    assert "Lightning Trainer command line tool" not in out and "Train a ViT" in out
    for name, text in cli.SUBCOMMANDS.items():  # Lightning's were cut mid-sentence ("never run on your")
        assert re.search(rf"{name}\s+{re.escape(text[:40])}", out), (name, out)
    assert not MEMORY_ADDRESS.search(out)


def test_forward_flops_count_attention_on_the_fused_path():
    """Lightning's summary printed Total FLOPs: 0; the figure it shows now counts the fused
    attention kernel that torch's counter does not see, as the explicit path's matmuls."""
    config = ViTConfig(preset="micro", image_size=32, patch_size=8, in_channels=1, num_classes=4)
    fused, explicit = ViT(config), ViT(ViTConfig(**{**config.to_dict(), "fused_attn": False}))
    image = torch.zeros(1, 1, 32, 32)
    counted = forward_flops(fused, image)
    assert counted == forward_flops(explicit, image)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as lightnings:
        fused(image)  # how Lightning counts, given an input: the CPU's attention kernel unseen
    resolved = config.resolve()
    tokens, dim, depth = 16 + resolved.num_prefix_tokens, resolved.dim, resolved.depth
    attention = depth * 2 * (2 * tokens * tokens * dim)  # QK^T and AV, 2 FLOPs a multiply-add
    assert counted - lightnings.get_total_flops() == attention


def test_a_short_run_shows_the_epoch_the_budget_the_learning_rate_and_the_flops(runs, capfd):
    """`Epoch 0/-2` with max_epochs -1, `v_num: rain`, `train/lr: 0.000`, `Total FLOPs: 0`,
    Lightning's advertisement and a deprecation inside Lightning: all gone."""
    args = tiny_args(
        runs, "--trainer.enable_progress_bar", "true", "--trainer.enable_model_summary", "true",
        "--trainer.max_epochs", "-1", "--trainer.max_steps", "3", "--trainer.max_time", "00:00:10:00",
        "--trainer.logger.init_args.version", "train",
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.main(["fit", *args])
    out, err = capfd.readouterr()
    shown = out + err
    assert re.search(r"Epoch 0, (9\.\d|10\.0) min left", shown), shown
    assert "/-2" not in shown and "v_num" not in shown
    assert re.search(r"train/lr:\s+\d\.\d\de-0\d", shown), shown  # may wrap
    assert "💡" not in shown and "litlogger" not in shown and "stepping batches" not in shown
    assert not [w for w in caught if "LeafSpec" in str(w.message)]
    config = ViTConfig(preset="micro", image_size=32, patch_size=8, in_channels=1, num_classes=4)
    flops = get_human_readable_count(forward_flops(ViT(config), torch.zeros(1, 1, 32, 32)))
    assert f"Total FLOPs: {flops}" in shown and "Total FLOPs: 0" not in shown
    assert "one image's forward pass" in shown


def test_vit_attention_counts_in_words(trained_checkpoint, tmp_path, capsys):
    attention.main(
        ["--ckpt", trained_checkpoint, "--out", tmp_path, "--num_images", "1", "--method", "rollout"]
    )
    assert "wrote 1 PNG file into" in capsys.readouterr().out  # was: wrote 1 PNG files ... for 1 images
