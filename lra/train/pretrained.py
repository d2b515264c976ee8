"""Fine-tuning from another run: `--config.init_from=DIR`.

Self-pretraining (Amos, Berant and Gupta 2023, "Never Train from Scratch",
arXiv 2310.02980): the same model is first trained on the task's own inputs
(a language-model objective) and then fine-tuned. A run given
`--config.init_from=DIR` starts from the encoder (its token and position
embeddings, CLS, blocks and final LayerNorm: the model's `encoder` subtree)
of DIR's best checkpoint (`--config.init_from_checkpoint=best`, the default)
or latest (`latest`); its heads and its optimizer state are fresh (the
fine-tune's seed), so a language-model head pretrained in DIR is left
behind. Only a fresh run reads DIR: a run that resumes from its own
checkpoints never does.

The fine-tune's encoder must be DIR's, parameter for parameter and shape for
shape; otherwise one sentence names the first parameter that differs. Two
exceptions: a learned position table (Longformer's position extension,
Beltagy, Peters and Cohan 2020, section 5: the new rows copy the trained
table repeatedly): a fine-tune at a longer max_length extends it
(models.embeddings.fit_for_fine_tune), at a shorter one keeps its first
rows; and a language model's token table (models/lm.py) has one row more
than the task's vocabulary, its mask id, which the fine-tune drops.

Converting one model into another (issue #21): a parameter of the
fine-tune that DIR lacks is allowed when the model marks it with the
metadata `init_from_missing` (nnx.Param(..., init_from_missing='why')): it
keeps its initial value, which the model defines as the conversion.
Longformer's global projections start as the identity on the ordinary
projections (the paper's conversion of a pretrained model, Beltagy, Peters
and Cohan 2020, copies Q_s, K_s, V_s into Q_g, K_g, V_g), so a `transformer`
run fine-tunes as a `longformer` whose outputs before any step are the
transformer's where the window covers the input; BigBird ETC's learned
global tokens start fresh. The kept parameters are logged. A parameter DIR
has and the fine-tune lacks is still one sentence.

lra/ never imports models/: train.py hands `resize` in.
"""

import contextlib
import logging
import os

from flax import nnx
import jax
import numpy as np
import orbax.checkpoint as ocp

from lra.errors import UserError
from lra.train import checkpoints
from lra.train.checkpoints import WHICH, saved_steps

SUBTREE = ('model', 'encoder')  # the model item of a save, its encoder
# Parameter metadata: may be absent from DIR, keeps its initial value (the
# model's own string says what that value is; module docstring).
MISSING = 'init_from_missing'


def source(init_from, which):
  """(which, step) of the checkpoint to read, or one sentence."""
  flag = f'--config.init_from={init_from}'
  if which not in WHICH:
    raise UserError(
      f'--config.init_from_checkpoint={which} is not one of '
      f'{", ".join(WHICH)}; e.g. --config.init_from_checkpoint=best.'
    )
  if not os.path.isdir(init_from):
    raise UserError(
      f'{flag} is not a directory; give the --workdir of a finished '
      'pretraining run.'
    )
  saved = saved_steps(init_from)
  if not saved[which]:
    raise UserError(
      f'{flag} has no {which} checkpoint (saved: latest {saved["latest"]}, '
      f'best {saved["best"]}); give the --workdir of a run that saved one.'
    )
  return which, saved[which][-1]


@contextlib.contextmanager
def _quiet():
  """absl's logger at ERROR for the duration (orbax logs through it)."""
  logger = logging.getLogger('absl')
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _flat(tree, prefix=()):
  """{path of str keys: leaf} of a nested dict (nnx pure dict or orbax
  metadata, whose leaves sit under a 'value' key)."""
  out = {}
  for key, value in tree.items():
    path = prefix + (str(key),)
    if isinstance(value, dict) and set(value) == {'value'}:
      value = value['value']
    if isinstance(value, dict):
      out.update(_flat(value, path))
    else:
      out[path] = value
  return out


def _name(path):
  return '.'.join(path)  # 'encoder.blocks.0.attn.query.kernel'


def _nest(flat):
  out = {}
  for path, leaf in flat.items():
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = {'value': leaf}
  return out


def kept_when_missing(state):
  """{path in the encoder: why} of the model's parameters marked
  `init_from_missing` (module docstring), from the fine-tune's fresh
  (model, optimizer) nnx.State."""
  out = {}
  for path, variable in nnx.to_flat_state(state):
    if path[:2] != (0, SUBTREE[1]) or not hasattr(variable, 'get_metadata'):
      continue
    why = variable.get_metadata().get(MISSING)
    if why is not None:
      out[tuple(str(k) for k in path[1:])] = why
  return out


