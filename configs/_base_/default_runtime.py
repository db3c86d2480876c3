# What every deepvit_mm recipe and demo adds to mmdet's/mmseg's runtime, written once: the plugin
# import, the hooks, the checkpoint hook and the official weight-decay rule.
#
# Every schedule base (schedules/*.py) and demo lists this file beside mmdet's/mmseg's own bases.
# mmengine refuses a key that two sibling bases both set, and theirs already set `default_hooks`
# and `optim_wrapper`; so `checkpoint_hook` and `paramwise_cfg` below are plain variables, which
# each schedule base reads (`_base_.checkpoint_hook`) into `default_hooks.checkpoint` (adding its
# interval) and `optim_wrapper.paramwise_cfg` (beside its lr and weight decay), then drops.
custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)

# The hooks of every run (deepvit_mm.engine.hooks): CheckConsumersHook stops before the run starts when
# the neck or heads were built for other channels or levels than the backbone feeds, naming the
# config keys to set; FiniteLossHook stops at the first NaN/inf loss (before it is logged or saved);
# RNGStateHook makes a resumed run bit-identical.
custom_hooks = [dict(type='CheckConsumersHook'), dict(type='FiniteLossHook'),
                dict(type='RNGStateHook')]

# default_hooks.checkpoint of every recipe; the schedules add by_epoch and the interval.
# CrashSafeCheckpointHook: mmengine's CheckpointHook whose files survive a kill at any moment
# (written under a temporary name and renamed; old ones deleted only after the new one is complete).
checkpoint_hook = dict(type='CrashSafeCheckpointHook', max_keep_ckpts=3)

# The official XCiT recipes' weight decay (facebookresearch/xcit, detection/configs/xcit/*.py and
# semantic_segmentation/configs/xcit/{upernet,sem_fpn}/*.py, Swin's rule): a parameter skips it only
# if its name contains 'norm', i.e. the blocks' LayerNorms (norm1, norm2, norm3). Everything else
# decays: biases, LayerScale, XCA's temperature, the Fourier encoding's conv and every BatchNorm
# (conv patch embedding, LPI, ColumnarPyramid, heads: mmcv names them `bn`). Swin's other two keys,
# 'absolute_pos_embed' and 'relative_position_bias_table', match nothing in XCiT and are left out;
# the CaiT bases translate the first to CaiT's learned position embedding. F-SNE's codes Cq, Ck, Cv
# do not decay either: the non-linear Q/K/V paper regularises the network weights only (its eq. 7);
# the key matches nothing in other models. tests/configs/test_recipes.py checks every recipe against
# these official rules. Opt-in deviation: `optim_wrapper.constructor=NoDecayOnScalesOptimizerConstructor`
# also exempts LayerScale, temperatures, position embeddings and every norm layer
# (deepvit_mm.engine.optimizers; docs/training.md gives its measured effect).
paramwise_cfg = dict(custom_keys={'norm': dict(decay_mult=0.), 'qkv_codes': dict(decay_mult=0.)})
