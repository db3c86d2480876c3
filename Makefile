# The README's two commands. Each first runs tools/setup_env.sh, which creates/uses .venv (or the
# active virtualenv) and installs whatever is missing.
PY := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,$(CURDIR)/.venv/bin/python)
DEMO_CFG := configs/demo/mask_rcnn_xcit_nano_12_p8_shapes.py
DEMO_DIR := work_dirs/demo

.PHONY: setup demo test lint

setup:
	bash tools/setup_env.sh

# Generate the embedded demo data, train an XCiT Mask R-CNN on it, evaluate COCO bbox/segm mAP on
# the held-out split and draw its predictions into $(DEMO_DIR)/vis.
demo: setup
	$(PY) tools/make_demo_data.py data/shapes
	$(PY) tools/train.py $(DEMO_CFG) --work-dir $(DEMO_DIR)
	$(PY) tools/test.py $(DEMO_CFG) $$(cat $(DEMO_DIR)/last_checkpoint) --work-dir $(DEMO_DIR) --show-dir vis

lint: setup
	$(PY) -m ruff check deepvit_mm tools tests configs demo

test: setup lint
	$(PY) -m pytest -q tests
