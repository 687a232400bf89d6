"""`vit-export`: a checkpoint's ViT as a folder the ecosystem reads (`vit.export`).

    vit-export --ckpt runs/demo/train/checkpoints/best.ckpt --out exported/demo

Writes `model.safetensors` and `config.json` (the architecture, normalisation included, the
preparation and the class names); `vit.load_pretrained(folder)` reads it back. `--onnx` adds
`model.onnx` with a dynamic batch dimension. Bad input is one
line `error: ...` and exit status 2 (a bad option) or 1 (a bad checkpoint), nothing written.

torch and Lightning are imported inside `export`, not at the top: importing them takes seconds,
and `vit-export --help` needs neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vit.commands.base import Command, check_out_folder, option


@dataclass
class ExportOptions:
    """The options of vit-export."""

    ckpt: str = option(None, "checkpoint written by vit-train", required=True, metavar="PATH")
    out: str = option(None, "folder for model.safetensors and config.json", required=True, metavar="DIR")
    onnx: bool = option(
        False, "also model.onnx (images in [0, 1], any batch size); needs onnxscript", action="store_true"
    )


def export(options: ExportOptions) -> list[Path]:
    from vit.checkpoint import load_network
    from vit.export import save_folder, save_onnx
    from vit.model import ViT

    ckpt, out = options.ckpt, options.out
    check_out_folder(out)
    model, preparation = load_network(ckpt)
    if not isinstance(model, ViT):
        raise ValueError(f"{ckpt} holds a {type(model).__name__}, not a ViT")
    written = save_folder(model, preparation, out)
    if options.onnx:
        written.append(save_onnx(model, Path(out) / "model.onnx"))
    print(f"wrote {', '.join(path.name for path in written)} into {out}")
    return written


COMMAND = Command(
    prog="vit-export",
    description=(
        "Write a checkpoint's ViT as a folder of plain files: model.safetensors (the weights, no "
        "pickle) and config.json (architecture, mean/std, preparation, class names), and with "
        "--onnx model.onnx. vit-eval, vit-attention and vit.load_pretrained read it back (--model "
        "FOLDER)."
    ),
    options=ExportOptions,
    function=export,
)
main = COMMAND.main

if __name__ == "__main__":
    main()
