"""The docs as a reader meets them: every relative link of README.md,
docs/*.md and experiments/**/README.md reaches an existing file (an
#anchor, an existing heading of that file by GitHub's slug rules), and
every command they show names a module, a file, a console script and
train.py flags that exist. tests/test_readme.py runs the README's own
commands; this file only checks what the pages name."""

import concurrent.futures
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib

from conftest import ROOT
import pytest

LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
CODE_SPAN = re.compile(r'`[^`]*`')
# A program in a command: python [-m MODULE | FILE.py] or an lra-* script.
PROGRAM = re.compile(
  r'(?:^|[\s;&|(])(?:python3?\s+(?:-m\s+([\w.]+)|([\w./-]+\.py))'
  r'|(lra-[a-z]+))(?=\s|$)'
)
# Shells and placeholders: a token holding one of these is not checkable.
UNCHECKABLE = ('<', '$', '[', '...', '*', '{')


def pages():
  """The Markdown pages a user reads, relative to the project."""
  found = ['README.md']
  found += sorted(glob.glob('docs/*.md', root_dir=ROOT))
  found += sorted(
    glob.glob('experiments/**/README.md', root_dir=ROOT, recursive=True)
  )
  return found


def read(page):
  with open(os.path.join(ROOT, page), encoding='utf-8') as f:
    return f.read()


def split_fences(text):
  """(the prose with every fenced block blanked, [(language, block)])."""
  prose, blocks, block, lang = [], [], None, None
  for line in text.splitlines():
    fence = re.match(r'^\s*(```|~~~)\s*([\w+-]*)', line)
    if fence and block is None:
      block, lang = [], fence.group(2)
      prose.append('')
    elif fence and block is not None:
      blocks.append((lang, '\n'.join(block)))
      block = None
      prose.append('')
    elif block is not None:
      block.append(line)
      prose.append('')
    else:
      prose.append(line)
  return '\n'.join(prose), blocks


def slug(heading):
  """GitHub's anchor of a heading: its text as rendered (link targets and
  tags dropped), lowercased, punctuation dropped, each space a '-'."""
  text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)
  text = re.sub(r'<[^>]+>', '', text).strip().lower()
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def anchors(page):
  """Every heading anchor of a page (a repeated one gets -1, -2, ...)."""
  prose, _ = split_fences(read(page))
  seen = {}
  out = set()
  for line in prose.splitlines():
    m = HEADING.match(line)
    if not m:
      continue
    base = slug(m.group(2))
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f'{base}-{n}')
  return out


def links(page):
  """The targets of a page's Markdown links and images outside code."""
  prose, _ = split_fences(read(page))
  return LINK.findall(CODE_SPAN.sub('', prose))


def broken_links(page):
  """'page: target (why)' for each relative link that does not resolve."""
  bad = []
  for target in links(page):
    if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, mailto:, ...
      continue
    path, _, anchor = target.partition('#')
    if path:
      full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path))
      if not os.path.exists(full):
        bad.append(f'{page}: {target} (no such file)')
        continue
      linked = os.path.relpath(full, ROOT)
    else:
      linked = page
    if anchor and linked.endswith('.md') and anchor not in anchors(linked):
      bad.append(f'{page}: {target} (no heading #{anchor} in {linked})')
  return bad


def test_the_pages_are_found():
  found = pages()
  assert 'docs/results.md' in found and 'docs/running.md' in found
  assert any(p.startswith('experiments/') for p in found), found


def test_docs_are_a_reference_under_1800_lines():
  """docs/ holds reference pages and the current tables; the history of
  how a number was reached lives in git and in the studies' READMEs."""
  lines = sum(len(read(p).splitlines()) for p in pages() if p[:5] == 'docs/')
  assert 0 < lines < 1800, lines


def test_slug_follows_githubs_rules():
  assert slug('The main job: ListOps `small`') == 'the-main-job-listops-small'
  assert slug("LRA Table 2: the paper's Text model") == (
    'lra-table-2-the-papers-text-model'
  )
  assert slug('Memory tools: remat, scan_layers') == (
    'memory-tools-remat-scan_layers'
  )
  assert slug('One session: experiments.device.devicecheck') == (
    'one-session-experimentsdevicedevicecheck'
  )
  assert slug('See [the docs](docs/x.md) now') == 'see-the-docs-now'


