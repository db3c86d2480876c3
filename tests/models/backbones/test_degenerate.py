"""Degenerate inputs and arguments get a clear answer, for every family."""
import pytest
import torch
from mmdet.registry import MODELS

FAMILIES = [('XCiT', 'nano_12_p16'), ('XCiT', 'nano_12_p8'), ('CaiT', 'xxs24')]


def _build(family, arch, **kw):
    return MODELS.build(dict(type=family, arch=arch, **kw))


@pytest.fixture(scope='module', params=FAMILIES, ids=lambda f: f'{f[0]}-{f[1]}')
def backbone(request):
    return _build(*request.param).eval()


@pytest.mark.parametrize('pad_input', [True, False])
@pytest.mark.parametrize('size', [(64, 96), (70, 100)])
def test_empty_batch_gives_empty_maps_of_the_right_size(backbone, pad_input, size):
    """An empty batch gives empty maps of the sizes a one-image batch gives. ~0.1-5 s."""
    backbone.pad_input = pad_input
    try:
        with torch.no_grad():
            want = [o.shape[1:] for o in backbone(torch.randn(1, 3, *size))]
            got = backbone(torch.randn(0, 3, *size))
    finally:
        backbone.pad_input = True
    assert [o.shape[0] for o in got] == [0] * 4
    assert [o.shape[1:] for o in got] == want


@pytest.mark.parametrize('family', FAMILIES, ids=lambda f: f'{f[0]}-{f[1]}')
def test_non_finite_input_refused_on_the_first_call(family):
    """The values are read on a backbone's first call only (test_host_syncs.py: later calls
    do not wait for the device); ``FiniteLossHook`` names them once a loss is not finite."""
    x = torch.randn(2, 3, 64, 64)
    x[1, 2, 10, 10] = float('nan')
    with pytest.raises(ValueError, match=rf'{family[0]}\({family[1]}\): the input holds 1 NaN or '
                                         'infinite values'):
        _build(*family, out_indices=(0, 1, 2, 3))(x)


@pytest.mark.parametrize('dtype,match', [
    (torch.uint8, r'expects float images normalised by the data preprocessor.*got torch.uint8'),
    (torch.float64, r'input is torch.float64 but the weights are torch.float32: pass '
                    r'x.to\(torch.float32\)'),
    (torch.float16, r'input is torch.float16 .*torch.autocast'),
])
def test_wrong_dtype_says_what_to_pass(backbone, dtype, match):
    with pytest.raises(TypeError, match=match):
        backbone(torch.zeros(1, 3, 64, 64).to(dtype))


def test_double_model_takes_double_input():
    m = _build('XCiT', 'nano_12_p16').double().eval()
    with torch.no_grad():
        assert m(torch.randn(1, 3, 64, 64, dtype=torch.float64))[0].dtype == torch.float64


@pytest.mark.slow
def test_cait_attention_that_cannot_fit_is_refused_before_allocating():
    """A CaiT attention too large for memory is refused before allocating. ~1-4 s."""
    m = _build('CaiT', 'xxs24', query_chunks=False).eval()  # timm's attention: N x N maps
    with pytest.raises(MemoryError, match=r'\(500x500 patches\) needs at least .* GiB .*'
                                          r'window_size=14'):
        with torch.no_grad():
            m(torch.zeros(1, 3, 8000, 8000))
    m.train()
    with pytest.raises(MemoryError, match='with_cp=True'):
        m(torch.zeros(1, 3, 1600, 1600))  # training keeps 24 global 10,000 x 10,000 maps
    windowed = _build('CaiT', 'xxs24', window_size=14, global_blocks=[23])
    assert windowed._activation_bytes(1, (100, 100), 4, torch.device('cpu')) < \
        m._activation_bytes(1, (100, 100), 4, torch.device('cpu')) / 10


@pytest.mark.parametrize('family,arch', [('XCiT', 'nano_12_p16'), ('CaiT', 'xxs24')])
@pytest.mark.parametrize('kwargs,error,match', [
    (dict(out_indices=5), TypeError, r'out_indices must be a sequence .* e.g. \(3, 5, 7, 11\); got 5'),
    (dict(out_indices=[1.5, 2, 3, 4]), TypeError, 'out_indices must be a sequence'),
    (dict(frozen_stages='all'), TypeError, r"frozen_stages must be an int.*got 'all'"),
    (dict(norm_cfg='BN'), TypeError, r"norm_cfg must be a dict with a 'type', e.g. "
                                     r"dict\(type='BN'"),
    (dict(norm_cfg=dict(type='GN')), ValueError, r"needs num_groups, e.g. dict\(type='GN', "
                                                 r'num_groups=32\)'),
    (dict(norm_cfg=dict(type='GN', num_groups=7)), ValueError, 'cannot build norm layers'),
    (dict(drop_path_rate=2.0), ValueError, r'drop_path_rate must be a number in \[0, 1\)'),
    (dict(drop_path_rate='0.1'), ValueError, 'drop_path_rate must be a number'),
])
def test_bad_arguments_say_what_to_pass(family, arch, kwargs, error, match):
    with pytest.raises(error, match=match):
        _build(family, arch, **kwargs)


@pytest.mark.parametrize('family,arch,name', [('XCiT', 'nano_12_p16', 'gram_xca'),
                                              ('CaiT', 'xxs24', 'query_chunks')])
def test_the_faster_forward_has_one_name_per_family(family, arch, name):
    """Each family's faster forward is one switch (``fast_path_name``): 'auto', True or False, no
    second name for it. ~1-4 s: the model built twice."""
    m = _build(family, arch, **{name: False})
    assert getattr(m, name) is False and type(m).fast_path_name == name
    setattr(m, name, 'auto')
    assert getattr(m, name) == 'auto'
    with pytest.raises(ValueError, match=f"{name} must be 'auto', True or False"):
        _build(family, arch, **{name: 'yes'})
    for other in ('fast_forward', 'fast_path'):  # no second name for the same switch
        assert not hasattr(m, other)
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{other}'"):
            _build(family, arch, **{other: False})
    from deepvit_tools.benchmark.models import reference_forward, speed_options
    assert speed_options(m) == {name: 'auto'}
    with reference_forward(m):
        assert getattr(m, name) is False
    assert getattr(m, name) == 'auto'
