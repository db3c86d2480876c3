import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import deepvit_mm  # noqa: E402,F401  (registers the backbones)

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def official_xcit_state_dict(timm_model: torch.nn.Module) -> dict:
    """A timm XCiT's weights in the official release layout: ``{'model': ...}``, ``pos_embeder``,
    class-attention ``qkv`` fused (timm splits them into q, k, v)."""
    sd = {}
    for k, v in timm_model.state_dict().items():
        sd[k.replace('pos_embed.', 'pos_embeder.')] = v.clone()
    for i in range(len(timm_model.cls_attn_blocks)):
        p = f'cls_attn_blocks.{i}.attn.'
        sd[p + 'qkv.weight'] = torch.cat([sd.pop(p + f'{n}.weight') for n in 'qkv'])
        sd[p + 'qkv.bias'] = torch.cat([sd.pop(p + f'{n}.bias') for n in 'qkv'])
    return {'model': sd, 'epoch': 400}
