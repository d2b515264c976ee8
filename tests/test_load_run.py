"""lra.load_run's one step lookup and its sentences (lra/train/load.py),
which eval.py shares: checked on a stand-in for the checkpoint sets."""

import pytest

from lra.errors import UserError
from lra.train.load import find_step, saved_config


class Saved:
  """The two checkpoint sets of a run, as Checkpoints.all_steps gives them."""

  def __init__(self, latest, best):
    self.steps = {'latest': latest, 'best': best}

  def all_steps(self, which):
    return self.steps[which]


RUN = Saved(latest=[40, 50], best=[20])


def test_the_newest_of_the_set_asked_for():
  assert find_step(RUN, 'w', 'best', None) == ('best', 20)
  assert find_step(RUN, 'w', 'latest', None) == ('latest', 50)


def test_a_step_is_looked_for_in_the_other_set_too():
  assert find_step(RUN, 'w', 'best', 50) == ('latest', 50)
  assert find_step(RUN, 'w', 'latest', 20) == ('best', 20)
  assert find_step(RUN, 'w', 'latest', 40) == ('latest', 40)


def test_missing_steps_are_one_sentence_naming_the_saved_ones():
  with pytest.raises(UserError) as e:
    find_step(RUN, 'runs/a', 'best', 30)
  assert str(e.value) == (
    'runs/a has no checkpoint at step 30 (saved: latest [40, 50], best '
    '[20]); give a saved step.'
  )
  with pytest.raises(UserError, match=r'no best checkpoint \(saved: latest'):
    find_step(Saved([10], []), 'runs/a', 'best', None)
  with pytest.raises(UserError, match='which must be one of latest, best'):
    find_step(RUN, 'runs/a', 'last', None)


def test_a_folder_without_a_run_is_one_sentence(tmp_path):
  with pytest.raises(UserError, match='config.json does not exist; give'):
    saved_config(str(tmp_path))
  (tmp_path / 'config.json').write_text('[1, 2]')
  with pytest.raises(UserError, match='not a readable config'):
    saved_config(str(tmp_path))
