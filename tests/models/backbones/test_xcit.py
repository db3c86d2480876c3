"""XCiT only: its timm name forms and the BatchNorms of its trunk. Shapes, gradients, parity with
timm, the papers' sizes, arch names and input checks of every arch: test_backbones.py; the fast
forward: test_xcit_fast.py; the non-linear Q/K/V embeddings: test_qkv.py."""
import torch

from deepvit_mm import XCiT


def test_timm_name_forms_accepted():
    # resolution, distillation and pretrained tags of timm's names (plain names: test_backbones.py)
    assert XCiT.arch_zoo.resolve('xcit_small_12_p8_224', 'XCiT') == 'small_12_p8'
    assert XCiT.arch_zoo.resolve('xcit_medium_24_p16_384.fb_in1k', 'XCiT') == 'medium_24_p16'
    assert XCiT.arch_zoo.resolve('xcit_tiny_12_p8_224_dist', 'XCiT') == 'tiny_12_p8'
    assert XCiT.arch_zoo.resolve('xcit_nano_12_p16_384_dist.fb_in1k', 'XCiT') == 'nano_12_p16'


def test_syncbn_norm_cfg_replaces_trunk_batchnorms():
    # the conv patch embedding's and every LPI's BatchNorms, not only ColumnarPyramid's
    m = XCiT('nano_12_p16', norm_cfg=dict(type='SyncBN', requires_grad=True))
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(isinstance(b, torch.nn.SyncBatchNorm) for b in bns)
    assert any(n.startswith('trunk.blocks.') for n, b in m.named_modules() if b in bns)
