__version__ = '0.1.0'

# What this release is tested with, and the ranges it accepts (lower inclusive, upper exclusive).
SUPPORTED = {
    'torch': ('2.1.0', '2.14.0'),
    'torchvision': ('0.16.0', '0.29.0'),
    'mmcv': ('2.0.0', '2.2.0'),
    'mmengine': ('0.10.0', '1.0.0'),
    'mmdet': ('3.0.0', '3.4.0'),
    'mmsegmentation': ('1.0.0', '1.3.0'),
    'timm': ('1.0.9', '2.0.0'),
}
