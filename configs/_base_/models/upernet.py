# mmseg's UperNet as its ADE20k recipe (upernet/upernet_r50_4xb4-160k_ade20k-512x512.py) sets it
# up, for any backbone: UPerHead (512 channels) + FCN auxiliary head on the stride-16 level
# (in_index=2), 150 classes, batches padded to the 512x512 training crops. The backbone bases
# (../upernet_{xcit,cait}_160k_ade20k.py) replace the ResNet and set the heads' input channels.
_base_ = '../upstream/mmseg/_base_/models/upernet_r50.py'

data_preprocessor = dict(size=(512, 512))  # the crops of mmseg's ADE20k pipeline
model = dict(
    data_preprocessor=data_preprocessor,
    decode_head=dict(channels=512, num_classes=150),
    auxiliary_head=dict(in_index=2, num_classes=150))
