"""Which map tells the truth? Faithfulness scores for the maps of `vit.interpret.maps`, against the
model's behaviour and, where the data knows it, against the evidence.

- Perturbation (Chefer et al. 2021's positive and negative perturbation; RISE's deletion):
  patches are replaced by the data's mean colour in the map's order, most relevant first
  (`deletion`: the lower the area under the curve, the better the map) or least relevant first
  (`insertion`: the most relevant patches are the last ones kept, higher is better), at 0, 10,
  ..., 100% of the patches (every patch count for grids of 16 or fewer). At each step the top-1
  accuracy and the mean probability of the explained class (the prediction on the whole image);
  areas by the trapezoid over [0, 1], the unperturbed point included.
- Against the evidence (the pixels that carry the label, from the data module's `evidence`):
  the share of the map's positive mass on evidence patches (relevance mass), the share of the
  map's top-k patches that are evidence, k the evidence's size (rank accuracy), and whether the
  top patch is evidence (pointing game).
- Sanity checks (Adebayo et al. 2018): model-parameter randomisation (the head, then the blocks
  from the last down, re-initialised in turn; each step's Spearman rank correlation with the
  trained model's maps) and target sensitivity (the maps for the predicted class against those
  for the runner-up).

Every figure is the mean over images with a 95% bootstrap interval over images (`interval`).
`score` runs it all; `vit-attention score` prints and saves what it returns.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vit.errors import UsageError
from vit.interpret.evidence import evidence_scores, layers_heads_scores, patch_evidence, perturbed
from vit.interpret.hooks import model_outputs
from vit.interpret.maps import MAP_METHODS, MapSpec, method_maps
from vit.interpret.stats import as_text, bootstrap, interval, lh_interval, spearman
from vit.model import ViT

MODEL_METHODS = tuple(name for name, method in MAP_METHODS.items() if method.scored)  # read the model
METHODS = {  # name (as vit-attention --method names the same map) -> what its map is
    **{name: MAP_METHODS[name].scored for name in MODEL_METHODS},
    "random": "uniform random values (chance)",
    "evidence": "the evidence itself (the best possible)",
}
OLD_NAMES = {"attention": "cls"}  # what earlier versions called a method: still read, with a note


def current_names(methods: list[str]) -> list[str]:
    """`methods` with the names of earlier versions replaced by today's, each noted in one line on
    stderr."""
    for old in dict.fromkeys(m for m in methods if m in OLD_NAMES):
        print(f"note: the method {old!r} is now called {OLD_NAMES[old]!r}", file=sys.stderr)
    return [OLD_NAMES.get(m, m) for m in methods]


PROTOCOL = {
    "replacement": "patches replaced by the mean colour (per channel) of the scored images",
    "deletion": "most relevant patches replaced first; lower area is better",
    "insertion": "least relevant patches replaced first (the most relevant kept longest); higher is better",
    "steps": "0, 10, ..., 100% of the patches (rounded); every patch count for grids of 16 or fewer",
    "area": "trapezoid over the replaced fraction in [0, 1], the unperturbed point included",
    "explained class": "the prediction on the unperturbed image (its probability at each step)",
    "accuracy": "top-1 against the labels (against the unperturbed prediction without labels)",
    "ties": "removal: broken in a random order fixed by the seed; rank accuracy and pointing game: "
    "tied patches count as their expectation over a random order",
    "relevance mass": "positive part of the map on evidence patches over its positive part on all",
    "rank accuracy": "share of the map's top-k patches that are evidence, k = evidence patches",
    "pointing game": "1 if the map's top patch is evidence",
    "randomisation": "head, then blocks from the last down, re-initialised cumulatively (torch's "
    "reset_parameters); Spearman rank correlation with the trained model's map, per image",
    "target sensitivity": "Spearman rank correlation of the maps for the predicted and runner-up class",
    "interval": bootstrap("images"),
}


# ------------------------------------------------------------------------------ the maps, per patch


def scored_maps(
    model: ViT, images: torch.Tensor, method: str, targets: torch.Tensor, batch_size: int | None = None
) -> torch.Tensor:
    """The map of `method` (one of MODEL_METHODS, as `MapSpec(method)` gives it: the last layer, every
    head, every layer rolled out) for each image and its target class: (B, patches), `batch_size`
    images at a time (default: all at once)."""
    return method_maps(model, images, MapSpec(method), targets, batch_size or len(images)).flatten(1)


# --------------------------------------------------------------------------------- perturbation


def removal_counts(patches: int) -> list[int]:
    """How many patches are replaced at each step: every count for grids of 16 or fewer, else
    0, 10, ..., 100% of them (rounded)."""
    if patches <= 16:
        return list(range(patches + 1))
    return sorted({round(patches * i / 10) for i in range(11)})


def removal_order(maps: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Patch indices (B, patches), most relevant first; ties in a random order."""
    shuffle = torch.rand(maps.shape, generator=generator).argsort(dim=-1)
    order = maps.gather(-1, shuffle).argsort(dim=-1, descending=True, stable=True)
    return shuffle.gather(-1, order)


