"""The name-list grammar of the command lines: 'all', 'a,b' and '-c'.

`lra-sweep --tasks/--models` and `lra-benchmark --models` take a list of
names written the same way: comma-separated names in the order given,
'all' for every known name (in the catalogue's order, where it stands in
the list), '-name' to drop one wherever it appears. A name is kept once, at
its first place. An unknown name, or a list that leaves nothing, is one
sentence naming the flag.
"""

from lra.errors import UserError


def select_names(
  spec: str,
  known: tuple[str, ...] | list[str],
  flag: str,
  *,
  noun: str = 'name',
  first: tuple[str, ...] = (),
) -> list[str]:
  """'all' or 'a,b,-c' -> the names it selects, in order.

  known: every valid name, in the order 'all' gives them. flag: the flag
  the list came from (in the error sentences), noun: what a name is
  ('task', 'model'). first: names put in front of the list (a '-name' in
  the list drops them too), e.g. the benchmark's exact baselines.
  """
  known = tuple(known)
  items = [s.strip() for s in spec.split(',') if s.strip()]
  keep = [s for s in items if not s.startswith('-')]
  drop = [s[1:] for s in items if s.startswith('-')]
  bad = [n for n in [*first, *keep, *drop] if n not in known and n != 'all']
  if bad:
    raise UserError(
      f'Unknown {noun} {bad[0]!r} in {flag}; valid: all, {", ".join(known)}.'
    )
  names = [*first, *(n for k in keep for n in (known if k == 'all' else [k]))]
  names = [n for n in dict.fromkeys(names) if n not in drop]
  if not names:
    raise UserError(
      f'{flag} {spec!r} leaves no {noun} to run; name at least one, e.g. '
      f'{flag} {known[0]}.'
    )
  return names
