"""Compatibility: where deepvit_mm meets the releases and internals of the libraries it builds on.

What deepvit_mm does differently per release of a library it builds on and the other libraries'
private APIs it uses, where more than one of its parts needs them, and every change it makes to
mmengine or mmcv, one module per library; each entry names the releases that need it.
``deepvit_mm.version`` holds the supported ranges and the tested stacks, ``deepvit_mm._deps``
checks them on import.

- ``torch``: APIs that differ between torch 2.1 and 2.13 that more than one part uses
  (compilation and export state, autocast queries, CPU loss scaling, ONNX export, FSDP on CPU,
  the normalisation layer types) and the private APIs used (``in_backward``,
  ``cpu_has_bfloat16``); a difference with one user lives with it (the restricted unpickler with
  the checkpoints, ``add_bias`` with the pyramid, FSDP's flattened shapes with the optimizer
  constructors, the profiler's and FLOP counter's with the tools);
- ``timm``: XCiT's stochastic depth (timm 1.0.21), the pruned class token and the
  ``no_weight_decay`` declarations (timm 1.0.31);
- ``numpy``: the names pickled arrays and dtypes have under numpy 1 and 2;
- ``mmengine``: ``deepvit_mm::`` config paths, checkpoints loaded through deepvit_mm's matcher
  (the one module-level function replaced), the source of a state dict, ``HistoryBuffer``'s
  statistics, ``AmpOptimWrapper``'s set-up without an accelerator;
- ``mmcv``: mmcv's compiled ops in float32 under CPU autocast.
"""
