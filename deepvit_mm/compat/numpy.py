"""What differs between the numpy releases deepvit_mm supports (tested: 1.26.4 and 2.4.6).

* ``pickled_array_globals``: the globals a pickled numpy array or scalar names. numpy 2 moved
  ``numpy.core`` to ``numpy._core``; pickles name whichever the writer had. numpy 1.25 added the
  ``numpy.dtypes.<Name>DType`` classes that dtypes are pickled as.
"""
import importlib
from typing import List

import numpy as np

__all__ = ['pickled_array_globals']


def pickled_array_globals() -> List:
    """The numpy callables and types a pickle of arrays, scalars and dtypes refers to, as the
    ``(callable, 'module.name')`` pairs and types ``compat.torch.load_weights_only`` takes: the
    array constructors under both numpy 1's and numpy 2's module names, ``ndarray``, ``dtype``
    and the dtype classes."""
    multiarray = importlib.import_module(
        'numpy._core.multiarray' if np.lib.NumpyVersion(np.__version__) >= '2.0.0'
        else 'numpy.core.multiarray')
    arrays = [(getattr(multiarray, fn), f'numpy.{pkg}.multiarray.{fn}')
              for fn in ('_reconstruct', 'scalar') for pkg in ('core', '_core')]
    dtype_classes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith('DType')]
    return [*arrays, np.ndarray, np.dtype, *dtype_classes]
