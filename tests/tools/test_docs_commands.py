"""Every command the docs give for a tool of this repository still parses: ``python tools/...py``
and ``python demo/...py`` in README.md, configs/README.md and docs/*.md (code blocks and inline
code), each through its tool's own ``parse_args`` (an unknown flag, a removed tool or an option
combination the tool refuses fails here), and each ``configs/...py`` it names exists. Placeholders
(``CONFIG``, ``N``, ``$(cat ...)``) parse as ``1``, ``{a,b}`` as its first choice; ``[...]`` marks
an optional part, parsed with it; ``...`` (more of the same) is left out."""
import glob
import importlib.util
import os
import re
import shlex
import sys

import pytest
from conftest import ROOT

PAGES = [os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'configs', 'README.md'),
         *sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))]
_TOOL = re.compile(r'^(tools|demo)/[\w/]+\.py$')
_ENDS = {'&&', '||', ';', '|', '>', '2>&1', '&'}


def _snippets(text: str):
    """Shell text of the page: each bash block's lines (continuations joined) and each inline code
    span that starts a ``python`` command."""
    for block in re.findall(r'^```(?:bash|shell|sh)\n(.*?)^```', text, flags=re.M | re.S):
        yield from block.replace('\\\n', ' ').splitlines()
    prose = re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)
    for span in re.findall(r'`([^`]+)`', prose):
        if 'python tools/' in span or 'python demo/' in span:
            yield span.replace('\n', ' ')


def _commands():
    found = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        for line in _snippets(text):
            line = re.sub(r'\$\([^)]*\)|\$\{?\w+\}?', 'X', line).replace('[', ' ').replace(']', ' ')
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote: prose, not a command
                continue
            for i, tok in enumerate(tokens[:-1]):
                if tok.startswith('python') and _TOOL.match(tokens[i + 1]):
                    argv = []
                    for t in tokens[i + 2:]:
                        if t in _ENDS:
                            break
                        if t == '...':  # more of the same
                            continue
                        choices = re.fullmatch(r'\{(\w+),[\w,]+\}', t)
                        argv.append('1' if re.fullmatch(r'[A-Z][A-Z0-9_]*|X', t) else
                                    choices.group(1) if choices else t)
                    if tokens[i + 2:i + 3] != ['...']:  # "python tools/test.py ...": any arguments
                        found.append((os.path.relpath(page, ROOT), tokens[i + 1], argv))
    return found


COMMANDS = _commands()


def test_the_docs_give_commands_of_the_tools():
    tools = {tool for _, tool, _ in COMMANDS}
    assert {'tools/train.py', 'tools/test.py', 'tools/analysis/benchmark.py',
            'tools/analysis/get_flops.py', 'tools/deploy/export_onnx.py'} <= tools, tools


@pytest.mark.parametrize('page,tool,argv', COMMANDS,
                         ids=[f'{p}:{t.split("/")[-1]}:{i}' for i, (p, t, _) in enumerate(COMMANDS)])
def test_each_docs_command_parses_with_its_tool(page, tool, argv, monkeypatch):
    path = os.path.join(ROOT, tool)
    assert os.path.isfile(path), f'{page} runs {tool}, which does not exist'
    for arg in argv:
        if arg.startswith('configs/') and arg.endswith('.py'):
            assert os.path.isfile(os.path.join(ROOT, arg)), f'{page}: no {arg}'
    spec = importlib.util.spec_from_file_location(f'docs_{os.path.basename(tool)[:-3]}', path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, 'path', list(sys.path))  # a tool may put the repository root first
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, 'argv', [tool, *argv])
    monkeypatch.setenv('LOCAL_RANK', '0')  # tools/train.py and test.py set it for mmengine
    if not hasattr(module, 'parse_args'):  # a tool without options
        assert not argv, f'{page}: {tool} takes no arguments'
        return
    try:
        module.parse_args()
    except SystemExit as e:
        pytest.fail(f'{page}: python {tool} {shlex.join(argv)} is refused by the tool '
                    f'(exit {e.code})')
