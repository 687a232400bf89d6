"""What older versions of vit wrote, read as this version writes it: the one place for it.

New checkpoints carry `vit_format` and export folders' config.json `format_version`, both
`FORMAT_VERSION`; files without one are version 1, written before `ViTConfig`:

- ViTClassifier's hyper-parameters were flat (`preset`, `dim`, ... beside `lr`): now the
  architecture is one `vit` dict, `ViTConfig`'s fields;
- state-dict keys followed module positions (`to_patch_embedding.1`, `mlp.0`, `mlp.3`): now the
  layers are named (`patch_embed.proj`, `mlp.fc1`, `mlp.fc2`);
- data modules were recorded under the modules' old names (`vit.data`, `vit.images`);
- the learning-rate schedule was a SequentialLR (LinearLR then CosineAnnealingLR); now one LambdaLR
  of the same rates.

Within a version, an option that no longer exists is dropped from a checkpoint's data module
(`REMOVED_DATA_OPTIONS`): the image data modules' `policy_groups` (a policy drew one operation per
group of the batch; each image draws its own now).

Within a version too, a class that moved to another module keeps its old class path
(`MOVED_CLASSES`): vit-train reads every config value through `moved_class_paths` (a config
file, a run's saved config.yaml, a value on the command line), so a config naming it the old way
still loads.
"""

from __future__ import annotations

import re

from vit.config import ViTConfig

FORMAT_VERSION = 2
CHECKPOINT_KEY = "vit_format"

# What the data modules were called in version 1 (the alias modules vit.data and vit.images).
CLASS_PATHS = {
    "vit.data.TwoCircles": "vit.two_circles.TwoCircles",
    "vit.images.CIFAR10": "vit.datamodules.CIFAR10",
    "vit.images.ImageFolders": "vit.datamodules.ImageFolders",
    "vit.images.FashionMNIST": "vit.datamodules.FashionMNIST",
}

REMOVED_DATA_OPTIONS = ("policy_groups",)

# Old class path -> today's, within version 2. EvidenceMass left vit.callbacks for the interpret
# package, so that the core modules import nothing from vit.interpret; then the training callbacks
# of vit.interpret took a name of their own (vit.interpret.callbacks beside vit.callbacks read as
# one module twice).
MOVED_CLASSES = {
    "vit.callbacks.EvidenceMass": "vit.interpret.watching.EvidenceMass",
    "vit.interpret.callbacks.EvidenceMass": "vit.interpret.watching.EvidenceMass",
    "vit.interpret.callbacks.AttentionMaps": "vit.interpret.watching.AttentionMaps",
}

VIT_OPTIONS = {f for f in ViTConfig.__dataclass_fields__}
# The data facts stay ViTClassifier's own arguments too (vit-train links them from the data).
DATA_OPTIONS = ("num_classes", "image_size", "in_channels")


def state_dict(state: dict, prefix: str = "") -> dict:
    """Version-1 keys of a ViT's weights (under `prefix`, such as "model.") renamed to today's.
    The patch embedding was a Sequential whose positions moved with its options: its modules with
    weights are, in order, the projection alone or [norm_in, proj, norm_out]."""
    embed = re.compile(re.escape(prefix) + r"to_patch_embedding\.(\d+)\.(.+)")
    positions = sorted({int(m[1]) for key in state if (m := embed.fullmatch(key))})
    names = dict(
        zip(positions, ["proj"] if len(positions) == 1 else ["norm_in", "proj", "norm_out"], strict=False)
    )
    mlp = re.compile(r"(.*blocks\.\d+\.mlp\.)([03])\.(.+)")
    renamed = {}
    for key, value in state.items():
        if m := embed.fullmatch(key):
            key = f"{prefix}patch_embed.{names[int(m[1])]}.{m[2]}"
        elif m := mlp.fullmatch(key):
            key = f"{m[1]}{'fc1' if m[2] == '0' else 'fc2'}.{m[3]}"
        renamed[key] = value
    return renamed


def vit_options(flat: dict) -> dict:
    """Version-1 ViT options (ViTClassifier's flat hyper-parameters, or the ViT constructor's
    arguments that fine-tuning and vit-export recorded) as a `ViTConfig` dict."""
    return {k: v for k, v in flat.items() if k in VIT_OPTIONS}


