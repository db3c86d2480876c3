"""mmcv 2.1.0 built from source for the torch at hand: what tools/setup_env.sh mends in its
``setup.py`` before building, and the check of its compiled ops after.

    python tools/mmcv_build.py mend path/to/mmcv-2.1.0/setup.py   # before `pip wheel` of that folder
    python tools/mmcv_build.py check                             # nms and RoIAlign, forward and backward

Two things stop mmcv 2.1.0's ``setup.py`` as released:

* Python 3.13: ``get_version`` reads ``__version__`` from ``locals()`` after an ``exec``, which PEP
  667 no longer fills (``KeyError: '__version__'``): it is read from the ``exec``'s own namespace.
* torch 2.14 and newer: their headers stop any C++ standard below 20 (``#error C++20 or later
  compatible compiler is required to use ATen``), and mmcv passes ``-std=c++17`` (to g++ and nvcc)
  after any ``CXXFLAGS``: the flag is raised to ``-std=c++20`` (mmcv's sources compile unchanged).
"""
import argparse
import sys

from packaging.version import Version

GET_VERSION = ("        exec(compile(f.read(), version_file, 'exec'))\n"
               "    return locals()['__version__']")
GET_VERSION_MENDED = ("        ns = {}\n"
                      "        exec(compile(f.read(), version_file, 'exec'), ns)\n"
                      "    return ns['__version__']")
#: the first torch whose headers need C++20
CXX20_TORCH = Version('2.14')


def needs_cxx20(torch_version: str) -> bool:
    """Whether torch ``torch_version`` (``'2.14.1+cu130'``, ``'2.16.0.dev20270101'``) needs C++20."""
    return Version(Version(torch_version).base_version) >= CXX20_TORCH


def mend(text: str, torch_version: str) -> str:
    """mmcv 2.1.0's ``setup.py`` text, mended to build on this Python against ``torch_version``.

    Raises:
        ValueError: the text is not the ``setup.py`` these mends were made for.
    """
    if GET_VERSION not in text and GET_VERSION_MENDED not in text:
        raise ValueError("mmcv's get_version is not the one this script mends: is this mmcv "
                         "2.1.0's setup.py?")
    text = text.replace(GET_VERSION, GET_VERSION_MENDED)
    if needs_cxx20(torch_version):
        if "'-std=c++17'" not in text and "'-std=c++20'" not in text:
            raise ValueError(f'no -std=c++17 to raise to C++20 for torch {torch_version}: is this '
                             "mmcv 2.1.0's setup.py?")
        text = text.replace("'-std=c++17'", "'-std=c++20'")
    return text


def check_ops() -> None:
    """mmcv's compiled ``nms`` and ``RoIAlign`` run, forward and backward, and give what they
    must: the overlapping box dropped, a constant map's RoI features the constant, the gradient
    of their sum over the map the number of outputs (each output's bilinear weights sum to 1)."""
    import torch
    from mmcv.ops import RoIAlign, nms

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
    _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        raise RuntimeError(f'mmcv.ops.nms kept boxes {keep.tolist()}, not [0, 2]')
    x = torch.full((1, 2, 16, 16), 3.0, requires_grad=True)
    rois = torch.tensor([[0., 2., 2., 12., 10.]])
    y = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2)(x, rois)
    if y.shape != (1, 2, 2, 2) or not torch.allclose(y, torch.full_like(y, 3.0)):
        raise RuntimeError(f'mmcv.ops.RoIAlign of a constant 3 map gave {y.flatten().tolist()}')
    y.sum().backward()
    if abs(x.grad.sum().item() - y.numel()) > 1e-4:
        raise RuntimeError(f'mmcv.ops.RoIAlign backward: gradient sum {x.grad.sum().item()}, '
                           f'not {y.numel()}')


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    m = sub.add_parser('mend', help="mend mmcv 2.1.0's setup.py in place for this Python and torch")
    m.add_argument('setup_py')
    sub.add_parser('check', help="run mmcv's compiled nms and RoIAlign, forward and backward")
    return parser.parse_args()


def main():
    args = parse_args()
    if args.command == 'check':
        try:
            check_ops()
        except Exception as e:  # an import error of the compiled ops included: one line
            sys.exit(f'[setup] mmcv ops check failed: {type(e).__name__}: {e}')
        print('[setup] mmcv ops: nms and RoIAlign forward and backward are right')
        return
    import torch
    with open(args.setup_py, encoding='utf-8') as f:
        text = f.read()
    try:
        text = mend(text, torch.__version__)
    except ValueError as e:
        sys.exit(f'[setup] {args.setup_py}: {e}')
    with open(args.setup_py, 'w', encoding='utf-8') as f:
        f.write(text)


if __name__ == '__main__':
    main()
