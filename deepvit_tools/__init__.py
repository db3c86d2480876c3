"""What the command-line tools under ``tools/`` share, kept beside them and not installed with
deepvit_mm (as timm keeps its ``benchmark.py`` at the repository root):

* ``benchmark``: the measuring harness (isolation, peak memory, synthetic batches, floors, reports)
  of ``tools/analysis/``;
* ``demo_data``: the generators of the embedded demo datasets (``tools/make_demo_data.py``,
  ``tools/make_ade_demo_data.py``);
* ``snapshot``: what the backbones do, saved and compared value by value
  (``tools/analysis/behaviour_snapshot.py``);
* ``model_zoo``: the model-zoo page from the metafiles (``tools/model_zoo.py``).

The tools put the repository root on ``sys.path``; so does the test suite (``pyproject.toml``).
"""