def test_broken_links_are_found(tmp_path, monkeypatch):
  """The check itself: a missing file and a missing heading are reported,
  a good link, a URL and a link inside code are not."""
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'a.md').write_text(
    '# Top\n\n## A section: `x`\n\n```bash\n# not a heading\n'
    '[in code](missing.md)\n```\n'
  )
  (tmp_path / 'docs' / 'b.md').write_text(
    '[ok](a.md#a-section-x) [self](#b) [url](https://example.com/x)\n'
    '`[span](nope.md)` [gone](c.md) [bad anchor](a.md#not-a-heading)\n'
    '![img](a.md)\n\n# B\n'
  )
  monkeypatch.setattr(sys.modules[__name__], 'ROOT', str(tmp_path))
  assert broken_links('docs/a.md') == []
  assert broken_links('docs/b.md') == [
    'docs/b.md: c.md (no such file)',
    'docs/b.md: a.md#not-a-heading (no heading #not-a-heading in docs/a.md)',
  ]


def test_every_relative_link_resolves():
  bad = [b for page in pages() for b in broken_links(page)]
  assert not bad, '\n'.join(bad)


def commands(page):
  """Every command a page shows: the lines of its shell code blocks
  (continuation lines joined) and its inline code that starts with
  `python` or `lra-`."""
  prose, blocks = split_fences(read(page))
  out = []
  for lang, block in blocks:
    if lang not in ('', 'bash', 'sh', 'shell', 'console'):
      continue
    for line in block.replace('\\\n', ' ').splitlines():
      line = ' '.join(re.sub(r'(^|\s)#.*', '', line).split())
      if line:
        out.append(line)
  for span in CODE_SPAN.findall(prose):
    span = ' '.join(span.strip('`').split())
    if span.startswith(('python ', 'python3 ', 'lra-')):
      out.append(span)
  return out


def console_scripts():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    return set(tomllib.load(f)['project']['scripts'])


def module_exists(name):
  """Whether `python -m name` finds a module to run: the project's own
  modules are looked up as files (a package needs __main__.py), others by
  importlib without importing them."""
  parts = name.split('.')
  if os.path.isdir(os.path.join(ROOT, parts[0])):
    base = os.path.join(ROOT, *parts)
    return os.path.isfile(base + '.py') or os.path.isfile(
      os.path.join(base, '__main__.py')
    )
  return importlib.util.find_spec(parts[0]) is not None


def missing_programs(page):
  """'page: command (why)' for each command naming a module, file or
  console script that does not exist."""
  bad = []
  scripts = console_scripts()
  for command in commands(page):
    for module, path, script in PROGRAM.findall(command):
      if module and not module_exists(module):
        bad.append(f'{page}: {command} (no module {module})')
      if path and not any(c in path for c in UNCHECKABLE):
        if not os.path.isfile(os.path.join(ROOT, path)):
          bad.append(f'{page}: {command} (no file {path})')
      if script and script not in scripts:
        bad.append(f'{page}: {command} (no console script {script})')
  return bad


def test_missing_programs_are_found(tmp_path, monkeypatch):
  (tmp_path / 'lra' / 'sweep').mkdir(parents=True)
  (tmp_path / 'lra' / 'sweep' / '__init__.py').write_text('')
  (tmp_path / 'lra' / 'sweep' / 'archive.py').write_text('')
  (tmp_path / 'train.py').write_text('')
  (tmp_path / 'pyproject.toml').write_text(
    '[project.scripts]\nlra-train = "lra.train.main:run"\n'
  )
  (tmp_path / 'a.md').write_text(
    '```bash\npython -m lra.sweep.archive --sweep x  # ok\n'
    'python -m lra.sweep --tasks mqar \\\n    --models all\n'
    'python train.py --workdir w && python eval.py --workdir w\n'
    'lra-train --config c && lra-eval --workdir w\n'
    'python -m pip install -r requirements.txt\n```\n'
    'and `python -m lra.nothing --flag` inline\n'
  )
  monkeypatch.setattr(sys.modules[__name__], 'ROOT', str(tmp_path))
  assert missing_programs('a.md') == [
    'a.md: python -m lra.sweep --tasks mqar --models all (no module lra.sweep)',
    'a.md: python train.py --workdir w && python eval.py --workdir w (no '
    'file eval.py)',
    'a.md: lra-train --config c && lra-eval --workdir w (no console script '
    'lra-eval)',
    'a.md: python -m lra.nothing --flag (no module lra.nothing)',
  ]


