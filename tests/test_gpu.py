"""The same model on a GPU as on the CPU: the fused and explicit attention agree there, a
training step runs, and vit-eval, the attention maps, vit-attention and vit-attention score give
the CPU's results. Marked `gpu` and skipped without CUDA; `make gpu-check` runs them (`pytest -m gpu`).

Tolerances, stated once: fp32 on the GPU with TF32 off agrees with the CPU to about 1e-5 in
logits; bf16 keeps 8 bits of mantissa, so bf16 attention agrees with fp32 to about 2e-2.
"""

from __future__ import annotations

import contextlib
import json
import math
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

from vit import ViT
from vit.commands import eval as eval_command
from vit.commands import score as score_command
from vit.interpret.maps import MAP_METHODS, MapSpec, explain

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)"),
]
FP32 = dict(atol=1e-4, rtol=1e-4)  # logits of a tiny model, GPU (TF32 off) against the CPU
BF16 = dict(atol=3e-2, rtol=3e-2)  # bf16 attention against fp32


@contextlib.contextmanager
def synchronisations():
    """The calls that made the host wait for the GPU inside, once a test sets torch's
    synchronisation debug mode to "warn" (from the step it watches): each as the two innermost
    frames of this project, torchvision or Lightning that made it. The mode is reset on the way out."""
    syncs = []

    def note(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" in str(message):  # not the notice that the mode is a prototype
            frames = traceback.extract_stack()[:-1]
            ours = [f for f in frames if any(k in f.filename for k in ("vit/", "torchvision/", "lightning/"))]
            where = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in ours[::-1][:2]]
            syncs.append(" <- ".join(where))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            yield syncs
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")


@pytest.fixture(autouse=True)
def no_tf32():
    """Exact fp32 matmuls on the GPU (what this module compares with the CPU)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("locality", [False, True])
def test_fused_and_explicit_attention_agree_on_the_gpu(dtype, locality):
    torch.manual_seed(0)
    explicit = ViT(preset="mini", image_size=32, patch_size=4, fused_attn=False, locality_attention=locality)
    fused = ViT(preset="mini", image_size=32, patch_size=4, fused_attn=True, locality_attention=locality)
    fused.load_state_dict(explicit.state_dict())
    x = torch.randn(8, 3, 32, 32, device="cuda")
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        a = explicit.cuda().eval()(x).float()
        b = fused.cuda().eval()(x).float()
    torch.testing.assert_close(a, b, **(FP32 if dtype == torch.float32 else BF16))


def test_the_gpu_gives_the_cpus_logits():
    torch.manual_seed(0)
    model = ViT(
        preset="mini", image_size=32, patch_size=4, conv_stem=[16, 32], conv_stem_strides=[1, 2]
    ).eval()
    x = torch.randn(4, 3, 32, 32)
    cpu = model(x)
    gpu = model.cuda()(x.cuda().contiguous(memory_format=torch.channels_last)).cpu()
    torch.testing.assert_close(gpu, cpu, **FP32)


def test_a_training_step_on_the_gpu_lowers_the_loss_in_bf16():
    torch.manual_seed(0)
    model = ViT(preset="mini", image_size=32, patch_size=4).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 3, 32, 32, device="cuda"), torch.randint(10, (32,), device="cuda")
    losses = []
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert all(p.device.type == "cuda" for p in model.parameters())


def test_vit_eval_on_the_gpu_gives_the_cpus_figures(trained_checkpoint, tmp_path):
    figures = {}
    for device in ("cpu", "cuda"):
        eval_command.main(
            ["--ckpt", str(trained_checkpoint), "--out", str(tmp_path / device), "--device", device]
        )
        figures[device] = json.loads((tmp_path / device / "metrics.json").read_text())
    assert figures["cuda"]["top1"] == pytest.approx(figures["cpu"]["top1"], abs=1e-6)
    assert figures["cuda"]["ece"] == pytest.approx(figures["cpu"]["ece"], abs=1e-4)


@pytest.mark.parametrize("method", sorted(MAP_METHODS))
def test_every_attention_map_on_the_gpu_equals_the_cpus(trained, method):
    model, data = trained
    images = data.splits["test"].images[:8]
    query = (1, 2) if method == "query" else None
    spec = MapSpec(method, query_patch=query)
    cpu = explain(model.model, images, spec)
    gpu_model = model.model.cuda()
    try:
        gpu = explain(gpu_model, images.cuda(), spec)
    finally:
        model.model.cpu()
    torch.testing.assert_close(gpu.maps.cpu(), cpu.maps, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, **FP32)


def test_the_attention_page_is_written_on_the_gpu_machine(trained_checkpoint, tmp_path):
    from vit.commands import attention

    attention.main(["--ckpt", str(trained_checkpoint), "--html", "--out", str(tmp_path), "--num_images", "4"])
    page = next(tmp_path.glob("*.html"))
    assert page.stat().st_size > 10_000


def test_vit_attention_score_on_the_gpu_gives_the_cpus_figures(trained_checkpoint, tmp_path):
    scores = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        score_command.COMMAND.main(
            ["--ckpt", str(trained_checkpoint), "--num_images", "32", "--out", str(out), "--device", device]
        )
        scores[device] = json.loads((out / "scores.json").read_text())
    assert_close_tree(scores["cuda"]["figures"], scores["cpu"]["figures"], tolerance=0.02)


def assert_close_tree(a, b, tolerance: float, path: str = "") -> None:
    """Every number of `a` within `tolerance` of `b`'s at the same place (NaN where NaN)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_close_tree(a[key], b[key], tolerance, f"{path}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close_tree(x, y, tolerance, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance, f"{path}: {a} vs {b}"
    else:
        assert a == b, path