def perturbation_curves(
    model: nn.Module,
    images: torch.Tensor,
    order: torch.Tensor,
    targets: torch.Tensor,
    truth: torch.Tensor,
    fill: torch.Tensor,
    grid: tuple[int, int],
    counts: list[int],
    batch_size: int = 64,
    ends: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the patches in `order` (B, patches), the first `k` of them for each k in `counts`:
    the probability of `targets` and whether the top-1 class is `truth`, each (steps, B). The
    perturbed copies go through the model as batches. `ends`: the logits with no patch and with
    every patch replaced, where already known (they do not depend on the order)."""
    patches = order.shape[1]
    rank = order.argsort(dim=-1)  # rank[b, p]: when patch p is replaced
    inner = [k for k in counts if 0 < k < patches] if ends is not None else counts
    removed = torch.stack([rank < k for k in inner])  # (steps, B, patches)
    copies = perturbed(images, removed, fill, grid).flatten(0, 1)
    logits = model_outputs(model, copies, batch_size).view(len(inner), len(images), -1)
    if ends is not None:
        by_count = dict(zip(inner, logits, strict=True)) | {0: ends[0], patches: ends[1]}
        logits = torch.stack([by_count[k] for k in counts])
    probability = logits.softmax(-1).gather(-1, targets.expand(len(counts), -1)[..., None])[..., 0]
    return probability, (logits.argmax(-1) == truth).float()


def area(curves: torch.Tensor, counts: list[int], patches: int) -> torch.Tensor:
    """Area under curves (steps, B) over the replaced fraction in [0, 1], per image: (B,)."""
    fractions = torch.tensor(counts, dtype=torch.float32) / patches
    return torch.trapezoid(curves, fractions, dim=0)


# ---------------------------------------------------------------------------------- sanity checks


def reinitialise(*modules: nn.Module | None) -> None:
    """Every submodule's parameters drawn anew as at construction (`reset_parameters`: linear
    layers, norms, and this project's relative position tables, LayerScale and LSA temperature)."""
    for module in filter(None, modules):
        for m in module.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()


def randomisation_steps(model: ViT, seed: int = 0):
    """Copies of `model` with the head (with the distillation head and the norm after pooling),
    then also the last block (with its relative position table, held outside the block), the one
    before, ... down to the first re-initialised: yields (what is random so far, the copy)."""
    randomised = copy.deepcopy(model)
    torch.manual_seed(seed)
    reinitialise(randomised.head, randomised.head_dist, randomised.fc_norm)
    yield "head", randomised
    last = len(randomised.blocks) - 1
    for i in reversed(range(last + 1)):
        randomised = copy.deepcopy(randomised)
        reinitialise(randomised.blocks[i], randomised.rel_pos[i] if randomised.rel_pos is not None else None)
        yield f"head + block {i}" if i == last else f"head + blocks {i}-{last}", randomised


# --------------------------------------------------------------------------------------- figures


def default_methods(model: ViT, has_evidence: bool) -> list[str]:
    """Every method that applies: the evidence where the data knows it, the class token's
    attention where the model has one."""
    left_out = {"evidence"} if not has_evidence else set()
    left_out |= {"cls"} if model.cls_token is None else set()
    return [m for m in METHODS if m not in left_out]


def score(
    model: ViT,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    evidence: torch.Tensor | None = None,
    methods: list[str] | None = None,
    batch_size: int = 64,
    seed: int = 0,
    sanity: bool = True,
    progress: Callable | None = None,
) -> dict:
    """Score each method's maps of `model` on `images` (N, C, H, W in [0, 1]): perturbation
    curves and their areas, the evidence figures where `evidence` (N, H, W pixels) is given, and
    the sanity checks. Returns per-image values and figures (`interval`) in a dict: "methods",
    "counts" (patches replaced per step), "curves" {method: {deletion/insertion: {probability,
    accuracy}: (steps,) means}}, "figures" {method: {name: interval}}, "layers_heads" (the
    class-token and evidence-query maps' evidence figures per layer and head), "randomisation"
    {method: [(step, interval)]}, "protocol". `progress(iterable)` wraps the chunk loop (tqdm).
    """
    methods = _checked_methods(model, methods, evidence)
    model.eval()
    patches = model.grid_size[0] * model.grid_size[1]
    counts = removal_counts(patches)
    evidence_patches = patch_evidence(model, evidence) if evidence is not None else None
    found = _scored_chunks(
        model, images, labels, evidence_patches, methods=methods, counts=counts, batch_size=batch_size,
        seed=seed, progress=progress,
    )  # fmt: skip
    results = {
        "methods": {m: METHODS[m] for m in methods},
        "num_images": len(images),
        "patches": patches,
        "evidence_share": None if evidence_patches is None else evidence_patches.float().mean().item(),
        "counts": counts,
        "protocol": PROTOCOL,
        "curves": {m: {k: v.mean(dim=1).tolist() for k, v in found.curves[m].items()} for m in methods},
        "figures": {m: {k: interval(v, seed=seed) for k, v in found.per_image[m].items()} for m in methods},
        "layers_heads": {k: lh_interval(v, seed) for k, v in found.layers_heads.items()},
    }
    if sanity:
        trained = {m: torch.cat(v) for m, v in found.trained_maps.items()}
        predicted, runner_up = torch.cat(found.top2).unbind(dim=1)
        results["randomisation"] = randomisation(model, images, trained, predicted, batch_size, seed)
        results["target_sensitivity"] = target_sensitivity(
            model, images, trained, runner_up, batch_size, seed
        )
    return results


def _checked_methods(model: ViT, methods: list[str] | None, evidence: torch.Tensor | None) -> list[str]:
    """`score`'s methods by today's names (by default every one that applies), each known and
    applicable to `model` and the data, or a `UsageError` naming the one that is not."""
    methods = current_names(list(methods or default_methods(model, evidence is not None)))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    if "evidence" in methods and evidence is None:
        raise UsageError("the method evidence needs data that knows its evidence")
    if "cls" in methods and model.cls_token is None:
        raise UsageError("this model has no class token: leave out the method cls")
    return methods


@dataclass
class ChunkScores:
    """What `score` measures image by image, over all N images (L blocks, H heads); what only the
    sanity checks read, chunk by chunk (concatenated where they run)."""

    top2: list[torch.Tensor]  # per chunk (B, 2): the predicted and the runner-up class
    per_image: dict[str, dict[str, torch.Tensor]]  # method -> figure name -> (N,)
    curves: dict[str, dict[str, torch.Tensor]]  # method -> "deletion/probability", ... -> (steps, N)
    layers_heads: dict[str, torch.Tensor]  # evidence figure of a layer's and head's maps -> (L, H, N)
    trained_maps: dict[str, list[torch.Tensor]]  # method that reads the model -> per chunk (B, patches)


def _scored_chunks(
    model: ViT,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    evidence_patches: torch.Tensor | None,
    *,
    methods: list[str],
    counts: list[int],
    batch_size: int,
    seed: int,
    progress: Callable | None,
) -> ChunkScores:
    """Every method's maps, removal curves and evidence figures, `batch_size` images at a time.
    One generator seeded with `seed` draws the random maps, then each removal order's ties."""
    grid, patches = model.grid_size, model.grid_size[0] * model.grid_size[1]
    fill = images.mean(dim=(0, 2, 3))  # the data's mean colour
    g = torch.Generator().manual_seed(seed)
    random_maps = torch.rand(len(images), patches, generator=g)
    top2: list[torch.Tensor] = []
    per_image: dict[str, dict[str, list]] = {m: {} for m in methods}
    curves: dict[str, dict[str, list]] = {m: {} for m in methods}
    layer_head: dict[str, list] = {}
    trained_maps: dict[str, list] = {m: [] for m in methods if m in MODEL_METHODS}
    chunks = range(0, len(images), batch_size)
    for start in progress(chunks) if progress else chunks:
        x = images[start : start + batch_size]
        # no patch and every patch replaced: the ends of every curve, whatever the order
        everything = perturbed(x, torch.ones(len(x), patches, dtype=torch.bool), fill, grid)
        ends = tuple(model_outputs(model, torch.cat([x, everything]), batch_size).view(2, len(x), -1))
        top2.append(ends[0].topk(2, dim=-1).indices)
        predicted = top2[-1][:, 0]
        truth = predicted if labels is None else labels[start : start + batch_size]
        found = None if evidence_patches is None else evidence_patches[start : start + batch_size]
        for method in methods:
            if method == "random":
                maps = random_maps[start : start + batch_size]
            elif method == "evidence":
                maps = found.float()
            else:
                maps = scored_maps(model, x, method, predicted)
                trained_maps[method].append(maps)
            removal = _removal_curves(model, x, maps, g, predicted, truth, fill, counts, batch_size, ends)
            for key, values in removal.items():  # "deletion/probability", ...
                _keep(curves[method], key, values)
                curve, figure = key.split("/")
                _keep(per_image[method], f"{curve}_auc_{figure}", area(values, counts, patches))
            if found is not None:
                for name, values in evidence_scores(maps, found).items():
                    _keep(per_image[method], name, values)
        if found is not None:
            for name, values in layers_heads_scores(model, x, found).items():
                _keep(layer_head, name, values)
    return ChunkScores(
        top2=top2,
        per_image={m: {k: torch.cat(v) for k, v in per_image[m].items()} for m in methods},
        curves={m: {k: torch.cat(v, dim=1) for k, v in curves[m].items()} for m in methods},
        layers_heads={k: torch.cat(v, dim=-1) for k, v in layer_head.items()},
        trained_maps=trained_maps,
    )


def _removal_curves(
    model: ViT,
    images: torch.Tensor,
    maps: torch.Tensor,
    generator: torch.Generator,
    predicted: torch.Tensor,
    truth: torch.Tensor,
    fill: torch.Tensor,
    counts: list[int],
    batch_size: int,
    ends: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Deletion (the most relevant patch of `maps` (B, patches) replaced first) and insertion (the
    least relevant first): `perturbation_curves`' probability and accuracy, (steps, B) each, by
    "deletion/probability", "deletion/accuracy", "insertion/probability", "insertion/accuracy"."""
    curves = {}
    for curve, order in (("deletion", maps), ("insertion", -maps)):
        order = removal_order(order, generator)
        probability, correct = perturbation_curves(
            model, images, order, predicted, truth, fill, model.grid_size, counts, batch_size, ends
        )
        curves[f"{curve}/probability"], curves[f"{curve}/accuracy"] = probability, correct
    return curves


def _keep(where: dict, key: str, value: torch.Tensor) -> None:
    where.setdefault(key, []).append(value)


def randomisation(
    model: ViT, images, trained: dict, predicted: torch.Tensor, batch_size: int, seed: int
) -> dict:
    """Per method, each cascading randomisation step's rank correlation with the trained maps (for
    the class the trained model predicted)."""
    out: dict[str, list] = {m: [] for m in trained}
    for step, randomised in randomisation_steps(model, seed):
        for method, maps in trained.items():
            new = scored_maps(randomised, images, method, predicted, batch_size)
            out[method].append({"step": step, **interval(spearman(maps, new), seed=seed)})
    return out


def target_sensitivity(
    model: ViT, images, trained: dict, runner_up: torch.Tensor, batch_size: int, seed: int = 0
) -> dict:
    """Per method, the rank correlation of its maps for the predicted and the runner-up class."""
    return {
        method: interval(spearman(maps, scored_maps(model, images, method, runner_up, batch_size)), seed=seed)
        for method, maps in trained.items()
    }


def evidence_mass(model: ViT, images: torch.Tensor, evidence: torch.Tensor, methods: Sequence[str]) -> dict:
    """The mean relevance mass of each method's maps for the predicted classes on evidence patches
    (B, patches): what `vit.interpret.watching.EvidenceMass` logs while training."""
    predicted = model_outputs(model, images, len(images)).argmax(-1)
    return {
        method: evidence_scores(scored_maps(model, images, method, predicted), evidence)[
            "relevance_mass"
        ].nanmean()
        for method in methods
    }


HEADLINE = {  # the figures `headline` keeps, by their names in `score`'s results
    "deletion_auc_probability": "deletion ↓",
    "insertion_auc_probability": "insertion ↑",
    "relevance_mass": "relevance mass ↑",
    "rank_accuracy": "rank accuracy ↑",
    "pointing_game": "pointing game ↑",
}


def headline(results: dict) -> dict[str, dict[str, str]]:
    """The main figures of `score`'s results (or a scores.json) per method, as text with their
    intervals: what the page of `vit.explore(scores=...)` shows."""
    return {
        method: {name: as_text(f[key]) for key, name in HEADLINE.items() if key in f}
        for method, f in results["figures"].items()
    }
