"""``adapt``, the one way the backbones change what a built timm module does: for each of its
users (ViT's windows, CaiT's grid attention, XCiT's faster blocks) the module keeps its
parameters and keys, stays an instance of timm's class, computes what timm's does, and goes back
to timm's forward; no other way (class assignment, a forward set on an instance, timm's
``attn_block``) is written in the backbones."""
import os
import re

import pytest
import torch
from timm.models.cait import TalkingHeadAttn
from timm.models.vision_transformer import Attention
from timm.models.xcit import XCA, XCABlock

from deepvit_mm.models.backbones.adapt import adapt, timm_class
from deepvit_mm.models.backbones.cait.window_attention import GridTalkingHeadAttn
from deepvit_mm.models.backbones.vit.window_attention import WindowedAttention
from deepvit_mm.models.backbones.xcit.fast import AutoGramXCABlock, CompiledAutoGramXCABlock, GramXCABlock

DIM, HEADS, GRID = 32, 4, (3, 5)


def _tokens_call(m, x):
    return m(x, *GRID) if isinstance(m, XCABlock) else m(x)


# (timm's module, the adapted class, its attributes)
CASES = {
    'vit-windows': (lambda: Attention(DIM, HEADS, qkv_bias=True), WindowedAttention,
                    dict(window_size=2)),
    'cait-grid': (lambda: TalkingHeadAttn(DIM, HEADS, qkv_bias=True), GridTalkingHeadAttn,
                  dict(window_size=2)),
    'xcit-gram': (lambda: XCABlock(DIM, HEADS, eta=0.5), GramXCABlock, {}),
    'xcit-auto': (lambda: XCABlock(DIM, HEADS, eta=0.5), AutoGramXCABlock, {}),
    'xcit-auto-compiled': (lambda: XCABlock(DIM, HEADS, eta=0.5), CompiledAutoGramXCABlock, {}),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_adapted_module_keeps_its_weights_and_timms_results(case):
    make, cls, attrs = CASES[case]
    torch.manual_seed(0)
    m = make().eval()
    base = type(m)
    x = torch.randn(2, GRID[0] * GRID[1], DIM)
    with torch.no_grad():
        want = _tokens_call(m, x)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    assert adapt(m, cls, **attrs) is m and type(m) is cls and isinstance(m, base)
    assert timm_class(cls) is base
    assert all(getattr(m, k) == v for k, v in attrs.items())
    got_state = m.state_dict()
    assert list(got_state) == list(state) and all(torch.equal(got_state[k], state[k]) for k in state)
    with torch.no_grad():
        got = _tokens_call(m, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    adapt(m, base)  # timm's class back: timm's forward
    assert type(m) is base and type(m).forward is base.forward


@pytest.mark.parametrize('case', sorted(CASES))
def test_adapt_refuses_another_timm_class(case):
    _, cls, attrs = CASES[case]
    other = XCA(DIM, HEADS) if not issubclass(cls, XCABlock) else Attention(DIM, HEADS)
    with pytest.raises(TypeError, match=f'{cls.__name__} adapts timm\'s '):
        adapt(other, cls, **attrs)
    assert type(other) in (XCA, Attention)


def test_the_backbones_adapt_timm_modules_one_way():
    """No module of the backbones but ``adapt`` assigns a class, sets a forward on an instance
    or passes timm a block class of its own."""
    from conftest import ROOT
    root = os.path.join(ROOT, 'deepvit_mm', 'models', 'backbones')
    other_ways = re.compile(r'__class__\s*=|MethodType|\.forward\s*=|attn_block\s*=|block_fn\s*=')
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith('.py') or path == os.path.join(root, 'adapt.py'):
                continue
            with open(path) as f:
                found += [f'{os.path.relpath(path, root)}:{i}: {line.strip()}'
                          for i, line in enumerate(f, 1) if other_ways.search(line)]
    assert not found, found
