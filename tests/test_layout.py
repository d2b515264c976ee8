"""The package tree reads harness / tasks / models: models/ never imports lra/
(the harness and the task data) and lra/ never imports models/ (train.py,
eval.py and benchmark.py build the model and hand it to the harness).

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
