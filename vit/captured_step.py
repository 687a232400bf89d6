"""Compiling a classifier before the training clock starts, and its whole training step as one
compiled graph.

`compile_training` compiles a classifier's network in place and runs it once as training and
validation will (`compile_now`), so that a time budget buys steps, not compilation; with
`capture_step`, it captures the step too. A captured step (`CapturedStep`, made and compiled by
`capture`) is the whole training step: augmentation of the batch on its device, forward, loss,
backward, the optimizer's update and the EMA's, traced once by `torch.compile` (fullgraph) and
replayed, so that a step launches no kernel from Python (with `reduce-overhead`, one CUDA graph a
step). `check_compile` refuses, in one line, a classifier's options that cannot go together.

The eager step (`Classifier.training_step` with Lightning's automatic optimisation) is the one
to read; this one computes the same thing in a form a compiler can take whole:
- the gradients come from `torch.autograd.grad` (traced by Dynamo's `trace_autograd_ops`), not
  `.backward()` into `.grad`: the optimizer's `step()` breaks the graph on purpose (its
  `_use_grad` decorator) and on any pending `.grad` write;
- the update is the functional form of the optimizer's algorithm (torch's `adam`, and
  `vit.optim.muon`, which `vit.optim.Muon` steps with) on the optimizer's state tensors, so
  checkpoints hold the same optimizer state as an eager run's;
- the learning rate is a tensor in each param group, which the scheduler fills in place
  (`LRScheduler` does so for tensors), and the EMA's step count a tensor: neither recompiles;
- the random draws (crops, flips, the policy's operations, drop path) happen inside the graph.
Lightning keeps the loop, logging, clock and checkpoints (manual optimisation).
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings

import lightning as L
import torch
from torch.optim.adam import adam

from vit.callbacks import EMA
from vit.errors import UsageError, require
from vit.optim import muon, muon_options
from vit.preparation import for_the_device

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def optimizers_of(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind `optimizer`: itself, or a composite's (`.optimizers`)."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    for each in optimizers_of(optimizer):
        if not (isinstance(each, torch.optim.Adam) or type(each).__name__ == "Muon"):  # AdamW is an Adam
            raise UsageError(f"the captured step updates with AdamW or Muon, not {type(each).__name__}")
        for group in each.param_groups:
            if not torch.is_tensor(group["lr"]):
                raise UsageError("the captured step needs each param group's lr as a tensor (tensor_lr)")


def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Each parameter's optimizer state where it has none yet, as the optimizer's first step would
    make it (zeros; Adam's step count a float32 tensor on the parameter's device, as `capturable`)."""
    for each in optimizers_of(optimizer):
        for group in each.param_groups:
            for p in group["params"]:
                state = each.state[p]
                if state:
                    continue
                if type(each).__name__ == "Muon":
                    state["momentum_buffer"] = torch.zeros_like(p)
                else:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)


def update(optimizer: torch.optim.Optimizer, grads: dict[torch.Tensor, torch.Tensor]) -> None:
    """`optimizer`'s step with `grads` (by parameter), through torch's functional algorithms on
    the optimizer's own state and param groups (lr a tensor)."""
    for each in optimizers_of(optimizer):
        for group in each.param_groups:
            params = group["params"]
            state = [each.state[p] for p in params]
            if type(each).__name__ == "Muon":  # torch >= 2.9
                buffers = [s["momentum_buffer"] for s in state]
                muon(params, [grads[p] for p in params], buffers, **muon_options(each, group))
                continue
            beta1, beta2 = group["betas"]
            adam(
                params, [grads[p] for p in params], [s["exp_avg"] for s in state],
                [s["exp_avg_sq"] for s in state], [], [s["step"] for s in state],
                foreach=True, capturable=True, differentiable=False, fused=None, grad_scale=None,
                found_inf=None, has_complex=False, amsgrad=False, beta1=beta1, beta2=beta2,
                lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=False, decoupled_weight_decay=group.get("decoupled_weight_decay", False),
            )  # fmt: skip


