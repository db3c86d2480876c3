"""XCiT inside mmdet's and mmseg's own models: replace only the backbone (and neck channels)."""
import textwrap

import pytest
import torch
from mmengine.config import Config
from mmengine.model.utils import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData


def _config(tmp_path, text: str) -> Config:
    path = tmp_path / 'cfg.py'
    path.write_text(textwrap.dedent(text))
    return Config.fromfile(str(path))


def _finite_loss_and_grads(model, data):
    model.train()
    data = model.data_preprocessor(data, True)
    losses = model(**data, mode='loss')
    parsed, log_vars = model.parse_losses(losses)
    assert torch.isfinite(parsed)
    parsed.backward()
    trunk_grads = [p.grad for n, p in model.backbone.named_parameters() if p.requires_grad]
    assert trunk_grads and all(g is not None and torch.isfinite(g).all() for g in trunk_grads)
    return log_vars


@pytest.mark.parametrize('arch', ['nano_12_p16', 'nano_12_p8'])
def test_xcit_in_mmdets_own_mask_rcnn_config(tmp_path, arch):
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmdet.utils import register_all_modules
    register_all_modules()
    cfg = _config(tmp_path, f"""
        _base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
        custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)
        model = dict(
            backbone=dict(_delete_=True, type='XCiT', arch='{arch}'),
            neck=dict(in_channels=[128, 128, 128, 128]))
        """)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.init_weights()
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 96, 128), (3, 128, 80)],
                          num_items=[3, 2], num_classes=80, with_mask=True)
    log_vars = _finite_loss_and_grads(model, data)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(log_vars)
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(demo_mm_inputs(1, [(3, 100, 150)], with_mask=True), False)
        (result,) = model(**data, mode='predict')
    assert result.pred_instances.bboxes.shape[-1] == 4


def _seg_inputs(batch=2, h=64, w=96, num_classes=150):
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 255, (3, h, w), dtype=torch.uint8))
        s = SegDataSample()
        s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, h, w)))
        s.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


@pytest.mark.parametrize('base,heads', [
    ('mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
     "decode_head=dict(in_channels=[128, 128, 128, 128], channels=64),"
     " auxiliary_head=dict(in_channels=128, channels=64)"),
    ('mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
     "neck=dict(in_channels=[128, 128, 128, 128])"),
])
def test_xcit_in_mmsegs_own_configs(tmp_path, base, heads):
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules()
    cfg = _config(tmp_path, f"""
        _base_ = '{base}'
        custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)
        model = dict(
            pretrained=None,
            backbone=dict(_delete_=True, type='XCiT', arch='nano_12_p16'),
            {heads})
        """)
    init_default_scope('mmseg')
    model = revert_sync_batchnorm(MODELS.build(cfg.model))  # SyncBN in mmseg's bases; CPU here
    model.init_weights()
    log_vars = _finite_loss_and_grads(model, _seg_inputs())
    assert 'decode.loss_ce' in log_vars


def test_inherited_resnet_pretrained_is_refused_with_the_fix():
    from deepvit_mm import XCiT
    with pytest.raises(ValueError, match='Set model.pretrained=None'):
        XCiT('nano_12_p16', pretrained='open-mmlab://resnet50_v1c')
