"""The package tree reads harness / tasks / models: models/ never imports lra/
(the harness and the task data) and lra/ never imports models/ (train.py,
eval.py and benchmark.py build the model and hand it to the harness); lra/
never imports configs/ (the scripts read configs and hand them over); and
no module of lra/ or models/ imports itself back through others (no import
cycle, counting imports inside functions).

Read with `ast`, nothing imported: an import inside a function counts, and so
does `importlib.import_module('<constant>')`."""

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
    elif (
      isinstance(node, ast.Call)
      and getattr(node.func, 'attr', getattr(node.func, 'id', None))
      in ('import_module', '__import__')
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      found.append((node.args[0].value, node.lineno))
  return found


def forbidden_imports(package, forbidden):
  """'path:line imports name' for each import of `forbidden` under package."""
  bad = []
  for path in sorted((ROOT / package).rglob('*.py')):
    for name, line in imported_modules(path.read_text()):
      if name == forbidden or name.startswith(forbidden + '.'):
        bad.append(f'{path.relative_to(ROOT)}:{line} imports {name}')
  return bad


def test_imported_modules_sees_every_form():
  source = (
    'import lra.tasks\n'
    'from lra import steps\n'
    'from . import sibling\n'
    'def f():\n'
    '  from models.classifier import build_model\n'
    "  importlib.import_module('models.attention.none')\n"
  )
  assert [n for n, _ in imported_modules(source)] == [
    'lra.tasks',
    'lra',
    'models.classifier',
    'models.attention.none',
  ]


@pytest.mark.parametrize(
  'package, forbidden', [('models', 'lra'), ('lra', 'models')]
)
def test_no_import_across_harness_and_models(package, forbidden):
  assert (ROOT / package / '__init__.py').is_file()
  assert forbidden_imports(package, forbidden) == []


def test_task_modules_live_in_lra_tasks():
  """The task data is in lra/tasks/, and the registry points there."""
  from lra import tasks  # pylint: disable=g-import-not-at-top

  for task in tasks.TASKS.values():
    assert task.module.startswith('lra.tasks.'), task
    name = task.module.split('.')[-1]
    assert (ROOT / 'lra' / 'tasks' / f'{name}.py').is_file(), task


# The one module of lra/ that reads configs/: the sweep's command line,
# which hands the presets and model names to lra/sweep_plan.py.
CONFIG_READERS = ('lra/sweep.py',)


def test_lra_never_imports_configs():
  bad = forbidden_imports('lra', 'configs')
  assert [b for b in bad if b.split(':')[0] not in CONFIG_READERS] == []


def module_name(path):
  """'lra.tasks.cache' of ROOT/lra/tasks/cache.py ('lra' of __init__)."""
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def import_graph(packages=('lra', 'models')):
  """{module: set of project modules it imports} for the packages' files.
  `from lra import steps` counts as importing lra.steps when that is a
  module (else the package lra)."""
  files = {}
  for package in packages:
    for path in sorted((ROOT / package).rglob('*.py')):
      files[module_name(path)] = path
  graph = {}
  for name, path in files.items():
    edges = set()
    tree = ast.parse(path.read_text())
    for imported, _ in imported_modules(path.read_text()):
      if imported in files:
        edges.add(imported)
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.level == 0:
        for alias in node.names:
          full = f'{node.module}.{alias.name}'
          if full in files:
            edges.add(full)
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
  assert 'lra.report' in graph and 'models.layers' in graph
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))
