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

import sys
from pathlib import Path

from vit.commands.base import Parser, check_out_folder, run_command


def export(ckpt: str | Path, out: str | Path, onnx: bool = False) -> list[Path]:
    from vit.checkpoint import load_network
    from vit.export import save_folder, save_onnx
    from vit.model import ViT

    check_out_folder(out)
    model, preparation = load_network(ckpt)
    if not isinstance(model, ViT):
        raise ValueError(f"{ckpt} holds a {type(model).__name__}, not a ViT")
    written = save_folder(model, preparation, out)
    if onnx:
        written.append(save_onnx(model, Path(out) / "model.onnx"))
    print(f"wrote {', '.join(path.name for path in written)} into {out}")
    return written


def parser() -> Parser:
    parser = Parser(
        prog="vit-export",
        description=(
            "Write a checkpoint's ViT as a folder of plain files: model.safetensors (the weights, no "
            "pickle) and config.json (architecture, mean/std, preparation, class names), and with "
            "--onnx model.onnx. vit-eval, vit-attention and vit.load_pretrained read it back (--model "
            "FOLDER)."
        ),
    )
    parser.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint written by vit-train")
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder for model.safetensors and config.json"
    )
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also model.onnx (images in [0, 1], any batch size); needs onnxscript",
    )
    return parser


def main(args: list[str] | None = None) -> None:
    options = parser().parse_args(sys.argv[1:] if args is None else [str(a) for a in args])
    run_command(export, options.ckpt, options.out, options.onnx)


if __name__ == "__main__":
    main()