def read_encoder(init_from, which, step, like, kept=()):
  """The encoder arrays of DIR's checkpoint, {path: array}, placed with the
  sharding of the matching leaf of `like` ({path: array} of the fine-tune's
  encoder; a parameter it lacks, or that DIR lacks and is not in `kept`
  (paths that keep their initial value), is one sentence)."""
  # Orbax reads no metadata through a relative path: make it absolute.
  root = os.path.join(os.path.abspath(init_from), 'checkpoints')
  step_dir = os.path.join(root, which, str(step))
  record = os.path.join(root, 'records', f'{which}_{step}.json')
  problem = checkpoints._problem(step_dir, record)  # pylint: disable=protected-access
  path = os.path.join(step_dir, 'state')
  flag = f'--config.init_from={init_from}'
  if problem:
    raise UserError(
      f'{flag}: its {which} checkpoint at step {step} is incomplete '
      f'({problem}); pretrain again or use --config.init_from_checkpoint='
      f'{"latest" if which == "best" else "best"}.'
    )
  with _quiet():  # orbax warns that train.py's saves have no step metadata
    meta = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
  # Saves made before the items were named hold the model as '0'.
  top = SUBTREE[0] if SUBTREE[0] in meta else '0'
  for key in (top, *SUBTREE[1:]):
    meta = meta.get(key, {}) if isinstance(meta, dict) else {}
  saved = _flat(meta, SUBTREE[1:])
  missing = sorted(set(like) - set(saved) - set(kept))
  extra = sorted(set(saved) - set(like))
  if missing or extra:
    what = (
      f'has no parameter {_name(missing[0])}'
      if missing
      else f'has a parameter {_name(extra[0])} that this model lacks'
    )
    raise UserError(
      f'{flag}: its encoder {what}; fine-tune the same model (attention, '
      'positions, layers, pooling) as the pretraining run.'
    )
  target = {
    p: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=like[p].sharding)
    for p, m in saved.items()
  }
  target = {top: _nest(target)}
  with _quiet():
    restored = ocp.PyTreeCheckpointer().restore(
      path,
      args=ocp.args.PyTreeRestore(
        item=target,
        restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True,
      ),
    )
  return _flat(restored[top])


def _copy_into(state, loaded, like, resize, mismatch):
  """`state` with the arrays `loaded` ({path: array}) put in its model (part
  0) at their paths, fitted by `resize` when their shape differs from
  `like`'s; mismatch(path, saved shape, wanted shape) -> the sentence."""
  pure = nnx.to_pure_dict(state)
  for path, array in loaded.items():
    want = like[path].shape
    if array.shape != want:
      fitted = resize(path, np.asarray(array), want) if resize else None
      if fitted is None:
        raise UserError(mismatch(path, tuple(array.shape), tuple(want)))
      array = fitted.astype(array.dtype)
    array = jax.device_put(array, like[path].sharding)
    node = pure[0]
    for key in path[:-1]:
      node = node[int(key) if key.isdigit() and int(key) in node else key]
    last = path[-1]
    node[int(last) if last.isdigit() and int(last) in node else last] = array
  nnx.replace_by_pure_dict(state, pure)
  return state


def load_encoder(state, init_from, which='best', resize=None):
  """(state with DIR's encoder, step read): `state` is the fresh
  (model, optimizer) nnx.State of the fine-tune. resize(path, array,
  shape) -> an array of `shape` or None (not resizable) handles parameters
  whose shape differs (the learned position table)."""
  which, step = source(init_from, which)
  like = _flat(nnx.to_pure_dict(state)[0][SUBTREE[1]], SUBTREE[1:])
  kept = kept_when_missing(state)
  loaded = read_encoder(init_from, which, step, like, kept)
  fresh = sorted(set(kept) - set(loaded))
  if fresh:
    logging.info(
      '--config.init_from=%s lacks %d parameters this model starts at their '
      'initial value: %s',
      init_from,
      len(fresh),
      ', '.join(f'{_name(p)} ({kept[p]})' for p in fresh[:4])
      + (', ...' if len(fresh) > 4 else ''),
    )

  def mismatch(path, saved, want):
    return (
      f'--config.init_from={init_from}: {_name(path)} has shape {saved} '
      f'there but {want} here; fine-tune the same model sizes (emb_dim, '
      'qkv_dim, mlp_dim, num_heads) as the pretraining run.'
    )

  return _copy_into(state, loaded, like, resize, mismatch), step


def transplant(source_state, state, resize=None, length=None):
  """`state` (a fresh (model, optimizer) state built for another max_length,
  `length`) with every model parameter of `source_state` (same model),
  fitted by `resize` (eval.py --max_length: the learned position table
  extended by copying); a parameter that depends on the length otherwise
  (e.g. Linformer's projections) is one sentence."""
  loaded = _flat(jax.device_get(nnx.to_pure_dict(source_state)[0]))
  like = _flat(nnx.to_pure_dict(state)[0])
  assert set(loaded) == set(like), sorted(set(loaded) ^ set(like))[:3]

  def mismatch(path, saved, want):
    return (
      f'--max_length={length}: {_name(path)} has shape {saved} in the '
      f'checkpoint but {want} at that length (it depends on the length and '
      'cannot be extended); evaluate at the trained max_length.'
    )

  return _copy_into(state, loaded, like, resize, mismatch)
