"""A population trains each member as its single run would (``kernelformer/training/population.py``).

Each member's parameters after ``STEPS`` steps are compared with its single run's (``steps_lib.build_steps``'
jitted loop step over ``TrainBatches`` of its seed). Tolerance: ``ATOL`` absolute on every leaf. vmap
batches the member axis into XLA's fusions and dot products, which changes the order of float32
reductions (a population of one runs the single run's program and is compared bitwise); measured
differences after 50 steps are 2e-7 to 4e-7 (a few float32 ulps of the parameters); ``ATOL`` leaves room
for their growth and still fails at a single wrong step (updates are lr ~1e-3 per step). One leaf is
left out: the softmax attention's key bias, whose gradient is zero in exact arithmetic (q.b adds the
same logit to every key of a query) and rounding noise in float32, which Adam turns into updates of
+-lr -- different in any two programs, the single run against itself under another fusion included.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from configs import listops
from configs import mqar
from configs import retrieval
from kernelformer import run_config
from kernelformer.training import input_pipeline
from kernelformer.training import population
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from lra_tasks import fixtures

STEPS = 50
ATOL = 2e-5
CONFIGS = {'listops': listops, 'retrieval': retrieval, 'mqar': mqar}
# Every field a population may vary, spread over three members (each member its own data order).
THREE = [{'seed': 0},
         {'seed': 1, 'optim.learning_rate': 1e-3, 'optim.warmup_steps': 3, 'model.dropout_rate': 0.1,
          'optim.b1': 0.8, 'optim.b2': 0.99},
         {'seed': 2, 'optim.weight_decay': 0.1, 'model.dropout_rate': 0.2,
          'model.attention.attention_dropout': 0.1}]


def _config(task, tmp_path, steps=STEPS):
  c = CONFIGS[task].get_config('tiny')
  c.data.data_dir = str(tmp_path / 'data')
  c.progress = False
  c.num_train_steps = steps
  if task == 'retrieval':
    fixtures.write_retrieval_fixture(str(tmp_path / 'data'), n_per_split=8, seed=0)
  task_, info = trainer.prepare_data(run_config.of(c), True)
  return c, info, task_.source(c.data, 'train')


def _single(config, info, source, steps, devices):
  parts, state = steps_lib.build_steps(run_config.of(config), info, devices)
  batches, window = input_pipeline.TrainBatches(source, config.batch_size, config.seed), \
      steps_lib.empty_window()
  for s in range(steps):
    state, window = parts['loop_step'](state, window, batches.batch(s))
  return state, window


def _run(pop, state, window, steps):
  for s in range(steps):
    state, window = pop.step(state, window, pop.batch(s), *pop.extra())
  return state, window


def _leaves(params):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)
          if not ('attention' in jax.tree_util.keystr(p) and "['key']['bias']" in jax.tree_util.keystr(p))}


def _check(task, tmp_path, overrides, positions, *, devices=None, single_devices=None, steps=STEPS):
  c, info, source = _config(task, tmp_path, steps)
  pop, state, window = population.build(c, info, source, population=overrides, devices=devices)
  state, window = _run(pop, state, window, steps)
  for i in positions:
    single, single_window = _single(pop.configs[i], info, source, steps,
                                    single_devices or jax.devices()[:1])
    member = pop.member(state, i)
    assert int(member.step) == steps
    got, want = _leaves(member.params), _leaves(single.params)
    for name in want:
      np.testing.assert_allclose(got[name], want[name], rtol=0, atol=ATOL, err_msg=f'member {i} {name}')
    loss = steps_lib.window_values(pop.member(window, i))['loss']
    np.testing.assert_allclose(loss, steps_lib.window_values(single_window)['loss'], rtol=1e-5)
  return pop, state


def test_population_of_one_is_the_single_run_bitwise(tmp_path):
  c, info, source = _config('listops', tmp_path)
  with c.unlocked():
    c.population = [{'seed': 3}]        # the config's own field
  pop, state, _ = population.build(c, info, source, devices=jax.devices()[:1])
  assert 'population' not in pop.configs[0] and pop.configs[0].seed == 3
  state, _ = _run(pop, state, _, STEPS)
  single, _ = _single(pop.configs[0], info, source, STEPS, jax.devices()[:1])
  jax.tree.map(np.testing.assert_array_equal, pop.member(state, 0), single)


@pytest.mark.parametrize('task', sorted(CONFIGS))
def test_three_members_equal_their_single_runs(tmp_path, task):
  overrides = THREE if task != 'mqar' else [
      {k: v for k, v in m.items() if k != 'model.attention.attention_dropout'} for m in THREE]
  _check(task, tmp_path, overrides, (0, 1, 2), devices=jax.devices()[:1])


def test_two_float16_members_equal_their_single_runs_and_keep_their_own_loss_scale(tmp_path,
                                                                                   monkeypatch):
  """Under float16 each member carries torch's loss scale (``optim.loss_scaled``); with a growth
  interval of 3 it moves within the run, and each member's is its single run's."""
  from kernelformer.training import optim as optim_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(optim_lib, 'LOSS_SCALE_GROWTH_INTERVAL', 3)
  c, info, source = _config('listops', tmp_path, 12)
  with c.unlocked():
    c.model.dtype = 'float16'
  pop, state, window = population.build(c, info, source, population=THREE[:2],
                                        devices=jax.devices()[:1])
  state, window = _run(pop, state, window, 12)
  for i in (0, 1):
    single, single_window = _single(pop.configs[i], info, source, 12, jax.devices()[:1])
    member = pop.member(state, i)
    assert float(member.opt_state.scale) == float(single.opt_state.scale) != 2.0 ** 16
    assert int(member.opt_state.good_steps) == int(single.opt_state.good_steps)
    got, want = _leaves(member.params), _leaves(single.params)
    for name in want:
      np.testing.assert_allclose(got[name], want[name], rtol=0, atol=ATOL, err_msg=f'member {i} {name}')
    assert steps_lib.window_values(pop.member(window, i))['skipped'] == \
        steps_lib.window_values(single_window)['skipped']


def test_eight_members_first_middle_last(tmp_path):
  overrides = [{'seed': s, 'optim.learning_rate': 1e-3 * (1 + s % 3)} for s in range(8)]
  _check('listops', tmp_path, overrides, (0, 4, 7), devices=jax.devices()[:1])


def test_eight_members_on_eight_devices(tmp_path):
  """The conftest forces 8 CPU devices: one member per device."""
  assert len(jax.devices()) >= 8
  pop, state = _check('listops', tmp_path, [{'seed': s} for s in range(8)], (0, 7),
                      devices=jax.devices()[:8])
  assert dict(pop.mesh.shape) == {'members': 8, 'data': 1}
  assert len({d for d in state.params['head_out']['kernel'].sharding.device_set}) == 8
  assert state.params['head_out']['kernel'].addressable_shards[3].data.shape[0] == 1


def test_two_members_by_four_way_data(tmp_path):
  """2 members x 4-way data parallel within each; the single runs on 4 devices too."""
  pop, _ = _check('listops', tmp_path, THREE[:2], (0, 1), devices=jax.devices()[:8],
                  single_devices=jax.devices()[:4])
  assert dict(pop.mesh.shape) == {'members': 2, 'data': 4}


@pytest.mark.parametrize('overrides, field', [
    ([{'seed': 0}, {'model.num_layers': 2}], "'model.num_layers'"),
    ([{'batch_size': 16}], "'batch_size'"),
    ([{'optim.learning_rate': 'fast'}], 'optim.learning_rate'),
    ([{'seed': 0}, 3], 'config.population[1]'),
])
def test_fields_that_change_the_program_are_refused(tmp_path, overrides, field):
  c = listops.get_config('tiny')
  with pytest.raises(population.PopulationError) as e:
    population.members(c, overrides)
  assert field in str(e.value) and '\n' not in str(e.value)
  with pytest.raises(population.PopulationError, match='empty'):
    population.members(c, [])


def test_the_sweeps_step_bytes_are_the_compiled_steps_temp_argument_and_output(tmp_path):
  """``sweeps.step_bytes`` (what packing fits) reads the executable ``Population.compile`` gives, the one
  the trainer runs and records in results.json: temp + argument + output of its memory analysis."""
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  from kernelformer.training import metrics  # pylint: disable=g-import-not-at-top
  config, info, source = _config('listops', tmp_path)
  config.population = [{'seed': 0}, {'seed': 1}]
  pop, state, window = population.build(config, info, source)
  compiled = pop.compile(state, window, pop.batch(0))
  m = compiled.memory_analysis()
  total = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
  assert metrics.memory_of(compiled, total=True) == total == sum(
      v for k, v in metrics.memory_of(compiled).items() if k != 'generated_code_size_in_bytes')
  assert sweeps.step_bytes(config) == total
