"""XCiT inside mmdet's and mmseg's own models: replace only the backbone (and neck channels)."""
import pytest
import torch
from conftest import build_model, config_from_text, finite_loss_and_grads, seg_inputs


@pytest.mark.parametrize('arch', ['nano_12_p16', 'nano_12_p8'])
@pytest.mark.slow
def test_xcit_in_mmdets_own_mask_rcnn_config(tmp_path, arch):
    """XCiT in mmdet's own Mask R-CNN config trains a step and predicts. ~2-8 s: the detector's
    step."""
    from mmdet.testing import demo_mm_inputs
    cfg = config_from_text(tmp_path, f"""
        _base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
        custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)
        model = dict(
            backbone=dict(_delete_=True, type='XCiT', arch='{arch}'),
            neck=dict(in_channels=[128, 128, 128, 128]),
            # 64 RoIs an image, not 512 (sized for 800 px): mmcv's RoIAlign backward on the CPU
            train_cfg=dict(rcnn=dict(sampler=dict(num=64))))
        """)
    model = build_model(cfg)
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 96, 128), (3, 128, 80)],
                          num_items=[3, 2], num_classes=80, with_mask=True)
    log_vars = finite_loss_and_grads(model, data)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(log_vars)
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(demo_mm_inputs(1, [(3, 100, 150)], with_mask=True), False)
        (result,) = model(**data, mode='predict')
    assert result.pred_instances.bboxes.shape[-1] == 4


@pytest.mark.parametrize('base,heads', [
    ('mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
     "decode_head=dict(in_channels=[128, 128, 128, 128], channels=64),"
     " auxiliary_head=dict(in_channels=128, channels=64)"),
    ('mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
     "neck=dict(in_channels=[128, 128, 128, 128])"),
])
@pytest.mark.slow
def test_xcit_in_mmsegs_own_configs(tmp_path, base, heads):
    """XCiT in mmseg's own configs trains a step and predicts. ~2-8 s: the segmentor's step."""
    cfg = config_from_text(tmp_path, f"""
        _base_ = '{base}'
        custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)
        model = dict(
            pretrained=None,
            backbone=dict(_delete_=True, type='XCiT', arch='nano_12_p16'),
            {heads})
        """)
    model = build_model(cfg)  # SyncBN in mmseg's bases: reverted, CPU here
    log_vars = finite_loss_and_grads(model, seg_inputs())
    assert 'decode.loss_ce' in log_vars


def test_inherited_resnet_pretrained_is_refused_with_the_fix():
    from deepvit_mm import XCiT
    with pytest.raises(ValueError, match='Set model.pretrained=None'):
        XCiT('nano_12_p16', pretrained='open-mmlab://resnet50_v1c')
