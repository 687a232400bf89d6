"""Which heads do three two-circles ViTs use, and does where a head looks say so? Trains the three
models of docs/heads.md, then runs on each `vit-attention heads` (1,000 test images; with the
default attribution, the logit difference to the runner-up, and again with `--attribute logit`),
`vit-attention patch` (256 pairs of exact counterfactuals) and the three studies beside them
(`patch_by_evidence.py`, `even_attention.py`, `circle_attention.py`, the last for the head whose
mean ablation costs the most), writing every printout and JSON into one folder, by default
studies/heads/outputs/: the files docs/heads.md reads its figures from.

    python studies/heads/heads_study.py                              # about 20 minutes on 2 CPU cores
    python studies/heads/heads_study.py --out /tmp/study --smoke     # seconds: every step, tiny

The models (their commands in MODELS): "demo", the demo config with learned absolute positions
(4 blocks of 4 heads, the head reading the patch tokens' mean); "converged", class-token pooling
and periodic positions trained 6,000 steps; "relpos", one block of 4 heads with relative position
bias. Checkpoints go to RUNS/<model>; a model whose best.ckpt is there is not trained again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `studies`, `lab` and `vit` import from the checkout

from lab.machine import cpu_name  # noqa: E402
from studies.heads import circle_attention, even_attention, patch_by_evidence  # noqa: E402
from vit.commands import heads, patch  # noqa: E402
from vit.commands.train import run  # noqa: E402

MODELS = {
    "demo": ["--model.vit.rel_pos_bias", "false", "--model.vit.pos_embed", "learned"],
    "converged": [
        "--model.vit.pos_embed", "periodic", "--model.vit.patch_norm", "true", "--model.vit.init", "torch",
        "--model.vit.pool", "cls", "--model.lr", "0.002", "--data.init_args.radius", "2.0",
        "--data.init_args.separation", "[12.0, 14.5]", "--data.init_args.far_separation", "[14.5, 15.9]",
        "--data.init_args.holdout_midpoints", "true", "--trainer.max_epochs", "-1",
        "--trainer.max_steps", "6000",
    ],
    "relpos": [
        "--model.vit.dim", "64", "--model.vit.heads", "4", "--model.vit.depth", "1",
        "--model.vit.mlp_ratio", "2.0", "--model.vit.patch_size", "4", "--model.vit.pos_embed", "none",
        "--model.vit.rel_pos_bias", "true", "--model.vit.pool", "mean", "--model.vit.init", "torch",
        "--model.lr", "0.003", "--data.init_args.radius", "2.5", "--data.init_args.separation",
        "[10.0, 15.5]", "--data.init_args.separation_metric", "chebyshev", "--trainer.max_epochs", "-1",
        "--trainer.max_steps", "2000",
    ],
}  # fmt: skip
SMOKE = ["--trainer.max_steps", "4", "--trainer.max_epochs", "1", "--data.init_args.num_train", "64",
         "--data.init_args.num_val", "32", "--data.init_args.num_test", "64"]  # fmt: skip


def train(name: str, runs: Path, smoke: bool) -> Path:
    """`vit-train fit --config configs/two_circles.yaml` with the model's options; its best.ckpt."""
    best = runs / name / "train" / "checkpoints" / "best.ckpt"
    if best.exists():
        return best
    logger = ["--trainer.logger.init_args.save_dir", str(runs), "--trainer.logger.init_args.name", name,
              "--trainer.logger.init_args.version", "train",
              "--trainer.enable_progress_bar", "false"]  # fmt: skip
    options = MODELS[name] + (SMOKE if smoke else [])
    cli = run(["fit", "--config", str(ROOT / "configs" / "two_circles.yaml"), *logger, *options])
    (result,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)
    (runs / name / "test.json").write_text(json.dumps(result, indent=1))
    return best


def printed(step, *args, **kwargs) -> str:
    """What `step(*args, **kwargs)` prints."""
    with contextlib.redirect_stdout(io.StringIO()) as text:
        step(*args, **kwargs)
    return text.getvalue()


def costliest_head(results: dict) -> tuple[int, int]:
    """The (layer, head) whose mean ablation costs the most accuracy: circle_attention's --head."""
    table = results["ablation"]["mean"]["accuracy"]
    return min(
        ((i, j) for i, row in enumerate(table) for j in range(len(row))),
        key=lambda lh: table[lh[0]][lh[1]]["mean"],
    )


def study(name: str, ckpt: Path, out: Path, images: int, pairs: int) -> None:
    """Every analysis of one model, its printouts and JSON written to OUT/<name>_*."""
    with tempfile.TemporaryDirectory() as scratch:
        for attribute, suffix in (("difference", "heads"), ("logit", "heads_raw_logit")):
            folder = Path(scratch) / suffix
            options = heads.HeadsOptions(ckpt=ckpt, num_images=images, attribute=attribute, out=folder)
            text = printed(heads.heads, options)
            (out / f"{name}_{suffix}.txt").write_text(text)
            shutil.copy(folder / "heads.json", out / f"{name}_{suffix}.json")
            if suffix == "heads":
                shutil.copy(folder / "ablation_mean.png", out / f"{name}_ablation_mean.png")
        folder = Path(scratch) / "patch"
        options = patch.PatchOptions(ckpt=ckpt, num_images=pairs, out=folder)
        (out / f"{name}_patch.txt").write_text(printed(patch.patch, options))
        shutil.copy(folder / "patch.json", out / f"{name}_patch.json")
        shutil.copy(folder / "patch_heads.png", out / f"{name}_patch_heads.png")
    layer, head = costliest_head(json.loads((out / f"{name}_heads.json").read_text()))
    benchmarks = {
        "patch_by_evidence": (patch_by_evidence.main, ["--num-images", str(pairs)]),
        "even_attention": (even_attention.main, ["--num-images", str(images)]),
        "circle_attention": (circle_attention.main,
                             ["--num-images", str(images), "--head", str(layer), str(head)]),
    }  # fmt: skip
    for script, (main, options) in benchmarks.items():
        (out / f"{name}_{script}.txt").write_text(printed(main, ["--ckpt", str(ckpt), *options]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE / "outputs", help="folder for the outputs")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "heads_study", help="the checkpoints")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--smoke", action="store_true", help="tiny training and few images: a check")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    images, pairs = (16, 8) if args.smoke else (1000, 256)
    # each model's CPU and test figures, kept for the models this run leaves alone (--models)
    path = args.out / "machine.json"
    machine = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    for name in args.models:
        ckpt = train(name, args.runs, args.smoke)
        study(name, ckpt, args.out, images, pairs)
        test = json.loads((args.runs / name / "test.json").read_text())
        machine["models"][name] = {"cpu": cpu_name(), **test}
        path.write_text(json.dumps(machine, indent=1))
        print(f"{name}: test top-1 {test['test/acc']:.4f}; outputs in {args.out}")


if __name__ == "__main__":
    main()
