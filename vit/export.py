"""A ViT as a folder the ecosystem reads: `model.safetensors` and `config.json`, no pickle.

    vit-export --ckpt runs/demo/train/checkpoints/best.ckpt --out exported/demo

`config.json` holds the model's `ViTConfig` (mean/std included), the `Preparation` (size, mode,
resize, class names), a format tag and its version (`vit.compat` reads older folders);
`model.safetensors` the weights (Hugging Face's `save_pretrained` layout).
`vit.load_pretrained(folder)` reads it back. Neither file can run code when read: safe by
construction.
"""

from __future__ import annotations

import json
from pathlib import Path

from vit import compat
from vit.config import ViTConfig
from vit.errors import one_line
from vit.model import ViT
from vit.preparation import Preparation

FORMAT = "vit.ViT"  # what config.json says it holds
FILES = ("config.json", "model.safetensors")


def save_folder(model: ViT, preparation: Preparation, folder: str | Path) -> list[Path]:
    """Write `model` and its preparation into `folder` (made if needed); returns the files."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT,
        "format_version": compat.FORMAT_VERSION,
        "model": model.config.to_dict(),
        "preparation": preparation.to_dict(),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return [folder / name for name in FILES]


def save_onnx(model: ViT, path: str | Path) -> Path:
    """`model` as ONNX (images in [0, 1] -> logits or features) with a dynamic batch dimension,
    through PyTorch's exporter (torch.export; it needs onnxscript)."""
    import torch

    try:
        import onnxscript  # noqa: F401  (the exporter's dependency: say so in one line if absent)
    except ImportError as e:
        raise ValueError("ONNX export needs onnxscript: pip install 'vit[interop]'") from e
    path = Path(path)
    images = torch.rand(2, model.in_channels, *model.image_size)
    batch = torch.export.Dim("batch")
    torch.onnx.export(
        model.eval(), (images,), path, input_names=["images"], output_names=["outputs"],
        dynamic_shapes=({0: batch},), dynamo=True, verbose=False, external_data=False,
    )  # fmt: skip
    return path


def is_exported(folder: str | Path) -> bool:
    """Whether `folder` looks like a folder written by `save_folder`."""
    try:
        return json.loads((Path(folder) / "config.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_folder(folder: str | Path) -> tuple[ViT, Preparation]:
    """The model (in eval mode) and preparation of a folder written by `save_folder`."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_exported(folder):
        raise ValueError(f"{folder} holds no config.json written by vit-export")
    config = json.loads((folder / "config.json").read_text())
    old = config.get("format_version", 1) < compat.FORMAT_VERSION
    config = compat.export_config(config)
    try:
        model = ViT(ViTConfig.from_dict(config["model"]))
        preparation = Preparation.from_dict(config["preparation"])
    except (TypeError, KeyError) as e:
        raise ValueError(f"{folder}/config.json does not describe a vit.ViT ({one_line(e)})") from e
    try:
        state = load_file(folder / "model.safetensors")
        model.load_state_dict(compat.state_dict(state) if old else state)
    except Exception as e:  # missing file, not safetensors, weights of another shape
        raise ValueError(
            f"{folder}/model.safetensors does not fit its config.json ({one_line(e)[:300]})"
        ) from e
    return model.eval(), preparation
