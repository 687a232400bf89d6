"""Memory a training step frees is kept for the next (`vit.memory.keep_freed_memory`): after the
first steps, a step takes no page from the system. Each case runs in a fresh process: the setting
is the process's, and glibc's own thresholds move as memory is freed."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from vit.memory import keep_freed_memory

STEPS = """
import resource, sys
import torch
import torch.nn.functional as F
from vit.memory import keep_freed_memory
from vit.model import ViT

if sys.argv[1] == "kept":
    assert keep_freed_memory()
torch.manual_seed(0)
model = ViT(preset="cifar", depth=2, image_size=32, patch_size=4, num_classes=10)
optimizer = torch.optim.AdamW(model.parameters())
images, labels = torch.randn(64, 3, 32, 32), torch.randint(10, (64,))

def step():
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

for _ in range(3):  # the optimizer's state, and the heap grown to the step's size
    step()
for _ in range(7):  # each step's faults
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults_a_step(allocator: str) -> float:
    """The median of 7 steps' minor page faults: now and then a step still grows the heap a
    little (780-5,600 faults, one step in about ten here), the others take none."""
    run = subprocess.run(
        [sys.executable, "-c", STEPS, allocator], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return statistics.median(float(line) for line in run.stdout.split())


@pytest.mark.slow  # two processes that import torch: about 7 s
@pytest.mark.skipif(not keep_freed_memory(), reason="glibc's malloc only")
def test_a_step_takes_no_page_from_the_system_once_freed_memory_is_kept():
    kept, system = page_faults_a_step("kept"), page_faults_a_step("system")
    assert system > 1000  # glibc's defaults hand the step's activations back and fault them in again
    assert kept < 100  # 0 on an Intel Xeon (family 6, model 167); 11,700 with the defaults


def test_keeping_freed_memory_is_done_once_and_said():
    assert keep_freed_memory() is keep_freed_memory()  # cached: mallopt is called once a process
