# `make demo` and `make test` set themselves up: they create .venv and install vit into it
# the first time (and again when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := runs/demo

.PHONY: demo test lint notebooks clean

$(VENV)/installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,interop]"
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

lint: $(VENV)/installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest

clean:
	rm -rf $(VENV) runs