def test_every_command_names_an_existing_program():
  bad = [b for page in pages() for b in missing_programs(page)]
  assert not bad, '\n'.join(bad)


# The console scripts, as the programs the docs run them as.
SCRIPTS = {
  'lra-train': 'train.py',
  'lra-eval': 'eval.py',
  'lra-benchmark': 'benchmark.py',
  'lra-sweep': '-m lra.sweep',
  'lra-prepare': '-m lra.data.prepare',
}


def program_of(words):
  """(program, its argv) if `words` start by running one of the project's
  own programs ('FILE.py', '-m MODULE', a console script), else None."""
  if words[0] in SCRIPTS:
    return SCRIPTS[words[0]], words[1:]
  if words[0] not in ('python', 'python3') or len(words) < 2:
    return None
  if words[1] == '-m' and len(words) > 2:
    top = words[2].split('.')[0]
    if os.path.isdir(os.path.join(ROOT, top)):
      return f'-m {words[2]}', words[3:]
  elif words[1].endswith('.py') and '/' not in words[1]:
    return words[1], words[2:]
  return None


def invocations(page):
  """(program, argv after it) of each run of one of the project's own
  programs in a page's commands."""
  out = []
  for command in commands(page):
    for part in re.split(r'&&|;|\||\bdo\b', command):
      try:
        words = shlex.split(part)
      except ValueError:
        continue
      for i in range(len(words)):
        found = program_of(words[i:])
        if found:
          out.append(found)
          break
  return out


def help_flags(text):
  """The flag names a program's help text gives: absl's --helpfull lines
  (`  --[no]name: ...`) when it has them, else every --name it mentions
  (argparse's --help)."""
  absl = re.findall(r'^\s+--(?:\[no\])?([\w.-]+):', text, re.M)
  if 'helpfull' in absl:
    return set(absl)
  return set(re.findall(r'(?<![\w-])--([A-Za-z][\w-]*)', text))


@pytest.fixture(scope='module')
def program_flags():
  """{program: the flags it accepts} for every program the docs run, from
  its own help (--help where --helpfull is not absl's), four at a time."""
  programs = sorted({p for page in pages() for p, _ in invocations(page)})

  def help_text(program, flag):
    proc = subprocess.run(
      [sys.executable, *program.split(), flag],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      timeout=300,
    )
    return proc.stdout

  def flags_of(program):
    flags = help_flags(help_text(program, '--helpfull'))
    if 'helpfull' not in flags:
      flags = help_flags(help_text(program, '--help'))
    return flags

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return dict(zip(programs, pool.map(flags_of, programs)))


def hidden_flag(program, name):
  """Whether a module run as `-m MODULE` defines --name itself without
  listing it in its help (an internal flag, argparse.SUPPRESS)."""
  if not program.startswith('-m '):
    return False
  base = os.path.join(ROOT, *program[3:].split('.'))
  for path in (base + '.py', os.path.join(base, '__main__.py')):
    if os.path.isfile(path):
      with open(path, encoding='utf-8') as f:
        return re.search(rf"""['"](--)?{re.escape(name)}['"]""", f.read())
  return False


def unknown_flags(page, flags):
  """'page: PROGRAM --flag (no such flag)' for each --flag given to one of
  the project's programs that neither its help names nor its module
  defines (--config.* keys are checked against the config below)."""
  bad = []
  for program, argv in invocations(page):
    for word in argv:
      name = word[2:].partition('=')[0]
      if not word.startswith('--') or not name or name.startswith('config.'):
        continue
      if any(c in name for c in UNCHECKABLE):
        continue
      known = flags.get(program, set())
      if name in known or (name[:2] == 'no' and name[2:] in known):
        continue
      if not hidden_flag(program, name):
        bad.append(f'{page}: {program} --{name} (no such flag)')
  return bad