def test_training_steps_do_not_wait_for_the_gpu(tmp_path):
    """From the 3rd to the 10th step of a fit on the GPU (the data held there, augmented and mixed
    there, an EMA of the weights, bf16, logging every 50 steps) nothing waits for the GPU: torch's
    synchronisation debug mode reports no synchronising call. A failure lists each call with the
    two innermost frames of this project, torchvision or Lightning that made it."""

    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from lab.cifar10_pack import fake_cifar10
    from vit import ViTClassifier, ViTConfig
    from vit.callbacks import EMA, ProgressBar
    from vit.datamodules import CIFAR10

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 2:
                torch.cuda.set_sync_debug_mode("warn")
            elif batch_idx == 10:
                torch.cuda.set_sync_debug_mode("default")

    data = CIFAR10(root=str(fake_cifar10(tmp_path / "data", per_class=32)), val_size=32, batch_size=16,
                   policy="trivial", mixup_alpha=0.8, cutmix_alpha=1.0)  # fmt: skip
    vit = ViTConfig(preset="micro", patch_size=4, conv_stem=[8], conv_stem_strides=[1])
    model = ViTClassifier(vit=vit, decay="linear")
    trainer = L.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=12, log_every_n_steps=50,
        callbacks=[Watch(), EMA(decay=0.99), ProgressBar(refresh_rate=50)], logger=False,
        enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )  # fmt: skip
    with synchronisations() as syncs:
        trainer.fit(model, data)
    assert data.splits["train"].images.is_cuda  # held on the GPU
    print("\n".join(sorted(set(syncs))))  # whole: pytest shortens a long assertion message
    assert not syncs, sorted(set(syncs))