@contextlib.contextmanager
def tracing():
    """Dynamo's settings for tracing the whole step: the backward inside the graph (Dynamo traces
    `autograd.grad` only with `trace_autograd_ops`); augmentation's constants, which
    `vit.augment`'s `functools.cache` functions make once a device in eager runs, are made inside
    the graph, without Dynamo's warning that it traces through the cache."""
    with torch._dynamo.config.patch(trace_autograd_ops=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools.lru_cache`")
        yield


class CapturedStep:
    """One training step of `classifier` on a uint8 batch, compiled whole in `mode` on its first
    call: `step(images, labels)` returns the loss (on the device, not read back) and the logits.
    `datamodule` augments the batch in it (its `augment`: uint8 batch -> float images and labels);
    `ema` is a `vit.callbacks.EMA` whose average this step updates, or None. Neither does that job
    of its own while the step has taken it over (`take_over`, `give_back`)."""

    def __init__(self, classifier, optimizer, datamodule, ema=None, mode: str = "default"):
        check_optimizer(optimizer)
        self.classifier, self.optimizer, self.datamodule, self.ema = classifier, optimizer, datamodule, ema
        self.augment = datamodule.augment
        self.params = [p for p in classifier.model.parameters() if p.requires_grad]
        init_state(optimizer)
        self.average = None
        if ema is not None:  # the EMA's tensors: those averaged and the counters it copies
            averages, _, counters, _ = ema.pairs(classifier)
            self.average = (averages, counters)
            # the EMA's step count on the device: the decay's warm-up reads it without a recompile
            self.ema_step = torch.tensor(float(classifier.trainer.global_step), device=self.params[0].device)
        # CUDA graphs replay at fixed addresses: the state a step updates in place is marked as
        # staying where it is, or cudagraph trees skip a graph whose inputs it mutates
        rates = [group["lr"] for each in optimizers_of(optimizer) for group in each.param_groups]
        for t in [*self.tensors(), *rates]:
            torch._dynamo.mark_static_address(t)
        self.compiled = torch.compile(self.step, mode=mode, fullgraph=True)

    def step(self, images: torch.Tensor, labels: torch.Tensor, *rest) -> tuple[torch.Tensor, ...]:
        x, y = self.augment(images, labels, *rest)  # rest: the batch's indices (alternating flips)
        logits, loss = self.classifier.loss(x, y)
        grads = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            update(self.optimizer, dict(zip(self.params, grads, strict=True)))
            if self.average is not None:
                self.ema_step += 1
                # the network's tensors read here, not through the detached aliases the EMA
                # callback keeps: inductor takes those for other tensors and reads them wrong
                averages, counters = self.average
                module = self.classifier
                network = [t.detach() for t in itertools.chain(module.parameters(), module.buffers())]
                currents = [t for t in network if t.is_floating_point()]
                followed = [t for t in network if not t.is_floating_point()]
                self.ema.update((averages, currents, counters, followed), self.ema.weight(self.ema_step))
        return loss.detach(), logits.detach()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, *rest) -> tuple[torch.Tensor, ...]:
        with tracing():
            return self.compiled(images, labels, *rest)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step changes: weights, buffers, optimizer state, the EMA's average."""
        module = self.classifier.model
        found = [*module.parameters(), *module.buffers()]
        for each in optimizers_of(self.optimizer):
            found += [t for state in each.state.values() for t in state.values() if torch.is_tensor(t)]
        if self.average is not None:
            found += [*self.average[0], *self.average[1], self.ema_step]
        return found

    def start_at(self, step: int) -> None:
        """Training starts (or resumes) after optimizer step `step`: the EMA's count of steps."""
        if self.average is not None:
            self.ema_step.fill_(step)

    @contextlib.contextmanager
    def counted(self, optimizer, scheduler):
        """Lightning's count of an optimizer step (`global_step`) around this step, which updates
        the weights itself: the hooks around Lightning's optimizer wrapper's `step()`, not the
        call, which would run the optimizer's own update; then the scheduler's step (it fills the
        lr tensors in place)."""
        optimizer._on_before_step()
        yield
        optimizer._on_after_step()
        scheduler.step()

    def take_over(self) -> None:
        """Tell the data module that this step augments its raw batches, and the EMA callback that
        this step updates its average: each reads its own flag (`step_augments`, `step_updates`)."""
        self.datamodule.step_augments = True
        if self.ema is not None:
            self.ema.step_updates = True

    def give_back(self) -> None:
        """The data module augments its batches and the EMA updates its average again, as they do
        for an eager step (a later fit of theirs may have one)."""
        self.datamodule.step_augments = False
        if self.ema is not None:
            self.ema.step_updates = False

    @contextlib.contextmanager
    def undone(self):
        """Whatever steps run inside leave every tensor a step changes as it was (in place: the
        same tensors, so a compiled graph's inputs stay where they are)."""
        tensors = self.tensors()
        saved = [t.detach().clone() for t in tensors]
        try:
            yield
        finally:
            with torch.no_grad():
                for t, s in zip(tensors, saved, strict=True):
                    t.copy_(s)


def check_compile(compile: bool | str, captured: bool, optimizer: str) -> None:
    """A classifier's `compile` (true, false or a mode of `COMPILE_MODES`) and its captured step
    refused in one line where they cannot be: a step captured without compiling, with an
    optimizer `update` does not know, or by a torch whose Dynamo cannot trace the backward."""
    require(not captured or optimizer != "sgd", "capture_step goes with optimizer=adamw or muon")
    # a feature of recent torch releases (this project is tested with 2.14)
    require(
        not captured or hasattr(torch._dynamo.config, "trace_autograd_ops"),
        "capture_step needs a torch whose Dynamo traces autograd.grad (trace_autograd_ops)",
    )
    require(
        compile in (False, True, *COMPILE_MODES),
        f"compile={compile!r} must be true, false or a mode: {', '.join(COMPILE_MODES)}",
    )
    require(not captured or compile, "capture_step compiles the step: set compile (true or a mode)")


def capture(classifier: L.LightningModule, mode: str) -> CapturedStep:
    """The captured training step of a `vit.classifier.Classifier`, compiled here, before the training
    clock starts, on a batch whose step is undone (weights, buffers, optimizer state, the
    EMA's average and the random state as they were)."""
    trainer, datamodule = classifier.trainer, classifier.trainer.datamodule
    if trainer.world_size > 1:
        raise UsageError("capture_step trains one process: its gradients skip DDP's all-reduce")
    if not hasattr(datamodule, "augment"):
        raise UsageError(f"capture_step augments in the step: {type(datamodule).__name__} has no augment()")
    if getattr(datamodule, "mixup_alpha", 0) or getattr(datamodule, "cutmix_alpha", 0):
        raise UsageError("capture_step draws on the device; MixUp and CutMix draw on the host: turn them off")
    ema = next((c for c in trainer.callbacks if isinstance(c, EMA)), None)
    optimizer = trainer.optimizers[0]
    step = CapturedStep(classifier, optimizer, datamodule, ema, mode)
    # the scheduler warns that it steps before the optimizer where optimizer.step() is never
    # called; the captured step updates before each scheduler step
    optimizer._opt_called = True
    start = time.perf_counter()
    # the first batch as the training loader makes it (images, labels and what else it carries)
    first = datamodule.training_data().__getitems__(range(datamodule.batch_size))
    batch = [t.to(classifier.device) for t in first]
    devices = [classifier.device] if classifier.device.type == "cuda" else []
    with torch.random.fork_rng(devices), step.undone(), trainer.precision_plugin.train_step_context():
        for _ in range(3):  # CUDA graphs record at the second call and replay from the third
            step(*batch)
    seconds = time.perf_counter() - start
    print(f"captured the training step in {seconds:.1f} s, before the training clock starts")
    if classifier.logger is not None:
        classifier.logger.log_metrics({"time/capture_seconds": seconds}, step=0)
    step.take_over()
    return step


def compile_now(classifier: L.LightningModule) -> None:
    """Run a classifier's compiled network once as training will (forward and backward of a
    batch, in the trainer's precision) and as validation will (a full batch and the last, shorter
    one), on random images, so that compilation happens here, before the training clock
    (Lightning's Timer) starts: a time budget then buys steps, not compilation. Weights, buffers
    (BatchNorm's statistics) and gradients are left as they were; the seconds are printed and
    logged as `time/compile_seconds`. The random state is left as it was too."""
    network, trainer, hparams = classifier.model, classifier.trainer, classifier.hparams
    datamodule = trainer.datamodule
    size, channels = hparams.get("image_size"), hparams.get("in_channels")
    if datamodule is None or size is None or channels is None:
        return
    height, width = (size, size) if isinstance(size, int) else size
    start = time.perf_counter()
    buffers = [b.clone() for b in network.buffers()]
    batch = datamodule.batch_size
    val = len(datamodule.split("val"))
    devices = [classifier.device] if classifier.device.type == "cuda" else []
    # the random state forked: a compiled run draws what an eager one with the same seed draws
    with torch.random.fork_rng(devices), trainer.precision_plugin.forward_context():
        images = for_the_device(torch.rand(batch, channels, height, width, device=classifier.device), network)
        network.train()
        network(images).float().sum().backward()
        network.eval()
        with torch.inference_mode():
            for n in {min(batch, val), val % batch} - {0}:
                network(images[:n].clone())
    network.train()
    network.zero_grad(set_to_none=True)
    with torch.no_grad():
        for saved, buffer in zip(buffers, network.buffers(), strict=True):
            buffer.copy_(saved)
    seconds = time.perf_counter() - start
    print(f"compiled in {seconds:.1f} s, before the training clock starts")
    if classifier.logger is not None:
        classifier.logger.log_metrics({"time/compile_seconds": seconds}, step=0)


def cpu_compiler() -> str | None:
    """The C++ compiler inductor writes a CPU's kernels for (g++, clang++ or $CXX), or None."""
    from torch._inductor import cpp_builder

    try:
        return cpp_builder.get_cpp_compiler()
    except Exception:  # inductor's InvalidCxxCompiler, or a compiler that does not run
        return None


def compile_training(
    classifier: L.LightningModule, compile: bool | str, captured: bool
) -> CapturedStep | None:
    """A classifier's network compiled in place in `compile`'s mode (true: torch's default) and
    run once before the training clock starts (`compile_now`); where `captured`, its whole training
    step too, which is returned (`capture`: it takes over the data module's augmentation and the
    EMA's update until `give_back`)."""
    # in place: parameter names and checkpoints stay the eager network's; it stays compiled
    # in this process (vit-eval and vit-attention rebuild it eagerly)
    mode = "default" if compile is True else compile
    classifier.model.compile(mode=mode)
    compile_now(classifier)
    return capture(classifier, mode) if captured else None
