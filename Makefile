# `make demo` and `make test` set themselves up: they create .venv and install vit into it
# the first time (and again when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := runs/demo

.PHONY: demo test lint notebooks mutate clean gpu-prepare gpu-check

$(VENV)/installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,interop,tensorboard,stream,mlflow]"
	touch $@

# Train a ViT on two circles, evaluate its best checkpoint on the test split, draw its attention.
demo: $(VENV)/installed
	@start=$$(date +%s); set -e; rm -rf $(DEMO); \
	$(BIN)/vit-train fit --config configs/two_circles.yaml \
	  --trainer.logger.init_args.name demo --trainer.logger.init_args.version train; \
	$(BIN)/vit-eval --ckpt $(DEMO)/train/checkpoints/best.ckpt --out $(DEMO)/eval; \
	$(BIN)/vit-attention --ckpt $(DEMO)/train/checkpoints/best.ckpt --out $(DEMO)/attention --method rollout; \
	echo "demo finished in $$(( $$(date +%s) - start )) s: run in $(DEMO)/train, evaluation in $(DEMO)/eval, overlays in $(DEMO)/attention"

# Run the four notebooks at their full size and store them with their outputs, so that a reader on
# a code host sees the figures (the tests run them small). A few minutes on 2 CPU cores.
notebooks: $(VENV)/installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[notebooks]"
	@start=$$(date +%s); set -e; cd notebooks; for nb in *.ipynb; do \
	  ../$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.timeout=3600 "$$nb"; \
	done; rm -rf runs lightning_logs; \
	echo "notebooks executed and stored with their outputs in $$(( $$(date +%s) - start )) s"

# Mutation testing of the looking-inside maths (vit/interpret/), the streamed chunks (vit/chunk_*.py, vit/streaming.py),
# image preparation (vit/preparation.py) and the reading of training curves (vit/curves.py); the configuration is [tool.mutmut] in pyproject.toml and
# docs/mutation.md has the runs: every mutant should fail a test. Not part of make test: more than 10
# minutes on 2 cores. One thread per worker: a forked PyTorch would hang in OpenMP.
# `make mutate MUTANTS="vit.interpret.stats*"` runs a subset.
mutate: $(VENV)/installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[mutate]"
	rm -rf mutants
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/mutmut results

lint: $(VENV)/installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest

# The GPU check (benchmarks/gpu_check.py, docs/gpu/NOTES.md). A GPU machine that gets only this working
# tree: `make gpu-prepare` here puts what it lacks into .gpu/ (the wheels of the packages its image
# lacks, CIFAR-10's JPEG bytes in one file); there, `make gpu-check` installs those wheels and runs the
# check, about 8 minutes on an H100. On a GPU machine of your own with vit installed, set GPU_DATA to
# your CIFAR-10 (torchvision's copy or image folders).
GPU_WHEELS := jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 vit-pytorch==1.26.11
CIFAR10_JPEG ?= ../shared/data/cifar10-jpeg
GPU_DATA ?= .gpu/cifar10-jpeg.pack
GPU_OUT ?= runs/gpu_check
GPU_REPORT ?= $(GPU_OUT)
GPU_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-prepare: $(VENV)/installed
	mkdir -p .gpu/wheels
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .gpu/wheels $(GPU_WHEELS)
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps -w .gpu/wheels airbench==0.1.8
	$(BIN)/python lab/cifar10_pack.py pack $(CIFAR10_JPEG) .gpu/cifar10-jpeg.pack
	du -sh .gpu

gpu-check:
	@if ls .gpu/wheels/*.whl >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -m pip install --quiet --no-index --no-deps --no-compile --target .gpu/site .gpu/wheels/*.whl; fi
	PYTHONPATH=$$PWD/.gpu/site:$$PWD $(GPU_PYTHON) benchmarks/gpu_check.py --data $(GPU_DATA) \
	  --out $(GPU_OUT) --report $(GPU_REPORT) --deadline 540

clean:
	rm -rf $(VENV) runs