def hyper_parameters(hparams: dict) -> dict:
    """Version-1 ViTClassifier hyper-parameters as today's: the ViT options moved into `vit`
    (the data facts kept beside it), a recorded `architecture` made a `ViTConfig` dict."""
    if "vit" in hparams or hparams.get("_class_path", "vit.ViTClassifier").endswith("CNNClassifier"):
        return hparams
    moved = {k for k in vit_options(hparams) if k not in DATA_OPTIONS}
    upgraded = {k: v for k, v in hparams.items() if k not in moved}
    upgraded["vit"] = ViTConfig.from_dict(vit_options(hparams)).to_dict()
    if upgraded.get("architecture") is not None:
        upgraded["architecture"] = ViTConfig.from_dict(vit_options(upgraded["architecture"])).to_dict()
    return upgraded


def scheduler_state(state: dict) -> dict:
    """A scheduler state for `LambdaLR(warmup_cosine)`: as it is, or converted from the SequentialLR
    that vit-train used before (its step count and last rates carry over)."""
    if "lr_lambdas" in state or "_schedulers" not in state:
        return state
    return {
        "last_epoch": state["last_epoch"],
        "_last_lr": state["_last_lr"],
        "lr_lambdas": [None] * len(state["_last_lr"]),
    }


def checkpoint(ckpt: dict) -> dict:
    """A checkpoint written by vit-train, upgraded in place to `FORMAT_VERSION` and returned."""
    if ckpt.get(CHECKPOINT_KEY, 1) < 2:
        ckpt["hyper_parameters"] = hyper_parameters(ckpt.get("hyper_parameters", {}))
        ckpt["state_dict"] = state_dict(ckpt.get("state_dict", {}), prefix="model.")
        data = ckpt.get("datamodule_hyper_parameters")
        if data and data.get("_class_path") in CLASS_PATHS:
            data["_class_path"] = CLASS_PATHS[data["_class_path"]]
    for option in REMOVED_DATA_OPTIONS:
        (ckpt.get("datamodule_hyper_parameters") or {}).pop(option, None)
    ckpt["lr_schedulers"] = [scheduler_state(s) for s in ckpt.get("lr_schedulers", [])]
    ckpt[CHECKPOINT_KEY] = FORMAT_VERSION
    return ckpt


def export_config(config: dict) -> dict:
    """An export folder's config.json as today's: the model's options as a `ViTConfig` dict."""
    if config.get("format_version", 1) < 2:
        config = {**config, "model": vit_options(config.get("model", {})), "format_version": FORMAT_VERSION}
    return config


def moved_class_paths(value):
    """A config value as a YAML file or a command-line value loads it, with the old class paths
    of `MOVED_CLASSES` (a string, or a `class_path` at any depth) made today's."""
    if isinstance(value, str):
        return MOVED_CLASSES.get(value, value)
    if isinstance(value, dict):
        return {key: moved_class_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [moved_class_paths(item) for item in value]
    return value


def moved_class_args(args: list[str]) -> list[str]:
    """Command-line arguments with the old class paths of `MOVED_CLASSES` made today's wherever
    one stands whole (`--trainer.callbacks+=OLD`): jsonargparse imports a class path given on the
    command line as it is, without the loader that reads config values."""
    for old, new in MOVED_CLASSES.items():
        pattern = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w.])")
        args = [pattern.sub(new, arg) for arg in args]
    return args


def old_option_hint(message: str) -> str | None:
    """For a config or command line that gives a ViT option the version-1 way (`model.preset`,
    `--model.depth`), as jsonargparse reports it: a line naming today's key (`model.vit.preset`)."""
    for old, new in CLASS_PATHS.items():
        if old in message:
            return f"{old} is now {new}"
    found = re.findall(r"Option '(\w+)' is not accepted|model\.(?:init_args\.)?(\w+)", message)
    for key in (a or b for a, b in found):
        if key in VIT_OPTIONS and key not in DATA_OPTIONS:
            return f"the ViT's options moved under model.vit: write model.vit.{key} (--model.vit.{key})"
    return None
