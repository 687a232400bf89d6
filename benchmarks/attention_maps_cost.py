"""What the training callbacks that look at the maps cost a run: `AttentionMaps` (the pictures) and
`EvidenceMass` (the curve), against the validations they run after.

    python benchmarks/attention_maps_cost.py                # the demo config, as make demo trains it
    python benchmarks/attention_maps_cost.py --tensorboard  # with TensorBoard's logger
    python benchmarks/attention_maps_cost.py --smoke        # a tiny run, to check the script

Trains `--config` (configs/two_circles.yaml, which turns both callbacks on) once in this process,
with each callback's hook timed, and prints, for every validation: its seconds without the two
callbacks, and each callback's seconds and share of that. Neither callback runs on training
steps (they have no training-step hooks; tests/interpret/test_training_maps.py checks), so a
validation is all they can slow. Also the strips `AttentionMaps` draws once, when fit ends, and
the parts of one drawing, each timed alone on the trained model (the median of 20).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

from lightning.pytorch.callbacks import Callback  # noqa: E402

from lab.machine import cpu_name  # noqa: E402
from vit.commands.train import run  # noqa: E402
from vit.interpret.figures import training_maps  # noqa: E402
from vit.interpret.maps import method_maps, predicted_classes  # noqa: E402
from vit.interpret.watching import AttentionMaps, EvidenceMass  # noqa: E402

TIMED = {  # the hook each callback works in
    "AttentionMaps": (AttentionMaps, "on_validation_end"),
    "EvidenceMass": (EvidenceMass, "on_validation_epoch_end"),
}
TENSORBOARD = ["--trainer.logger", "TensorBoardLogger"]
SMOKE = ["--trainer.max_epochs", "2", "--data.init_args.num_train", "256", "--data.init_args.num_val", "64"]


class Validations(Callback):
    """Each validation's seconds, from its start to its end (the timed callbacks included: the
    first callback's on_validation_start, the last callback's on_validation_end)."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.seconds.append(time.perf_counter() - self._start)


def timed(function, seconds: list[float]):
    def wrapper(self, trainer, *args, **kwargs):
        start = time.perf_counter()
        function(self, trainer, *args, **kwargs)
        if not trainer.sanity_checking:
            seconds.append(time.perf_counter() - start)

    return wrapper


def measure(config: str, options: list[str]) -> dict:
    seconds = {name: [] for name in TIMED}
    originals = {name: getattr(cls, hook) for name, (cls, hook) in TIMED.items()}
    strip = []
    original_end = AttentionMaps.on_fit_end
    try:
        for name, (cls, hook) in TIMED.items():
            setattr(cls, hook, timed(originals[name], seconds[name]))
        AttentionMaps.on_fit_end = timed(original_end, strip)
        with tempfile.TemporaryDirectory() as runs:
            args = ["fit", "--config", config, "--trainer.logger.init_args.save_dir", runs]
            # last, so that its on_validation_end runs after those of the callbacks it times
            args += ["--trainer.callbacks+=benchmarks.attention_maps_cost.Validations"]
            cli = run([*args, "--trainer.enable_progress_bar", "false", *options])
        callbacks = {type(c).__name__: c for c in cli.trainer.callbacks}
    finally:
        for name, (cls, hook) in TIMED.items():
            setattr(cls, hook, originals[name])
        AttentionMaps.on_fit_end = original_end
    missing = [name for name in TIMED if name not in callbacks]
    if missing:
        raise SystemExit(f"error: {config} does not turn on {', '.join(missing)}")
    parts = drawing_parts(callbacks["AttentionMaps"], cli.model.model)
    return {
        "validations": callbacks["Validations"].seconds,
        "callbacks": seconds,
        "strips": strip,
        "parts": parts,
    }


def median_seconds(function, repeats: int = 20) -> float:
    function()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def drawing_parts(callback: AttentionMaps, network) -> dict[str, float]:
    """Seconds of each part of one drawing of `callback` on `network`, as `_record` runs them."""
    import torch
    from PIL import Image

    images, captions, _ = callback._data
    targets = predicted_classes(network, images)
    parts = {"predicted classes": median_seconds(lambda: predicted_classes(network, images))}
    maps = {}
    for spec in callback.specs:
        with torch.enable_grad():
            parts[f"{spec.method} maps"] = median_seconds(
                lambda s=spec: method_maps(network, images, s, targets)
            )
            maps[spec.method] = method_maps(network, images, spec, targets)
    parts["the picture"] = median_seconds(lambda: training_maps(images, maps, captions, "title"))
    picture = Image.fromarray(training_maps(images, maps, captions, "title"))
    parts["its PNG"] = median_seconds(lambda: picture.save(io.BytesIO(), format="PNG", compress_level=1))
    return parts


def report(results: dict) -> None:
    total, callbacks = results["validations"], results["callbacks"]
    alone = [t - sum(s[i] for s in callbacks.values()) for i, t in enumerate(total)]
    print(f"{cpu_name()}; seconds of each validation, and each callback's share of it without them")
    print(f"| validation | without the callbacks | {' | '.join(callbacks)} |")
    print("|---|---|" + "---|" * len(callbacks))
    for i, seconds in enumerate(alone):
        shares = " | ".join(f"{s[i]:.3f} s ({s[i] / seconds:.1%})" for s in callbacks.values())
        print(f"| {i} | {seconds:.3f} s | {shares} |")
    for name, s in callbacks.items():
        ratio = statistics.median(x / a for x, a in zip(s, alone, strict=True))
        print(f"{name}: median {statistics.median(s) * 1000:.1f} ms a validation, {ratio:.1%} of it")
    print(f"AttentionMaps' strips at the end of fit: {results['strips'][0]:.2f} s")
    print("one drawing, part by part (each alone, the median of 20):")
    for part, seconds in results["parts"].items():
        print(f"  {part}: {seconds * 1000:.1f} ms")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "two_circles.yaml"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run: 2 epochs of 256 images")
    parser.add_argument("--tensorboard", action="store_true", help="log to TensorBoard, not CSV")
    args = parser.parse_args(argv)
    options = (SMOKE if args.smoke else []) + (TENSORBOARD if args.tensorboard else [])
    results = measure(args.config, options)
    report(results)
    return results


if __name__ == "__main__":
    main()
