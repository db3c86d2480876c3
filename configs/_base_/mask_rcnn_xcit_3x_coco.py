# Mask R-CNN 3x on COCO with an XCiT backbone: the recipe of the XCiT paper (Table 5, section 4.2),
# features tapped from blocks 4/6/8/12 (12 layers) or 8/12/16/24 (24 layers). Everything but the
# backbone and the FPN's input channels is the schedule base's (schedules/mask_rcnn_3x_coco.py).
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = './schedules/mask_rcnn_3x_coco.py'

arch = 'small_12_p16'  # see deepvit_mm.XCiT.arch_zoo
embed_dim = 384  # T: 192, S: 384, M: 512; every tap has embed_dim channels
# ImageNet-1k weights: the official release, fetched once into torch's hub cache and checked
# (deepvit_mm.checkpoints.fetch). timm's also load: 'hf-hub:timm/xcit_<size>_p<patch>_224.fb_in1k',
# or a local path (a machine without network).
pretrained = f'https://dl.fbaipublicfiles.com/xcit/xcit_{arch}_224.pth'

model = dict(
    backbone=dict(
        _delete_=True,  # drop the Swin arguments
        type='XCiT',
        arch=arch,
        # drop path and LayerScale init default to the paper's Table B.1 for `arch`; taps to the
        # paper's blocks (out_indices)
        # SyncBN (the BatchNorms of the conv patch embedding, LPI and ColumnarPyramid) as in the
        # paper's multi-GPU training. In a non-distributed run (one GPU, CPU) mmengine's Runner
        # reverts SyncBN to BN by itself; `--cfg-options model.backbone.norm_cfg.type=BN` says
        # so explicitly.
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))
