"""Compatibility: the differences between releases of the libraries deepvit_mm builds on that more
than one of its parts meets, one module per library; each entry names the releases that need it.

A difference, private API or change to another library that one part alone needs lives with that
part, in a module named for what it is (``tests/test_deps.py``'s ``REACHES_INTO_LIBRARIES`` lists
where each private API is named). ``deepvit_mm.version`` holds the supported ranges and the tested
stacks, ``deepvit_mm._deps`` checks them on import.

- ``torch``: the running release (``TORCH_VERSION``: the checkpoint reader, ONNX export, sharded
  training), the autocast queries of torch 2.1 and 2.4+ (the backbones, mixed precision on CPU).
"""
