"""CPU inference speed of an exported model in ONNX Runtime against PyTorch eager (ours).

Both run the same export wrapper (``wrappers``): PyTorch eager calls it directly (the backbones'
``gram_xca``/``query_chunks='auto'``, as in a test run), ONNX Runtime runs its export. Timing is the benchmark
harness's ``measure.timings`` (interleaved, order rotating; medians). Both use ``threads`` threads
(torch's intra-op threads and ONNX Runtime's). Random weights: speed does not depend on them.
"""
import os
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

import torch

from deepvit_mm.deploy.export import example_input, export_onnx, load_model, onnxruntime_session, run_onnx
from deepvit_mm.deploy.parity import max_rel_err
from deepvit_mm.deploy.wrappers import DetectorForExport, wrap_for_export

from .measure import timings

__all__ = ['compare_onnxruntime']


def compare_onnxruntime(config: str, sizes: Sequence[Tuple[int, int]], backbone_only: bool = False,
                        cfg_options: Optional[dict] = None, warmup: int = 1, repeats: int = 3,
                        threads: int = 1, dynamic: bool = True,
                        work_dir: Optional[str] = None) -> List[dict]:
    """Time ``config``'s model (or its backbone) in PyTorch eager and ONNX Runtime at ``sizes``.

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        sizes (Sequence[tuple[int, int]]): Input ``(H, W)`` sizes (multiples of 32 with
            ``dynamic``).
        backbone_only (bool): Time the backbone instead of the whole model. Default: False.
        cfg_options (dict, optional): Config overrides.
        warmup (int): Untimed calls of each before timing, per size. Default: 1.
        repeats (int): Timed calls of each per size. Default: 3.
        threads (int): Threads of both. Default: 1.
        dynamic (bool): One ``--dynamic`` export for every size (what one deploys); False
            exports once per size. Default: True.
        work_dir (str, optional): Where the ``.onnx`` files go. Default: a temporary folder.

    Returns:
        list[dict]: per size: ``config``, ``part`` (``backbone``, ``segmentor``, ``detector``),
        ``arch``, ``size``, ``threads``, ``pytorch_ms`` and ``onnxruntime_ms`` (medians),
        ``speedup`` (PyTorch / ONNX Runtime), ``max_rel_err`` (maps only), every call's time
        (``*_all_ms``), ``dynamic``, ``export_s``.
    """
    model, task = load_model(config, None, cfg_options, backbone_only)
    wrapper = wrap_for_export(model, task, backbone_only)
    part = 'backbone' if backbone_only else {'seg': 'segmentor', 'det': 'detector'}[task]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = work_dir or tmp
        session, export_s = None, None
        for size in sizes:
            size = tuple(int(s) for s in size)
            if session is None or not dynamic:
                name = 'dynamic' if dynamic else 'x'.join(map(str, size))
                path = os.path.join(folder, f'{part}_{name}.onnx')
                t0 = time.perf_counter()
                export_onnx(wrapper, path, size, dynamic=dynamic)
                export_s = time.perf_counter() - t0
                session = onnxruntime_session(path, threads)
            x = example_input(size)

            def eager(x=x):
                with torch.no_grad():
                    return wrapper(x)

            def onnx(x=x, session=session):
                return run_onnx(session, x)

            err = None
            if not isinstance(wrapper, DetectorForExport):
                ref = eager()
                err = max_rel_err(ref if isinstance(ref, tuple) else (ref,), onnx())
            timed = timings({'pytorch': eager, 'onnxruntime': onnx}, warmup, repeats, threads)
            pt, ort = (timed[k].median * 1e3 for k in ('pytorch', 'onnxruntime'))
            rows.append(dict(config=config, part=part, arch=model.backbone.arch, size=size,
                             threads=threads, pytorch_ms=pt, onnxruntime_ms=ort, speedup=pt / ort,
                             max_rel_err=err, dynamic=dynamic, export_s=export_s,
                             pytorch_all_ms=[t * 1e3 for t in timed['pytorch'].times],
                             onnxruntime_all_ms=[t * 1e3 for t in timed['onnxruntime'].times]))
    return rows
