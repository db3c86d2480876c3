"""tools/analysis/behaviour_snapshot.py: what the backbones do, saved and compared value by value
(the check that a restructuring of the models' code changes nothing)."""
import os

import pytest
import torch
from conftest import ROOT, run_in_process

from deepvit_tools.snapshot import BUILDS, compare, snapshot

TOOL = os.path.join(ROOT, 'tools', 'analysis', 'behaviour_snapshot.py')


def test_every_family_is_built():
    from deepvit_mm import ColumnarBackbone
    assert set(BUILDS) == {fam.__name__ for fam in ColumnarBackbone.families}


@pytest.mark.slow
def test_a_snapshot_saved_twice_compares_equal_and_a_change_is_named(tmp_path, monkeypatch,
                                                                       capsys):
    """Two saves of XCiT's table and of its nano p16 builds (six: two pyramids, three fast-path
    settings; ~2 s each) compare equal; a changed gradient and a changed spec are named."""
    a, b = tmp_path / 'a.pt', tmp_path / 'b.pt'
    for path in (a, b):
        assert run_in_process(monkeypatch, TOOL, 'save', path, '--families', 'XCiT', '--archs',
                              'nano_12_p16') == 0
    capsys.readouterr()
    assert run_in_process(monkeypatch, TOOL, 'compare', a, b) == 0
    out = capsys.readouterr().out
    compared = int(out.split(' values compared')[0].split()[-1])
    assert compared > 100_000 and out.rstrip().endswith('0 entries differ'), out
    snap = torch.load(b, weights_only=True)
    keys = [k for k in snap if k.startswith('XCiT/build/nano_12_p16/simple/gram_xca=True/grad/')]
    assert keys, sorted(snap)[:20]
    snap[keys[0]] = snap[keys[0]].clone()
    snap[keys[0]].view(-1)[0] += 1
    snap['XCiT/table/tiny_24_p8/spec']['depth'] += 1
    torch.save(snap, b)
    assert run_in_process(monkeypatch, TOOL, 'compare', a, b) == 1
    out = capsys.readouterr().out
    assert f'{keys[0]}: 1 of ' in out and 'XCiT/table/tiny_24_p8/spec: ' in out, out
    assert out.rstrip().endswith('2 entries differ'), out


def test_compare_names_what_one_side_lacks():
    compared, diffs = compare({'x': torch.ones(3), 'y': [1, 2]}, {'x': torch.ones(3), 'z': 1})
    assert compared == 3 and diffs == ['y: only before', 'z: only after']


def test_the_snapshot_refuses_an_unknown_family():
    with pytest.raises(ValueError, match=r"unknown families \['Nope'\]; known: "):
        snapshot(['Nope'])