@pytest.mark.parametrize("method", ["query", "grad-rollout"])
def test_vit_attention_on_the_gpu_draws_the_cpus_maps(trained_checkpoint, tmp_path, monkeypatch, method):
    """`vit-attention --device cuda` computes the maps there (and Figure 7) and draws what
    `--device cpu` draws, within the tolerance of the maps above."""
    import vit.interpret.figures
    from vit.commands import attention

    drawn = {}
    batch_figure = vit.interpret.figures.batch_figure

    def spy(images, maps, *args, **kwargs):
        drawn[device] = maps
        return batch_figure(images, maps, *args, **kwargs)

    monkeypatch.setattr(vit.interpret.figures, "batch_figure", spy)  # the command imports it when it runs
    query = ["--query-patch", "1,2"] if method == "query" else []
    for device in ("cpu", "cuda"):
        attention.main(
            ["--ckpt", str(trained_checkpoint), "--num_images", "8", "--method", method, *query, "--plots",
             "--device", device, "--out", str(tmp_path / device)]
        )  # fmt: skip
    assert drawn["cuda"].device.type == "cpu"  # drawn from the CPU
    torch.testing.assert_close(drawn["cuda"], drawn["cpu"], atol=1e-4, rtol=1e-3)
    assert {p.name for p in (tmp_path / "cuda").iterdir()} == {p.name for p in (tmp_path / "cpu").iterdir()}


def captured_fit(tmp_path, capture: bool, accelerator: str = "gpu", watch_from: int | None = None):
    """A fit of 12 steps with nothing drawn at random but the batch order (no crops, flips or drop
    path: inductor's random numbers are not eager's), fp32, an EMA; with `watch_from`, torch's
    synchronisation debug mode from that step on. Returns the model, trainer and the syncs seen."""

    import lightning as L
    from lightning.pytorch.callbacks import Callback

    from lab.cifar10_pack import fake_cifar10
    from vit import ViTClassifier, ViTConfig
    from vit.callbacks import EMA
    from vit.datamodules import CIFAR10

    graphs = []  # graphs Dynamo compiled so far, before the first step and after the last

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
            if watch_from is not None and batch_idx == watch_from:
                torch.cuda.set_sync_debug_mode("warn")

        def on_train_end(self, trainer, pl_module):
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])

    L.seed_everything(0)
    data = CIFAR10(root=str(fake_cifar10(tmp_path / "data", per_class=32)), val_size=32, batch_size=16,
                   crop_padding=0, flip=False, policy="none")  # fmt: skip
    vit = ViTConfig(preset="micro", patch_size=4, conv_stem=[8], conv_stem_strides=[1])
    mode = "reduce-overhead" if capture else False
    model = ViTClassifier(vit=vit, decay="linear", compile=mode, capture_step=capture)
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, max_steps=12, log_every_n_steps=50, logger=False,
        callbacks=[Watch(), EMA(decay=0.9)], enable_checkpointing=False, enable_progress_bar=False,
        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    with synchronisations() as syncs:
        trainer.fit(model, data)
    return model, trainer, syncs, graphs


def test_the_captured_step_replays_on_the_gpu_and_trains_as_the_eager_step(tmp_path):
    """`capture_step` with `reduce-overhead`: compiled once, before the clock, and replayed as a
    CUDA graph; from the 3rd step on nothing waits for the GPU; after 12 steps the weights are the
    eager loop's (fp32, TF32 off; Adam turns rounding differences of 1e-7 into about 1e-5)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    captured, trainer, syncs, graphs = captured_fit(tmp_path / "a", capture=True, watch_from=2)
    assert trainer.global_step == 12
    print("\n".join(sorted(set(syncs))))
    assert not syncs, sorted(set(syncs))
    assert graphs[0] > 0 and graphs[0] == graphs[-1]  # all compiled before the first step
    # the step replays as a CUDA graph (cudagraph trees skip a graph that mutates inputs whose
    # addresses may move: the optimizer's state and the EMA's are marked as staying)
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    eager = captured_fit(tmp_path / "b", capture=False)[0]
    weights = zip(captured.model.state_dict().items(), eager.model.state_dict().values(), strict=True)
    for (name, a), b in weights:
        if name.endswith("qkv.bias"):  # the key bias's gradient is rounding noise, which Adam scales up
            a, b = a.view(3, -1)[[0, 2]], b.view(3, -1)[[0, 2]]
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=lambda m, name=name: f"{name}: {m}")
