# The README's two commands. Each first runs tools/setup_env.sh, which creates/uses the stack's
# virtualenv (or the active one) and installs whatever is missing. STACK=newest (default, .venv) or
# STACK=torch2.1 (numpy < 2, .venv-torch2.1): the two stacks CI tests (deepvit_mm/version.py's
# TESTED has their versions).
# PYTHON: the interpreter the virtualenv is made with (`make setup PYTHON=python3.12`; default
# python3, or the virtualenv's own once made); each stack takes the Pythons of version.py's PYTHONS.
STACK ?= newest
VENV := $(if $(filter torch2.1,$(STACK)),.venv-torch2.1,.venv)
PY := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,$(CURDIR)/$(VENV)/bin/python)
DEMO_CFG := configs/demo/mask_rcnn_xcit_nano_12_p8_shapes_cpu.py
DEMO_DIR := work_dirs/demo

.PHONY: setup demo test test-fast test-avx2 lint

setup:
	STACK=$(STACK) PYTHON=$(PYTHON) bash tools/setup_env.sh

# Generate the embedded demo data, train an XCiT Mask R-CNN on it (evaluating the held-out split
# after every DEMO_VAL iterations, logged at that iteration: the mAP curve), evaluate COCO bbox/segm
# mAP on the held-out split, draw its predictions into $(DEMO_DIR)/<timestamp>/vis, the feature
# maps of DEMO_FEATMAP_IMAGES held-out images into featmaps/ and the training curves into
# curves.png beside it (docs/visualization.md), and say where.
# OpenMP's wait policy is left as it is (its threads spin a while between parallel regions):
# sleeping at once slows the demo's step (docs/training.md#threads-and-openmps-wait-policy has
# the measurement).
# DEMO_VAL: iterations between the held-out evaluations during training (the mAP curve's points;
# docs/visualization.md#what-make-demo-writes has their cost); DEMO_FEATMAP_IMAGES: the held-out
# images whose feature maps are drawn.
DEMO_VAL := 275
DEMO_FEATMAP_IMAGES := 3
demo: setup
	$(PY) tools/make_demo_data.py data/shapes
	$(PY) tools/train.py $(DEMO_CFG) --work-dir $(DEMO_DIR) --cfg-options \
	    train_cfg.val_interval=$(DEMO_VAL) train_cfg.val_begin=$(DEMO_VAL) \
	    default_hooks.logger.log_metric_by_epoch=False
	$(PY) tools/test.py $(DEMO_CFG) $$(cat $(DEMO_DIR)/last_checkpoint) --work-dir $(DEMO_DIR) --show-dir vis
	@d=$$(ls -td $(DEMO_DIR)/*/vis | head -1) && d=$${d%/vis} && \
	$(PY) tools/analysis/featmap_vis.py $$(ls data/shapes/val/*.png | head -$(DEMO_FEATMAP_IMAGES)) \
	    $(DEMO_CFG) $$(cat $(DEMO_DIR)/last_checkpoint) --target-layers backbone neck \
	    --channel-reduction squeeze_mean --out-dir $$d/featmaps && \
	$(PY) tools/analysis/plot_curves.py $(DEMO_DIR) --out $$d/curves.png \
	    --title "make demo: $(notdir $(DEMO_CFG))" && \
	$(PY) -c "import json, os, sys; d = sys.argv[1]; \
	m = json.load(open(os.path.join(d, os.path.basename(d) + '.json'))); \
	print('Demo: held-out bbox mAP %.2f, segm mAP %.2f; predictions drawn in %s/vis/, feature maps ' \
	      'in %s/featmaps/, training curves in %s/curves.png' \
	      % (m['coco/bbox_mAP'], m['coco/segm_mAP'], d, d, d))" $$d

lint: setup
	$(PY) -m ruff check deepvit_mm deepvit_tools tools tests configs demo

# The whole suite, then the tests marked `numerics` (their bounds depend on the CPU's kernels) again
# on torch's and oneDNN's AVX2 kernels, as an AVX2-only CPU (most laptops) runs them: where the
# suite itself ran on those (a CPU whose instructions stop at AVX2, or both variables exported),
# tests/kernels.py says so and the second pass, the same kernels again, is not run.
# `make test-avx2 AVX2_TESTS=` runs the whole suite on the AVX2 kernels.
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
AVX2_TESTS ?= -m numerics

# TEST_WORKERS: pytest-xdist processes, each taking whole test files (their module fixtures run
# once), the files with the most work first (tests/conftest.py orders them; pytest-xdist would
# otherwise hand out the files with the most tests first); each computes on its share of the
# cores, and OpenMP's threads sleep while they wait (tests/conftest.py): docs/install.md#tests has
# the times.
TEST_WORKERS ?= 2

test: setup lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 tests
	@$(PY) tests/kernels.py || $(MAKE) --no-print-directory -o setup test-avx2

# The tests that start no tool, training or second process (markers `slow`, `distributed`), on
# TEST_WORKERS processes as the whole suite (TEST_WORKERS=0: pytest's own process).
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not distributed" tests

test-avx2: setup
	$(AVX2) $(PY) -m pytest -q $(AVX2_TESTS) tests
