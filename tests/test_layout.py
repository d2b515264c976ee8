"""The floors of the package tree, and that imports run only downward:

  lra/sweep/  the engine that runs many trainings  imports report/ and below
  lra/bench/  measures one step or one layer      imports report/ and below
  lra/report/ reads finished runs: tables, plots  imports train/ and below
  lra/train/  what one training run is made of    imports data/, models/
  lra/data/   every task behind the data contract imports nothing above
  models/     the model zoo                       never imports lra/

No module of lra/ or models/ imports configs/ except the config loader,
lra/train/config.py (every other module asks it); no module of lra/ or
models/ imports itself back through others (no import cycle, counting
imports inside functions).

Read with `ast`, nothing imported: an import inside a function counts, and so
does `importlib.import_module('<constant>')` (and one of an f-string whose
constant start names a package, `f'configs.{task}'`); `from lra import
train` counts as importing lra.train."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def imported_modules(source):
  """The absolute module names that `source` imports, with line numbers."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(a.name, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      found.append((node.module, node.lineno))
      # `from lra import train` imports lra.train when that is a module.
      found += [
        (f'{node.module}.{a.name}', node.lineno)
        for a in node.names
        if node.module == 'lra'
        and a.name in ('data', 'train', 'sweep', 'bench', 'report')
      ]
    elif (
      isinstance(node, ast.Call)
      and getattr(node.func, 'attr', getattr(node.func, 'id', None))
      in ('import_module', '__import__')
      and node.args
    ):
      name = _constant_start(node.args[0])
      if name:
        found.append((name, node.lineno))
  return found


def _constant_start(arg):
  """The module a constant names, or the package an f-string's constant
  start names (`f'configs.{task}'` -> 'configs'); None otherwise."""
  if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
    return arg.value
  if (
    isinstance(arg, ast.JoinedStr)
    and arg.values
    and isinstance(arg.values[0], ast.Constant)
    and '.' in arg.values[0].value
  ):
    return arg.values[0].value.rsplit('.', 1)[0]
  return None


def forbidden_imports(package, forbidden, root=ROOT):
  """'path:line imports name' for each import of `forbidden` under package
  (a folder of `root`); the config loader may import configs."""
  bad = []
  for path in sorted((root / package).rglob('*.py')):
    if forbidden == 'configs' and path == root / CONFIG_LOADER:
      continue
    for name, line in imported_modules(path.read_text()):
      if name == forbidden or name.startswith(forbidden + '.'):
        bad.append(f'{path.relative_to(root)}:{line} imports {name}')
  return bad


# Each floor and what it must not import.
TOP = ('lra.sweep', 'lra.bench', 'lra.report')
FLOORS = {
  'models': ('lra', 'configs', 'experiments'),
  'lra/data': ('lra.train', *TOP, 'models', 'configs', 'experiments'),
  'lra/train': (*TOP, 'configs', 'experiments'),
  'lra/report': ('lra.sweep', 'lra.bench', 'configs', 'experiments'),
  'lra/bench': ('lra.sweep', 'configs', 'experiments'),
  'lra/sweep': ('lra.bench', 'configs', 'experiments'),
}
# The one module that imports configs/.
CONFIG_LOADER = 'lra/train/config.py'

# Modules at the top of lra/: the package (load_run), the error type, the
# spelling of printed commands (every floor prints hints), and the
# `python -m` spellings kept from before the floors (each calls the main of
# the module it names).
LRA_TOP = {
  '__init__.py',
  'allocator.py',
  'commands.py',
  'errors.py',
  'prepare.py',
}


def floor_violations(root=ROOT):
  """Every upward import under `root`, as 'path:line imports name'."""
  return [
    bad
    for floor, forbidden in FLOORS.items()
    for name in forbidden
    for bad in forbidden_imports(floor, name, root)
  ]


def test_imported_modules_sees_every_form():
  source = (
    'import lra.data\n'
    'from lra import train\n'
    'from . import sibling\n'
    'def f():\n'
    '  from models.classifier import build_model\n'
    "  importlib.import_module('models.attention.none')\n"
  )
  assert [n for n, _ in imported_modules(source)] == [
    'lra.data',
    'lra',
    'lra.train',
    'models.classifier',
    'models.attention.none',
  ]


