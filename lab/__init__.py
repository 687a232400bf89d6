"""What the script folders share. benchmarks/, studies/ and tools/ each hold scripts that run on
their own; they import from `vit`, from this package and from installed libraries, never from one
another, so that a script can move or go without breaking another folder's.

- `machine`: the name of the CPU or GPU a figure was measured on;
- `peers`: the `cifar` model size and the other libraries' ViTs (timm, vit-pytorch) built to it;
- `cifar10_pack`: CIFAR-10's image folders as one file, for a GPU machine that gets only the working
  tree (`make gpu-prepare` packs, `benchmarks/gpu_check.py` unpacks).
"""
