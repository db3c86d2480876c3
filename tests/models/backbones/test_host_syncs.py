"""Nothing in a backbone's step waits for the device: every family and pyramid, training (forward
and backward) and inference, counted on CPU as a GPU would wait (reading a tensor's value,
``nonzero``, copies to the CPU, asking the GPU for its free memory or to synchronize)."""
import collections

import pytest
import torch
from conftest import EARLY, SMALL_GRID, family_archs
from torch.utils._python_dispatch import TorchDispatchMode

from deepvit_mm import ColumnarBackbone, TimmViT, XCiT
from deepvit_mm.models.backbones import checks, memory

# the operators that make the host wait for the device: reading a value (.item(), bool(t),
# int(t)), nonzero (its output's size is a value), and copies to the CPU
_READS = ('aten._local_scalar_dense', 'aten.nonzero', 'aten.item')


class HostWaits(TorchDispatchMode):
    """Counts, by name, the operators dispatched inside it that make the host wait."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)  # e.g. aten._local_scalar_dense.default
        if name.rsplit('.', 1)[0] in _READS:
            self.counts[name] += 1
        elif name.startswith('aten._to_copy') and kwargs.get('device') == torch.device('cpu') \
                and args[0].device.type != 'cpu':
            self.counts[name] += 1
        return func(*args, **kwargs)


@pytest.fixture
def device_calls(monkeypatch):
    """Counts calls that ask the GPU (patched in where CUDA is absent) and ``free_memory``."""
    counts = collections.Counter()

    def counting(name, fn):
        def call(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(torch.cuda, 'mem_get_info', counting('mem_get_info', lambda *a: (0, 0)))
    monkeypatch.setattr(torch.cuda, 'synchronize', counting('synchronize', lambda *a: None))
    monkeypatch.setattr(memory, 'free_memory', counting('free_memory', checks.free_memory))
    return counts


def _cases():
    for family in ColumnarBackbone.families:
        archs = family_archs(family)
        for arch in ('nano_12_p16', 'nano_12_p8') if family.__name__ == 'XCiT' else archs[:1]:
            for pyramid in ('columnar', 'simple'):
                yield pytest.param(family, arch, pyramid, {},
                                   id=f'{family.__name__}-{arch}-{pyramid}')
    yield pytest.param(TimmViT, family_archs(TimmViT)[0], 'columnar', dict(window_size=2),
                       id='TimmViT-windowed')


@pytest.mark.parametrize('family,arch,pyramid,kwargs', list(_cases()))
def test_no_host_wait_after_the_first_call(family, arch, pyramid, kwargs, device_calls):
    taps = EARLY if pyramid == 'columnar' else EARLY[-1:]
    model = family(arch=arch, pyramid=pyramid, out_indices=taps, drop_path_rate=0.1, **kwargs,
                   **SMALL_GRID.get(family.__name__, {}))
    x = torch.randn(2, 3, 64, 64)
    with HostWaits() as first:  # the first call reads its input's values: the count can fail
        model.train()(x)
    assert first.counts['aten._local_scalar_dense.default'] >= 1 and \
        device_calls['free_memory'] == 1
    device_calls.clear()
    for mode in ('train', 'eval'):
        model.train(mode == 'train')
        with HostWaits() as later:
            out = model(x)
            if mode == 'train':
                sum(o.float().mean() for o in out).backward()
        assert not later.counts and not device_calls, (mode, dict(later.counts),
                                                       dict(device_calls))


def test_free_memory_asked_for_a_larger_input_only(device_calls):
    """Multi-scale training: asked at each new largest input, then not for the smaller ones."""
    model = XCiT(arch='nano_12_p16', out_indices=EARLY).eval()
    asked = []
    with torch.no_grad():
        for size in (64, 96, 64, 96, 128, 96):
            model(torch.randn(1, 3, size, size))
            asked.append(device_calls['free_memory'])
    assert asked == [1, 2, 2, 2, 3, 3]
