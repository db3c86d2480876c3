import http.server
import os
import sys
import threading

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


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving ``tmp_path/www``; counts the requests it answers."""
    www = tmp_path / 'www'
    www.mkdir()
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(www), **k)

        def do_GET(self):
            hits.append(self.path)
            return super().do_GET()

        def log_message(self, *a):
            pass
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f'http://127.0.0.1:{httpd.server_address[1]}', hits
    httpd.shutdown()
    httpd.server_close()