def test_imports_run_only_downward():
  for floor in FLOORS:
    assert (ROOT / floor / '__init__.py').is_file(), floor
  assert floor_violations() == []


@pytest.mark.parametrize(
  'floor, line',
  [
    ('lra/data', 'from lra.train import steps'),
    ('lra/data', 'from lra import sweep'),
    ('lra/report', 'from lra.bench import report'),
    ('lra/sweep', 'import lra.bench.main'),
    ('lra/train', 'import lra.report.tables'),
    ('lra/train', 'from configs import base'),
    ('lra/sweep', "importlib.import_module(f'configs.{task}')"),
    ('lra/bench', 'from configs import models'),
    ('models', 'from lra.data import cache'),
  ],
)
def test_layout_test_fails_on_an_upward_import(tmp_path, floor, line):
  """The check above, on a copy of the floors with one upward import."""
  for f in FLOORS:
    (tmp_path / f).mkdir(parents=True, exist_ok=True)
    (tmp_path / f / '__init__.py').write_text('')
  (tmp_path / floor / 'bad.py').write_text(f'def f():\n  {line}\n')
  found = floor_violations(tmp_path)
  assert len(found) == 1 and found[0].startswith(f'{floor}/bad.py:2 imports')


def test_only_the_config_loader_imports_configs():
  """Every module of lra/ and models/ (the top of lra/ included) reaches
  configs/ through lra/train/config.py alone, and that module does."""
  importers = [
    bad.split(':')[0]
    for package in ('lra', 'models')
    for bad in forbidden_imports(package, 'configs')
  ]
  assert importers == []
  loader = (ROOT / CONFIG_LOADER).read_text()
  assert any(n == 'configs' for n, _ in imported_modules(loader))


def test_lra_top_holds_only_the_floors():
  top = {p.name for p in (ROOT / 'lra').glob('*.py')}
  assert top <= LRA_TOP, top - LRA_TOP
  dirs = {p.name for p in (ROOT / 'lra').iterdir() if p.is_dir()}
  assert {'data', 'train', 'sweep', 'bench', 'report'} <= dirs
  assert 'lab' not in dirs


def test_task_modules_live_in_lra_data():
  """The task data is in lra/data/, and the registry points there."""
  from lra import data as tasks  # pylint: disable=g-import-not-at-top

  for task in tasks.TASKS.values():
    assert task.module.startswith('lra.data.'), task
    name = task.module.split('.')[-1]
    assert (ROOT / 'lra' / 'data' / f'{name}.py').is_file(), task


def module_name(path):
  """'lra.data.cache' of ROOT/lra/data/cache.py ('lra' of __init__)."""
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def import_graph(packages=('lra', 'models')):
  """{module: set of project modules it imports} for the packages' files.
  `from lra import steps` counts as importing lra.train.steps when that is a
  module (else the package lra)."""
  files = {}
  for package in packages:
    for path in sorted((ROOT / package).rglob('*.py')):
      files[module_name(path)] = path
  graph = {}
  for name, path in files.items():
    edges = set()
    tree = ast.parse(path.read_text())
    submodule_imports = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.level == 0:
        full = [f'{node.module}.{a.name}' for a in node.names]
        edges.update(f for f in full if f in files)
        if all(f in files for f in full):
          # `from lra import data`: the package lra is already running.
          submodule_imports.add((node.module, node.lineno))
    for imported, line in imported_modules(path.read_text()):
      if imported in files and (imported, line) not in submodule_imports:
        edges.add(imported)
    # A package's __init__ is run by importing any module below it; an
    # edge to `a.b.c` also runs `a` and `a.b`, which are not cycles of
    # interest unless they import back: they are edges of their own.
    edges.discard(name)
    graph[name] = edges
  return graph


def find_cycle(graph):
  """One import cycle as a list of modules, or None."""
  state = {}
  stack = []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return stack[stack.index(nxt) :] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 'done'
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_find_cycle_finds_one():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == [
    'a',
    'b',
    'c',
    'a',
  ]
  assert find_cycle({'a': {'b'}, 'b': set(), 'c': {'a'}}) is None


def test_no_import_cycle_in_lra_and_models():
  graph = import_graph()
  assert 'lra.report.tables' in graph and 'models.layers' in graph
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))
