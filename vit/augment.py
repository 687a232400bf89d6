"""Augmentation of whole batches on their device, each image drawing its own operation: random
crops of the padded images and horizontal flips (`random_crop_flip`), TrivialAugment Wide
(Müller & Hutter, 2021) and RandAugment (Cubuk et al., 2020) with torchvision's operations and
magnitudes (`torchvision.transforms.v2`), then MixUp (Zhang et al., 2018) or CutMix (Yun et al.,
2019).

Why by hand: torchvision's v2 policies draw one operation and magnitude for the whole tensor they
are given, and some of their kernels make a CUDA host wait (autocontrast indexes with a boolean
mask, the affine operations and sharpness build small tensors from Python lists; MixUp's one-hot
checks its labels' range). kornia 0.9's `kornia.augmentation.auto.TrivialAugment` draws one sub-policy per
call for the whole batch (only the magnitude per image, over RandAugment's ranges rather than the
Wide ones), though it selects images with `torch.where` blends, not boolean masks. Here every
image draws its operation, magnitude and sign on the device; every operation is computed for the
whole batch and each image keeps its own result (`torch.where`); the geometric ones are one
warp with a matrix per image. So a batch costs the same fixed sequence of kernels whatever was
drawn and whatever its size, and nothing is read back (tests/test_augment.py checks each
operation against torchvision's on single images, and that nothing would wait for a GPU).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torchvision.transforms.v2.functional import equalize

OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
       "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")  # fmt: skip
GEOMETRIC = OPS[1:6]
SIGNED = OPS[1:10]  # ShearX to Sharpness: a range of indices, so a draw tests it without a lookup table
BINS = 31  # magnitude bins, as torchvision's


def random_crop_flip(
    images: torch.Tensor, padding: int, flip: bool | torch.Tensor, padding_mode: str = "constant"
) -> torch.Tensor:
    """Per-sample random crops of the padded images and per-sample horizontal flips, as one
    gather: sample i reads rows dy_i + (0..H-1) and columns dx_i + (0..W-1), the columns
    reversed when it is mirrored: at random with `flip` True, where a (B,) bool tensor `flip` says
    (alternating flips). (B, C, H, W) of any dtype, on any device. The border is zeros, or the
    image reflected with `padding_mode="reflect"` (airbench94's translation)."""
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding,) * 4, mode=padding_mode) if padding else images
    dy = torch.randint(0, 2 * padding + 1, (b, 1), device=device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1), device=device)
    rows = dy + torch.arange(h, device=device)  # (B, H)
    cols = dx + torch.arange(w, device=device)  # (B, W)
    if torch.is_tensor(flip):
        cols = torch.where(flip[:, None], cols.flip(1), cols)
    elif flip:
        mirrored = torch.rand(b, 1, device=device) < 0.5
        cols = torch.where(mirrored, cols.flip(1), cols)
    batch = torch.arange(b, device=device)[:, None, None, None]
    channel = torch.arange(c, device=device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


@functools.cache
def magnitudes(policy: str, height: int, width: int, device: torch.device | None = None) -> torch.Tensor:
    """(len(OPS), BINS) float64: each operation's magnitude by bin, torchvision's table for
    `policy` ("trivial" or "randaugment"); 0 for operations without one. Made on `device` once
    (read only): a copy from the host's pageable memory would make a CUDA host wait."""
    wide = policy == "trivial"
    line = lambda top, start=0.0: torch.linspace(start, top, BINS, device=device)  # noqa: E731 (float32, as torchvision's)
    colour = line(0.99 if wide else 0.9)
    table = {
        "ShearX": line(0.99 if wide else 0.3),
        "ShearY": line(0.99 if wide else 0.3),
        "TranslateX": line(32.0 if wide else 150.0 / 331.0 * width),
        "TranslateY": line(32.0 if wide else 150.0 / 331.0 * height),
        "Rotate": line(135.0 if wide else 30.0),
        "Brightness": colour, "Color": colour, "Contrast": colour, "Sharpness": colour,
        "Posterize": (8 - (torch.arange(BINS, device=device) / ((BINS - 1) / (6 if wide else 4)))).round(),
        "Solarize": line(0.0, start=1.0),
    }  # fmt: skip
    return torch.stack([table.get(op, torch.zeros(BINS, device=device)).double() for op in OPS])


def draw(policy: str, batch: int, height: int, width: int, device, bin: int | None = None):
    """Each image's operation (index into OPS) and signed magnitude, drawn on `device`: the bin
    uniformly (TrivialAugment) or fixed (`bin`, RandAugment's magnitude), the sign + or - with
    equal chance for the signed operations."""
    op = torch.randint(len(OPS), (batch,), device=device)
    bins = torch.randint(BINS, (batch,), device=device) if bin is None else torch.full_like(op, bin)
    table = magnitudes(policy, height, width, device)
    signed = (op >= OPS.index(SIGNED[0])) & (op <= OPS.index(SIGNED[-1]))
    flip = signed & (torch.rand(batch, device=device) <= 0.5)
    return op, torch.where(flip, -table[op, bins], table[op, bins])


@functools.cache
def grid_constants(height: int, width: int, channels: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Made once a device, on it (read only): torchvision's pixel-centre grid (1, H, W, 3) and its
    scale (x, y), and the sharpness kernel (1s round a 5, /13)."""
    base = torch.ones(1, height, width, 3, device=device)
    base[..., 0] = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, width, device=device)
    base[..., 1] = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, height, device=device)[:, None]
    scale = torch.full((2,), 0.5 * width, device=device)
    scale[1] = 0.5 * height
    kernel = torch.ones(channels, 1, 3, 3, device=device)
    kernel[..., 1, 1] = 5.0
    return base, scale, kernel / 13.0


def trivial_augment(images: torch.Tensor) -> torch.Tensor:
    """TrivialAugment Wide: one operation and magnitude per image. uint8 (B, C, H, W) in and out."""
    op, magnitude = draw("trivial", len(images), *images.shape[-2:], images.device)
    return apply(images, op, magnitude)


def rand_augment(images: torch.Tensor, num_ops: int = 2, magnitude: int = 9) -> torch.Tensor:
    """RandAugment: `num_ops` rounds, each image drawing an operation a round, at bin `magnitude`."""
    for _ in range(num_ops):
        op, signed = draw("randaugment", len(images), *images.shape[-2:], images.device, bin=magnitude)
        images = apply(images, op, signed)
    return images


def apply(images: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Image i under operation OPS[op[i]] at `magnitude[i]` (float64), as torchvision's
    functional operation on that image alone. uint8 (B, C, H, W)."""
    chosen = lambda name: (op == OPS.index(name)).view(-1, 1, 1, 1)  # noqa: E731
    geometric = torch.zeros_like(op, dtype=torch.bool).view(-1, 1, 1, 1)
    for name in GEOMETRIC:
        geometric = geometric | chosen(name)
    out = torch.where(geometric, warp(images, inverse_affine(op, magnitude, *images.shape[-2:])), images)
    factor = (1.0 + magnitude).view(-1, 1, 1, 1)  # float64, as torchvision's Python floats
    x = images.float()
    gray = grayscale(images).floor()
    colour = {
        "Brightness": lambda: blend(x, torch.zeros_like(x), factor),
        "Color": lambda: blend(x, gray, factor) if images.shape[1] == 3 else images,
        "Contrast": lambda: blend(x, gray.mean((-3, -2, -1), keepdim=True), factor),
        "Sharpness": lambda: sharpen(x, factor),
        # the bits kept: the top `magnitude` of 8
        "Posterize": lambda: images & (256 - (1 << (8 - magnitude.long()))).to(torch.uint8).view(-1, 1, 1, 1),
        "Solarize": lambda: torch.where(x >= (255 * magnitude).float().view(-1, 1, 1, 1), ~images, images),
        "AutoContrast": lambda: autocontrast(x),
        "Equalize": lambda: equalize(images),
    }  # fmt: skip
    for name, result in colour.items():
        out = torch.where(chosen(name), result(), out)
    return out


def grayscale(images: torch.Tensor) -> torch.Tensor:
    """Luma (ITU-R 601-2, torchvision's weights) in float, (B, 1, H, W); a 1-channel image as is."""
    if images.shape[1] == 1:
        return images.float()
    r, g, b = images.unbind(dim=1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)


def blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * x + (1 - factor) * other in [0, 255], cut to uint8 (torchvision's `_blend`)."""
    # one fused multiply-add, as torchvision's `add_(other, alpha=...)`: the same roundings
    return torch.addcmul(x * factor.float(), other, (1.0 - factor).float()).clamp_(0, 255).to(torch.uint8)


def sharpen(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's sharpness: the inner pixels blended with a 3x3 smoothing (1s round a 5, /13)."""
    kernel = grid_constants(*x.shape[-2:], x.shape[1], x.device)[2]
    blurred = F.conv2d(x, kernel, groups=x.shape[1]).round_()
    out = x.clone()
    inner = out[..., 1:-1, 1:-1]
    inner.addcmul_(blurred - inner, (1.0 - factor).float())
    return out.clamp_(0, 255).to(torch.uint8)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Each channel stretched from its [min, max] to [0, 255]; a flat channel kept."""
    low, high = x.amin((-2, -1), keepdim=True), x.amax((-2, -1), keepdim=True)
    flat = high == low
    scale = torch.where(flat, 1.0, (high - low) * (1.0 / 255))
    return ((x - torch.where(flat, 0.0, low)) / scale).clamp_(0, 255).to(torch.uint8)


def inverse_affine(op: torch.Tensor, magnitude: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, 2, 3) float32: for each image the output-to-input map of its shear (about the top-left
    corner), translation (whole pixels) or rotation (about the centre) in pixel units about the
    image centre: torchvision's `_get_inverse_affine_matrix`; the identity for other operations."""
    is_ = lambda name: op == OPS.index(name)  # noqa: E731
    zero = torch.zeros_like(magnitude)
    shear_x = torch.where(is_("ShearX"), torch.atan(magnitude), zero)
    shear_y = torch.where(is_("ShearY"), torch.atan(magnitude), zero)
    rot = torch.where(is_("Rotate"), -torch.deg2rad(magnitude), zero)  # F.rotate passes -angle
    tx = torch.where(is_("TranslateX"), magnitude.trunc(), zero)
    ty = torch.where(is_("TranslateY"), magnitude.trunc(), zero)
    shear = is_("ShearX") | is_("ShearY")
    cx, cy = torch.where(shear, -width / 2, zero), torch.where(shear, -height / 2, zero)
    a = torch.cos(rot - shear_y) / torch.cos(shear_y)
    b = -torch.cos(rot - shear_y) * torch.tan(shear_x) / torch.cos(shear_y) - torch.sin(rot)
    c = torch.sin(rot - shear_y) / torch.cos(shear_y)
    d = -torch.sin(rot - shear_y) * torch.tan(shear_x) / torch.cos(shear_y) + torch.cos(rot)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = m0 * (-cx - tx) + m1 * (-cy - ty) + cx
    m5 = m3 * (-cx - tx) + m4 * (-cy - ty) + cy
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=-1).view(-1, 2, 3).float()


def warp(images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """uint8 images sampled (nearest, zeros outside) at theta's map of each output pixel centre,
    as torchvision's `_affine_grid` and `_apply_grid_transform` do for one image."""
    height, width = images.shape[-2:]
    base, scale, _ = grid_constants(height, width, images.shape[1], images.device)
    grid = base.view(1, -1, 3).expand(len(images), -1, -1).bmm(theta.transpose(1, 2) / scale)
    sampled = F.grid_sample(images.float(), grid.view(-1, height, width, 2), mode="nearest",
                            padding_mode="zeros", align_corners=False)  # fmt: skip
    return sampled.round_().to(torch.uint8)


def mix(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, mixup_alpha: float, cutmix_alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp or CutMix (one of the two, at random, when both alphas are above 0) of float images
    (B, C, H, W) with the batch rolled by one, as torchvision's v2.MixUp and v2.CutMix: the labels
    become class probabilities (B, num_classes). The mixing weight and the box are drawn on the
    host (a number drawn there makes no wait); the one-hot labels are a scatter on the device."""
    kinds = [kind for kind, alpha in (("mixup", mixup_alpha), ("cutmix", cutmix_alpha)) if alpha > 0]
    if not kinds:
        return images, labels
    kind = kinds[int(torch.randint(len(kinds), ()))]
    alpha = mixup_alpha if kind == "mixup" else cutmix_alpha
    lam = float(torch.distributions.Beta(alpha, alpha).sample(()))
    one_hot = torch.zeros(len(labels), num_classes, device=labels.device).scatter_(1, labels[:, None], 1.0)
    rolled = images.roll(1, 0)
    if kind == "mixup":
        images = rolled.mul(1.0 - lam).add_(images.mul(lam))
    else:
        height, width = images.shape[-2:]
        x, y = int(torch.randint(width, ())), int(torch.randint(height, ()))
        half = 0.5 * math.sqrt(1.0 - lam)
        x1, x2 = max(x - int(half * width), 0), min(x + int(half * width), width)
        y1, y2 = max(y - int(half * height), 0), min(y + int(half * height), height)
        images = images.clone()
        images[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (width * height)
    return images, one_hot.roll(1, 0).mul_(1.0 - lam).add_(one_hot.mul(lam))


POLICIES = {"trivial": trivial_augment, "randaugment": rand_augment}
