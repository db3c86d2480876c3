# Mask R-CNN 3x on COCO with a CaiT backbone. CaiT's paper has no detection results; this applies
# the XCiT recipe (schedules/mask_rcnn_3x_coco.py) unchanged, so the two families share one schedule.
#
# Backbone: taps at 1/3, 1/2, 2/3 and the end of the trunk (blocks 8/12/16/24 of 24), stride 16 ->
# ColumnarPyramid's ConvT-BN-GELU-ConvT / ConvT / identity / max-pool levels. At 800x1333 a
# /16 grid has ~4,200 tokens: global talking-heads attention in all 24 blocks would hold several
# 8 x 4200 x 4200 maps per block (tens of GB per image), so, as ViTDet does for ViT, the blocks
# attend within 14x14-patch windows (the 224-pretraining grid) except the four tapped blocks,
# which stay global; gradient checkpointing keeps one block's activations at a time (measured:
# docs/cait.md).
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = './schedules/mask_rcnn_3x_coco.py'

arch = 's24'  # see deepvit_mm.CaiT.arch_zoo
embed_dim = 384  # XXS: 192, XS: 288, S: 384; every tap has embed_dim channels
# ImageNet-1k weights: the official release (a dict under 'model'), fetched once into torch's hub
# cache and checked; timm's also load ('hf-hub:timm/cait_s24_224.fb_dist_in1k'), or a local path.
# The learned position embedding is built for `img_size` (a 14x14 grid at 224) and resampled to
# each input's grid; children using a 384 release set img_size=384 so that its 24x24 embedding
# loads as trained.
pretrained = 'https://dl.fbaipublicfiles.com/deit/S24_224.pth'
img_size = 224

model = dict(
    backbone=dict(
        _delete_=True,  # drop the Swin arguments
        type='CaiT',
        arch=arch,
        img_size=img_size,
        # drop path and LayerScale init default to the paper's Table 4 for `arch`
        window_size=14,  # global attention only in the tapped blocks (global_blocks=out_indices)
        with_cp=True,
        # SyncBN in ColumnarPyramid (the only BatchNorm); mmengine's Runner reverts it to BN in
        # a non-distributed run
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))

# Weight decay: the official XCiT rule (../default_runtime.py) with the key the official configs
# copied from Swin for its learned absolute position embedding ('absolute_pos_embed') read as
# CaiT's, 'pos_embed', which CaiT's own ImageNet training also left undecayed (timm's
# Cait.no_weight_decay). Everything else as for XCiT: only the LayerNorms skip decay.
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.)}))
