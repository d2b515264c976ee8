"""conftest.SLOW (the checks kept out of the README's test line) names
tests that exist: a renamed test would otherwise return to the line, or a
typo leave a long check in it, without anyone seeing."""

import os

import conftest


def test_every_slow_entry_names_a_test_function():
  here = os.path.dirname(os.path.abspath(__file__))
  for entry in conftest.SLOW:
    path, _, name = entry.partition('::')
    function = name.split('[', 1)[0]
    with open(os.path.join(here, path)) as f:
      assert f'def {function}(' in f.read(), entry


def test_a_case_or_a_whole_function_is_matched():
  entry = conftest.SLOW[0]
  assert conftest.is_slow(f'tests/{entry}')
  assert conftest.is_slow(f'tests/{entry}[some-case]')
  assert not conftest.is_slow(f'tests/{entry}_more')
  case = next(s for s in conftest.SLOW if '[' in s)
  assert conftest.is_slow(f'tests/{case}')
  assert not conftest.is_slow(f'tests/{case.split("[")[0]}[another]')
