"""docs/layout.md against the tree: every module and folder of the packages and tools is named in
it, every path it names exists, and the imports inside deepvit_mm follow its table of parts."""
import ast
import os
import re

import pytest
from conftest import ROOT

LAYOUT = os.path.join(ROOT, 'docs', 'layout.md')
# every file and folder under these is named in docs/layout.md
COMPLETE = {'deepvit_mm': ('.py',), 'deepvit_tools': ('.py',), 'tools': ('.py', '.sh')}
SKIP_DIRS = {'__pycache__', '.mim'}


def _tree_block(text: str) -> list:
    """The lines of the first fenced block: the tree."""
    block = re.search(r'^```\n(.*?)^```', text, re.S | re.M)
    assert block, 'docs/layout.md has no fenced tree'
    return block.group(1).splitlines()


def named_paths(text: str) -> list:
    """The paths of the tree's entries, relative to the repository root. An entry is a line
    indented by two spaces a level (at most one level deeper than the entry before it); its
    name runs to the first two spaces. Lines indented further continue a description."""
    paths, folders, deepest = [], [], 0  # deepest: the indent an entry may have at most
    for n, line in enumerate(_tree_block(text), 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(' '))
        if indent > deepest:  # a description's continuation
            continue
        assert indent % 2 == 0, f'tree line {n}: indent {indent} is not a level: {line!r}'
        name = line.strip().split('  ')[0]
        del folders[indent // 2:]
        paths.append(''.join(folders) + name)
        if name.endswith('/'):  # a folder: its entries one level deeper
            folders.append(name)
            deepest = indent + 2
        else:
            deepest = indent
    return paths


@pytest.fixture(scope='module')
def layout_paths() -> list:
    with open(LAYOUT, encoding='utf-8') as f:
        return named_paths(f.read())


def _tree_entries(top: str, exts) -> set:
    """``top``'s files ending in ``exts`` (``.py`` and ``exts`` for folders) and the folders that
    hold such files, as ``top/a/b.py`` and ``top/a/``. (A folder a checkout emptied but for
    ``__pycache__`` is not one.)"""
    found = set()
    for d, dirs, files in os.walk(os.path.join(ROOT, top)):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        rel = os.path.relpath(d, ROOT).replace(os.sep, '/')
        mine = {f'{rel}/{f}' for f in files if f.endswith(('.py',) + tuple(exts))}
        if mine:
            found |= {'/'.join(rel.split('/')[:i]) + '/' for i in range(1, rel.count('/') + 2)}
        found |= {f for f in mine if f.endswith(tuple(exts))} if exts else set()
    return found


def test_the_parser_reads_nesting_and_continuations():
    text = ('```\na/\n  b.py          what b is\n                  its second line\n  c/\n'
            '    d.py        d\n  e.py\nf.py\n```\n')
    assert named_paths(text) == ['a/', 'a/b.py', 'a/c/', 'a/c/d.py', 'a/e.py', 'f.py']


def test_every_path_it_names_exists(layout_paths):
    missing = [p for p in layout_paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f'docs/layout.md names paths that do not exist: {missing}'
    assert len(layout_paths) == len(set(layout_paths)), 'docs/layout.md names a path twice'


@pytest.mark.parametrize('top', sorted(COMPLETE))
def test_every_module_and_folder_is_named(layout_paths, top):
    unnamed = sorted(_tree_entries(top, COMPLETE[top]) - set(layout_paths))
    assert not unnamed, f'docs/layout.md does not name {unnamed}'


def test_test_files_have_unique_names():
    """pytest imports the test files by their names (the folders have no ``__init__.py``): two
    files of one name in two folders would stop the collection."""
    names = [f for d, _, fs in os.walk(os.path.join(ROOT, 'tests')) for f in fs
             if f.startswith('test_') and f.endswith('.py')]
    assert sorted(names) == sorted(set(names)), [n for n in set(names) if names.count(n) > 1]


def test_every_test_folder_is_named(layout_paths):
    folders = {p for p in _tree_entries('tests', ()) if p.endswith('/')}
    unnamed = sorted(folders - set(layout_paths))
    assert not unnamed, f'docs/layout.md does not name {unnamed}'


# ------------------------------------------------------------------------------ the parts' imports
def _parts_table(text: str) -> dict:
    """``{part: {parts it may import}}`` from the table whose header starts with ``part of``."""
    table = {}
    rows = re.search(r'^\| part of .*?\n\|[-| ]+\|\n((?:\|.*\|\n)+)', text, re.M)
    assert rows, 'docs/layout.md has no table of parts'
    for row in rows.group(1).splitlines():
        left, right = (c.strip() for c in row.strip('|').split('|'))
        allowed = set(re.findall(r'`([^`]+)`', right))
        for part in re.findall(r'`([^`]+)`', left):
            table[part] = allowed
    return table


def _part_of(module: str) -> str:
    """``deepvit_mm.models.backbones.xcit`` -> ``models/``; ``deepvit_mm.tracing`` -> ``tracing.py``."""
    parts = module.split('.')
    if len(parts) == 1:
        return '__init__.py'
    sub = os.path.join(ROOT, *parts[:2])
    return parts[1] + '/' if os.path.isdir(sub) else parts[1] + '.py'


def _imports(path: str, module: str) -> set:
    """The deepvit_mm modules ``path`` (module ``module``) imports, absolute names."""
    is_pkg = os.path.basename(path) == '__init__.py'
    package = module if is_pkg else module.rsplit('.', 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[:len(base) - node.level + 1]
                name = '.'.join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ''
            if name.split('.')[0] == 'deepvit_mm':
                found.add(name)
                # `from . import x` / `from .pkg import submodule`
                found |= {f'{name}.{a.name}' for a in node.names
                          if os.path.exists(os.path.join(ROOT, *name.split('.'), a.name))}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split('.')[0] == 'deepvit_mm'}
    return found


def test_imports_follow_the_table_of_parts():
    with open(LAYOUT, encoding='utf-8') as f:
        table = _parts_table(f.read())
    wrong = []
    for d, dirs, files in os.walk(os.path.join(ROOT, 'deepvit_mm')):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        for f in files:
            if not f.endswith('.py'):
                continue
            rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, '.')
            module = rel[:-len('.__init__')] if rel.endswith('.__init__') else rel
            mine = _part_of(module)
            if mine == '__init__.py':
                continue
            assert mine in table, f'docs/layout.md\'s table of parts has no row for {mine}'
            for imported in _imports(os.path.join(d, f), module):
                theirs = _part_of(imported)
                if theirs != mine and theirs not in table[mine]:
                    wrong.append(f'{module} ({mine}) imports {imported} ({theirs})')
    assert not wrong, 'imports the table of parts does not allow:\n' + '\n'.join(wrong)