def test_unknown_flags_are_found(tmp_path, monkeypatch):
  (tmp_path / 'lra' / 'sweep').mkdir(parents=True)
  (tmp_path / 'lra' / 'sweep' / '__main__.py').write_text(
    "p.add_argument('--child', help=argparse.SUPPRESS)\n"
  )
  (tmp_path / 'a.md').write_text(
    '```bash\npython -m lra.sweep --tasks mqar --dry_run --noprobe \\\n'
    '    --child \\\n'
    '    --config.model.emb_dim=32 --modles all\n'
    'python -m pytest -q --nonsense && lra-train --workdir w --wokdir w\n'
    'python train.py --config configs/<task>.py:<model> --<flag>\n```\n'
  )
  monkeypatch.setattr(sys.modules[__name__], 'ROOT', str(tmp_path))
  assert [p for p, _ in invocations('a.md')] == [
    '-m lra.sweep',
    'train.py',
    'train.py',
  ]
  flags = {
    '-m lra.sweep': {'tasks', 'dry_run', 'probe', 'models'},
    'train.py': {'workdir', 'config'},
  }
  assert unknown_flags('a.md', flags) == [
    'a.md: -m lra.sweep --modles (no such flag)',
    'a.md: train.py --wokdir (no such flag)',
  ]


def test_help_flags_reads_absl_and_argparse():
  absl = 'flags:\n  --[no]dry_run: x\n  --out: y\n  --[no]helpfull: z\n'
  assert help_flags(absl) == {'dry_run', 'out', 'helpfull'}
  argparse = 'usage: p [-h] [--rate RES] [--stats]\n  --num NUM  images\n'
  assert help_flags(argparse) == {'rate', 'stats', 'num'}


def test_every_flag_a_command_gives_exists(program_flags):
  assert {'workdir', 'config'} <= program_flags['train.py']
  bad = [b for page in pages() for b in unknown_flags(page, program_flags)]
  assert not bad, '\n'.join(bad)


def train_commands():
  """(page, argv after the program) of every train.py / lra-train command
  whose words are all concrete (no placeholders, no shell variables)."""
  out = []
  for page in pages():
    for program, argv in invocations(page):
      if program == 'train.py' and not any(
        c in w for w in argv for c in UNCHECKABLE
      ):
        out.append((page, argv))
  return out


def bad_train_commands(found):
  """'page: train.py ARGV (why)' for each (page, argv) of `found` whose
  --config.* keys train.py's config lacks."""
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top
  from lra.train import cli  # pylint: disable=g-import-not-at-top

  bad = []
  for page, argv in found:
    config, overrides = None, []
    words = iter(argv)
    for word in words:
      name, eq, _ = word[2:].partition('=')
      if word.startswith('--config.'):
        overrides.append(word)
      elif word.startswith('--') and name == 'config':
        config = word if eq else f'--config={next(words, "")}'
    if config is None:
      continue
    try:
      cli.config_from_argv(['train.py', config, *overrides])
    except UserError as e:
      bad.append(f'{page}: train.py {" ".join(argv)} ({e})')
  return bad


def test_bad_config_keys_are_found(monkeypatch):
  monkeypatch.chdir(ROOT)
  config = ['--config', 'configs/listops.py:transformer,smoke']
  bad = bad_train_commands(
    [
      ('a.md', [*config, '--workdir', 'w', '--config.model.num_layers=1']),
      (
        'b.md',
        ['--config=configs/mqar.py:transformer,small', '--print_config'],
      ),
      ('c.md', [*config, '--config.modle.num_layers=2']),
    ]
  )
  assert len(bad) == 1, bad
  assert bad[0].startswith('c.md: ') and "'modle'" in bad[0]


def test_train_commands_use_existing_config_keys(monkeypatch):
  monkeypatch.chdir(ROOT)
  found = train_commands()
  assert len(found) >= 5, found
  bad = bad_train_commands(found)
  assert not bad, '\n'.join(bad)
