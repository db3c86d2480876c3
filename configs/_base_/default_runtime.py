# What every deepvit_mm recipe and demo adds to mmdet's/mmseg's runtime, written once: the plugin
# import, the hooks, the checkpoint hook and the weight-decay rules of XCiT and CaiT.
#
# Every schedule base (schedules/*.py) and demo lists this file beside mmdet's/mmseg's own bases.
# mmengine refuses a key that two sibling bases both set, and theirs already set `default_hooks`
# and `optim_wrapper`; so `checkpoint_hook` and `paramwise_cfg` below are plain variables, which
# each schedule base reads (`_base_.checkpoint_hook`) into `default_hooks.checkpoint` (adding its
# interval) and `optim_wrapper.paramwise_cfg` (beside its lr and weight decay), then drops.
custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)

# The hooks of every run (deepvit_mm.runtime): FiniteLossHook stops at the first NaN/inf loss
# (before it is logged or saved); RNGStateHook makes a resumed run bit-identical.
custom_hooks = [dict(type='FiniteLossHook'), dict(type='RNGStateHook')]

# default_hooks.checkpoint of every recipe; the schedules add by_epoch and the interval.
# CrashSafeCheckpointHook: mmengine's CheckpointHook whose files survive a kill at any moment
# (written under a temporary name and renamed; old ones deleted only after the new one is complete).
checkpoint_hook = dict(type='CrashSafeCheckpointHook', max_keep_ckpts=3)

# No weight decay on what the papers do not regularise: norm layers by type (the blocks'
# LayerNorms; the BatchNorms of XCiT's conv patch embedding and LPI, of the pyramid adapter and, as
# a side effect, of the necks and heads, which the official XCiT code decayed), LayerScale, XCiT's
# XCA temperature, the position embedding (XCiT's Fourier encoding, CaiT's learned one) and the
# F-SNE codes Cq, Ck, Cv (the non-linear Q/K/V paper regularises the network weights only, its
# eq. 7). Keys of the other family match nothing. Everything else, biases included, decays.
# deepvit_mm.ColumnarLayerDecayOptimizerConstructor derives its no-decay set from the model instead
# and, as BEiT's layer decay does, also exempts every bias: it is for layer-decay fine-tuning, not
# what these recipes (and the papers' code they follow) do.
paramwise_cfg = dict(
    norm_decay_mult=0.,
    custom_keys={
        '.gamma1': dict(decay_mult=0.),  # XCiT LayerScale (attention, LPI, MLP)
        '.gamma2': dict(decay_mult=0.),
        '.gamma3': dict(decay_mult=0.),
        '.gamma_1': dict(decay_mult=0.),  # CaiT LayerScale (attention, MLP)
        '.gamma_2': dict(decay_mult=0.),
        '.temperature': dict(decay_mult=0.),
        'pos_embed': dict(decay_mult=0.),
        'qkv_codes': dict(decay_mult=0.),
    })
