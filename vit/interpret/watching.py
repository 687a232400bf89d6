"""Training callbacks that follow where the model's maps look while it learns: `AttentionMaps`
draws them at each validation (PNGs in the run folder, images in TensorBoard, artifacts in
MLflow), `EvidenceMass` scores them against the evidence the data knows (a curve in every
logger). Here, beside the maps, rather than in `vit.callbacks`: the core of vit imports nothing
from `vit.interpret`. Configs of earlier versions that name `vit.callbacks.EvidenceMass` still
load (`vit.compat.MOVED_CLASSES`)."""

from __future__ import annotations

import io
from contextlib import contextmanager

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image

from vit import storage
from vit.callbacks import log_artifact, run_folder
from vit.interpret.evidence import evidence_scores, patch_evidence
from vit.interpret.figures import training_maps
from vit.interpret.hooks import explicit_attention
from vit.interpret.maps import MapSpec, method_maps, predicted_classes
from vit.interpret.score import evidence_mass
from vit.model import ViT


def tensorboard_image(writer, tag: str, png: bytes, step: int) -> None:
    """A PNG as TensorBoard's image `tag` at `step`, written as it is: `add_image` would encode the
    picture again, which costs as much as drawing it."""
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # Lightning's logger writes with tensorboardX: its own way
        SummaryWriter = None
    if SummaryWriter is None or not isinstance(writer, SummaryWriter):
        writer.add_image(tag, np.asarray(Image.open(io.BytesIO(png))), step, dataformats="HWC")
        return
    width, height = Image.open(io.BytesIO(png)).size
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png)
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


@contextmanager
def measuring(network):
    """Within the `with` block, the network as the maps need it, whenever a callback runs: with
    gradients (validation runs under inference mode; gradient rollout needs them) and in eval mode,
    eagerly (before the first step the network is training: no dropout, BatchNorm's statistics left
    alone); all put back afterwards."""
    with torch.inference_mode(False), torch.enable_grad(), explicit_attention(network, []):
        yield


def nothing_to_show(network) -> str | None:
    """Why the callbacks draw and log nothing for `network` (a CNN, a ViT of depth 0: the run
    trains on, one line says so), or None for a ViT with attention."""
    if not isinstance(network, ViT):
        return "not a ViT"
    return None if network.blocks else "a ViT of depth 0 has no attention to show"


