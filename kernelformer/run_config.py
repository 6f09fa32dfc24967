"""The run's typed record, ``Run`` (``Model``, ``Attention``, ``Optim``, ``Eval``), built once from the
user's ConfigDict by ``of`` (``training.validate.validate_config`` returns it). The ConfigDict stays the
user's interface and what run.json, config.json and results.json record; a new config's values are
configs/common.py's. A default here is what a field's absence means (a run recorded before the field
existed); tests/training/test_run_config.py checks each against configs/common.py."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections


class ConfigError(ValueError):
  """A config field with a wrong type, an out-of-range value or an impossible combination (one line)."""


@dataclasses.dataclass(frozen=True)
class Attention:
  """``config.model.attention``: the kind resolved once to its registry spec (plugins loaded first)."""
  spec: Any                        # registry.KernelSpec of ``kind`` (aliases resolved: ``spec.name``)
  options: Mapping[str, Any]       # the section as a dict: kind, rpe, plugin, options (None = the kind's default)
  rpe: bool = False                # Luo et al.'s relative-position bias
  plugin: str = ''                 # FILE.py or module(s) imported first (docs/extending.md)

  @property
  def position_bias(self) -> bool:
    """Whether the model creates a relative-position bias for this kind."""
    return bool(self.rpe) or self.spec.requires_position_bias

  def option(self, name: str) -> Any:   # None: unset, the kind's own default
    return self.options.get(name)

  @property
  def distills(self) -> bool:
    """Hedgehog's attention distillation (``distill_weight`` > 0): the step adds the sown losses."""
    return (self.option('distill_weight') or 0) > 0


@dataclasses.dataclass(frozen=True)
class Model:
  emb_dim: int
  num_layers: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  dropout_rate: float
  pos_encoding: str
  pooling: str
  rpe_per_layer: bool
  dtype: str
  attention: Attention
  remat: str = 'none'
  scan_layers: bool = False
  qkv_bias: bool = True
  param_init: str = 'lra'          # flax's layers as LRA builds them (layers.LayerDefaults)
  layer_norm_eps: float = 1e-6
  gelu_approximate: bool = True
  retrieval_head: str = 'nli'
  short_conv: int = 0              # the decoder's Zoology options (decoder.py): no BaseConv layers
  state_mixer: str = 'mlp'
  tie_embeddings: bool = True


@dataclasses.dataclass(frozen=True)
class Optim:
  learning_rate: float
  schedule: str
  warmup_steps: int
  weight_decay: float
  b1: float
  b2: float
  eps: float
  grad_clip_norm: float
  grad_accum_steps: int
  decay_mask: str = 'matrices'     # training/optim.py decay_mask
  grad_clip_value: float = 0.0


@dataclasses.dataclass(frozen=True)
class Eval:
  test_checkpoint: str = 'best'    # training/selection.py


@dataclasses.dataclass(frozen=True)
class Run:
  seed: int
  data: ml_collections.ConfigDict  # the task's own fields (lra_tasks reads them)
  model: Model
  optim: Optim
  batch_size: int
  eval_batch_size: int
  num_train_steps: int
  eval_every: int
  max_eval_batches: int
  checkpoint_every: int
  keep_checkpoints: int
  log_every: int
  progress: bool
  eval: Eval = Eval()
  profile_steps: int = 0
  on_nonfinite: str = 'stop'
  watchdog_step_s: float = 0.0     # 0 = off: a config without the watchdog ran without one
  watchdog_compile_s: float = 0.0
  allow_config_change: bool = False
  reevaluate: bool = False
  start_over: bool = False
  early_stop_accuracy: float = 0.0   # no stopping rule (configs/mqar.py sets one)
  population: tuple = ()             # members' overrides: population_run trains them, not one run

  @property
  def policy(self) -> str:   # float16 trains under a loss scale: its non-finite steps are skipped
    return 'skip' if self.model.dtype == 'float16' else self.on_nonfinite

  @property
  def test_batch_size(self) -> int:   # eval_batch_size 0 = batch_size
    return self.eval_batch_size or self.batch_size


# The task's data fields whose absence means one value (lra_tasks reads them; the fingerprint compares).
DATA_LEGACY: dict[str, Any] = {
    # Absent: an MQAR run before it followed Zoology's generator, which is now ``mqar_legacy``.
    'query_targets': None,
    'eval_context': 'disjoint',   # enwik8's test scheme before lm_eval.py (non-overlapping windows)
    'eval_stride': 0,
    'pixel_padding': 'none',      # pixels + 1, nothing masked
}

_SECTIONS = {'model': Model, 'optim': Optim, 'eval': Eval}


def legacy(name: str) -> Any:
  """What the absence of the dotted field ``name`` means (its record default)."""
  section, _, field = name.rpartition('.')
  if section == 'data':
    return DATA_LEGACY[field]
  cls = _SECTIONS.get(section, Run)
  f = {f.name: f for f in dataclasses.fields(cls)}[field]
  if f.default is dataclasses.MISSING:
    raise KeyError(f'{name} has no default: every config defines it')
  return f.default


def _fields(cls, node: Any, prefix: str, **given) -> dict[str, Any]:
  out = dict(given)
  for f in dataclasses.fields(cls):
    if f.name in given:
      continue
    if f.name in node:
      out[f.name] = node[f.name]
    elif f.default is dataclasses.MISSING:
      raise ConfigError(f'config.{prefix}{f.name} is missing: the config file must define it '
                        '(see configs/common.py)')
  return out


def attention_of(node: Any) -> Attention:
  """The attention section resolved: the plugin imported, then the kind looked up (an unknown kind
  raises the registry's one line listing the valid ones); rpe on a kind without a position bias fails."""
  from kernelformer import plugins, registry  # pylint: disable=g-import-not-at-top
  options = node.to_dict() if hasattr(node, 'to_dict') else dict(node)
  fields = _fields(Attention, options, 'model.attention.', spec=None, options=options)
  plugins.load(fields.get('plugin'))
  attention = Attention(**{**fields, 'spec': registry.get(options['kind'])})
  if attention.position_bias and not attention.spec.supports_position_bias:
    kinds = ', '.join(s.name for s in registry.specs() if s.supports_position_bias)
    raise ConfigError(f'config.model.attention.rpe=True is invalid for kind {attention.spec.name!r}, '
                      f'which takes no relative-position bias; kinds that do: {kinds}')
  return attention


def of(config: Any) -> Run:
  """The record of ``config`` (a ConfigDict, or a results.json / config.json dict): absent fields
  take their defaults, the attention kind is resolved (``attention_of``)."""
  model = Model(**_fields(Model, config['model'], 'model.',
                          attention=attention_of(config['model']['attention'])))
  sections = {name: cls(**_fields(cls, config[name] if name in config else {}, name + '.'))
              for name, cls in _SECTIONS.items() if name != 'model'}
  data = config['data']
  if not isinstance(data, ml_collections.ConfigDict):
    data = ml_collections.ConfigDict(data)
  return Run(**_fields(Run, config, '', model=model, data=data, **sections))