def spread_over_classes(labels: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """`count` indices of `labels`, as many of each class as can be (one of every class before a
    second of any), drawn at random by `seed`, in the order of their classes."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    shuffled = labels[order]
    rank = torch.zeros(len(labels), dtype=torch.long)  # how many of its class come before it
    for label in shuffled.unique():
        of_class = shuffled == label
        rank[of_class] = torch.arange(int(of_class.sum()))
    first = torch.argsort(rank * len(labels) + torch.arange(len(labels)))[:count]
    chosen = order[first]
    return chosen[torch.argsort(labels[chosen], stable=True)]


class AttentionMaps(Callback):
    """Before the first training step and after each validation of `fit`, the maps of
    `num_images` validation images (spread over the classes, chosen once by `seed`) by each of
    `methods` (`vit.interpret.maps.MAP_METHODS`: cls, rollout, grad-rollout, input-gradient): one
    picture, the images on top and a row per method, written into the run folder as
    `attention/epoch_NNN.png` (`epoch_NNN_step_SSSSSS.png` before training and for a validation
    within an epoch), logged to TensorBoard as the image `attention` at the step, and to MLflow as
    an artifact. Where the data knows its evidence (two circles' circles), each map has its
    relevance mass on it in a corner (`EvidenceMass` logs the curve). At the end of `fit`,
    `attention/image_K.png`: each image's maps across the run, at most `columns` of them (the
    first, the last and evenly between). The maps drawn so far are kept in checkpoints, so that a
    resumed run's strips go back to its start.

    Nothing runs on training steps: the maps are computed and drawn after validations, on the
    first process only. `--trainer.callbacks+=vit.interpret.watching.AttentionMaps`; on in
    configs/two_circles.yaml."""

    def __init__(
        self,
        num_images: int = 8,
        methods: tuple[str, ...] = ("rollout", "grad-rollout"),
        seed: int = 0,
        columns: int = 12,
    ):
        if num_images < 1 or columns < 2:
            raise ValueError(
                f"AttentionMaps needs num_images >= 1 and columns >= 2, not {num_images}, {columns}"
            )
        self.specs = [MapSpec(method) for method in methods]  # refuses a name that is not a method
        self.num_images, self.seed, self.columns = num_images, seed, columns
        self.history: list[dict] = []  # each drawing's epoch, step, whether it ended an epoch, maps
        self._data = None  # (images, captions, evidence patches or None), taken when fit starts

    def setup(self, trainer, pl_module, stage: str) -> None:
        # before anything of the run is written (config.yaml is written after this)
        if stage != "fit" or self._data is not None:
            return
        network, datamodule = getattr(pl_module, "model", None), trainer.datamodule
        if (why := nothing_to_show(network)) or not hasattr(datamodule, "split"):
            print(f"AttentionMaps: nothing to draw ({why or 'its data module has no split()'})")
            return
        for spec in self.specs:
            spec.check(network)  # a cls map of a model without a class token: before training
        split = datamodule.split("val")
        labels = getattr(split, "labels", None)
        if labels is None:  # a streamed split: the first images' labels
            labels = torch.tensor([int(split[i][1]) for i in range(min(len(split), 16 * self.num_images))])
        chosen = spread_over_classes(labels.cpu(), self.num_images, self.seed)
        images = torch.stack([split[int(i)][0] for i in chosen]).cpu()
        classes = getattr(datamodule, "classes", None)
        captions = [str(classes[int(labels[i])]) if classes else str(int(labels[i])) for i in chosen]
        evidence = getattr(datamodule, "evidence", lambda name: None)("val")
        if evidence is not None:
            evidence = patch_evidence(network, evidence[chosen.to(evidence.device)].cpu())
        self._data = images, captions, evidence

    def on_train_start(self, trainer, pl_module) -> None:
        # the maps before the first step: what training changes (not when a run resumes)
        if trainer.global_step == 0:
            self._record(trainer, pl_module, validated=False)

    def on_validation_end(self, trainer, pl_module) -> None:
        # at the end (not at the epoch's end, where the logged figures are the last validation's),
        # before the checkpoint callbacks, which Lightning runs last: last.ckpt holds these maps
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._record(trainer, pl_module, validated=True)

    def _record(self, trainer, pl_module, validated: bool) -> None:
        """The maps now (after a validation, or before training): kept, drawn, written and logged."""
        if self._data is None or not trainer.is_global_zero:
            return
        images, captions, evidence = self._data
        network = pl_module.model
        with measuring(network):
            targets = predicted_classes(network, images)  # once for every method
            maps = {spec.method: method_maps(network, images, spec, targets).float() for spec in self.specs}
        epoch, step = trainer.current_epoch, trainer.global_step
        # at an epoch's end, the epoch names it; before training or within an epoch, the step too
        ended = validated and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        self.history.append({"epoch": epoch, "step": step, "ended": ended, "maps": maps})
        title = f"epoch {epoch}, step {step}"
        if validated and "val/acc" in trainer.callback_metrics:
            title += f", val/acc {float(trainer.callback_metrics['val/acc']):.3f}"
        name = f"epoch_{epoch:03d}" + ("" if ended else f"_step_{step:06d}") + ".png"
        png = self._draw(images, maps, captions, title, evidence, trainer, name)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                tensorboard_image(logger.experiment, "attention", png, step)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self._data is None or not self.history or not trainer.is_global_zero:
            return
        images, captions, evidence = self._data
        shown = np.unique(np.linspace(0, len(self.history) - 1, self.columns).round().astype(int))
        moments = [self.history[i] for i in shown]
        columns = [f"epoch {m['epoch']}" if m["ended"] else f"step {m['step']}" for m in moments]
        for k, image in enumerate(images):
            maps = {
                spec.method: torch.stack([m["maps"][spec.method][k] for m in moments]) for spec in self.specs
            }
            title = f"validation image {k} ({captions[k]}) as the model trained"
            repeated = image.expand(len(moments), *image.shape)
            known = None if evidence is None else evidence[k].expand(len(moments), -1)
            self._draw(repeated, maps, columns, title, known, trainer, f"image_{k}.png")

    @staticmethod
    def _draw(images, maps, columns, title, evidence, trainer, name: str) -> bytes:
        """The picture of `training_maps` (with each map's relevance mass on the evidence, where
        the data knows it), written as attention/NAME in the run folder and logged to MLflow; its PNG."""
        notes = None
        if evidence is not None:
            masses = {m: evidence_scores(v.flatten(1), evidence)["relevance_mass"] for m, v in maps.items()}
            notes = {m: [f"{x:.2f}" for x in mass.tolist()] for m, mass in masses.items()}
        picture = training_maps(images, maps, columns, title, notes)
        path = storage.join(run_folder(trainer), "attention", name)  # a URL for a run in a bucket
        png = io.BytesIO()
        Image.fromarray(picture).save(png, format="PNG", compress_level=1)  # lossless at any level
        storage.write_bytes(path, png.getvalue())
        log_artifact(trainer, path, "attention")
        return png.getvalue()

    @property
    def state_key(self) -> str:
        # unique among several of them in one trainer (other methods, other images), as Lightning
        # requires of callbacks with a state
        methods = [spec.method for spec in self.specs]
        return self._generate_state_key(num_images=self.num_images, methods=methods, seed=self.seed)

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))


class EvidenceMass(Callback):
    """Before the first training step and after each validation of `fit`, the relevance mass
    (`vit.interpret.evidence.evidence_scores`) of attention rollout and gradient rollout on the
    first `num_images` validation images: the share of each map on the patches that carry the
    label, logged as `val/evidence_mass_rollout` and `val/evidence_mass_grad_rollout` (metrics.csv,
    and any other logger), beside `val/evidence_share` (what a map that knows nothing scores); the
    figures before training are at step 0. Does the model look at the evidence before, while or
    after it learns the task? Data without evidence (its data module's `evidence` gives None): one
    line, nothing logged. On in configs/two_circles.yaml; elsewhere
    `--trainer.callbacks+=vit.interpret.watching.EvidenceMass`."""

    def __init__(self, num_images: int = 64, methods: tuple[str, ...] = ("rollout", "grad-rollout")):
        if num_images < 1:
            raise ValueError(f"EvidenceMass num_images={num_images} must be at least 1")
        self.num_images, self.methods = num_images, methods
        self._data = None  # (images, evidence patches), taken when first measured
        self._off = False

    def _take_data(self, trainer, pl_module) -> None:
        datamodule, network = trainer.datamodule, getattr(pl_module, "model", None)
        evidence = getattr(datamodule, "evidence", lambda name: None)("val")
        if (why := nothing_to_show(network)) or evidence is None:
            print(f"EvidenceMass: nothing to log ({why or f'{type(datamodule).__name__} has no evidence'})")
            self._off = True
            return
        images = datamodule.split("val")[: self.num_images][0]
        self._data = images, patch_evidence(network, evidence[: len(images)])

    def _measure(self, trainer, pl_module) -> dict[str, float] | None:
        """The figures now, by the names they are logged under; None where there are none."""
        if self._data is None and not self._off:
            self._take_data(trainer, pl_module)
        if self._off:
            return None
        images, evidence = self._data
        with measuring(pl_module.model):
            masses = evidence_mass(pl_module.model, images, evidence, self.methods)
        figures = {
            f"val/evidence_mass_{method.replace('-', '_')}": mass.item() for method, mass in masses.items()
        }
        return figures | {"val/evidence_share": evidence.float().mean().item()}

    def on_train_start(self, trainer, pl_module) -> None:
        # the model before its first step, where the curves start (not when a run resumes); to the
        # loggers at step 0, as Lightning's `log` cannot be called here
        if trainer.global_step == 0 and (figures := self._measure(trainer, pl_module)) is not None:
            for logger in trainer.loggers:
                logger.log_metrics(figures, step=0)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        for name, value in (self._measure(trainer, pl_module) or {}).items():
            pl_module.log(name, value)
