"""``FeatureMap``: everything the library knows about one feature map (component), in one record.

A component module (``components.py``, ``maps.py``, a user's plugin file) defines the map's function and
exports its record; ``catalog.py`` collects the records, and every consumer -- the attention module, the
decoder, the config checks, the Pallas dispatch, ``kernelformer kernels`` -- asks the record, never a
table of names. Adding a map is one function and one record in one file (docs/extending.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

TARGET_KERNELS = ('softmax', 'gaussian', 'none')
STATISTICS = ('row', 'key_max', 'keys', 'tensor')
_NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyz0123456789_')

# The guard of maps whose features carry a data-dependent shift (a key maximum, per row when causal)
# that cancels between numerator and normalizer: their D is exp(-shift) times the unshifted one, so a
# fixed guard of 1e-6 acts at an arbitrary point of the true D (a query whose visible keys lie far below
# the largest key has a small but valid D: B=8, H=8, L=1K, d=64, M=256 gave an output off by 0.25 from
# the float64 estimator). Their guard only has to keep a row with no visible key (D = 0) finite.
SHIFTED_EPS = 1e-30

# What a map estimates at the attention module's d^-1/4 input scale, for maps whose record gives none.
_TARGET_TEXT = {'softmax': 'softmax exp(q.k/sqrt(d))', 'gaussian': 'Gaussian exp(-|q-k|^2/(2 sqrt(d)))',
                'none': 'its own kernel'}


@dataclasses.dataclass(frozen=True)
class FeatureMap:
  """One feature map ``phi_q, phi_k = fn(q, k, proj, *, mask=None, stabilize=True)``.

  Attributes:
    name: the component name (lowercase letters, digits, ``_``; kernels are ``<name>-<sampler>``).
    fn: the component function (contract: ``components.py``'s module docstring).
    target_kernel: what ``phi(q).phi(k)`` estimates: 'softmax' (exp(q.k)), 'gaussian'
      (exp(-|q-k|^2/2)) -- the attention module scales q and k by d^-1/4 first -- or 'none' (the map
      defines its own kernel; no input scale).
    parts: l of Spectraformer eq. 11, features per row of W (M' = parts * M); 0: the map takes no W
      (M' = d). A learned map takes its parameters through ``proj`` and has parts 1.
    positive: features positive by construction (the normalizer is positive too).
    paper: paper and equation, for ``kernelformer kernels`` and docs/kernels.md.
    approximates: the kernel text of its registry kinds ('' = from ``target_kernel``).
    statistic: what a row's features depend on besides the row -- the one field the attention's paths
      follow (``row_wise``, ``causal_shift``, ``whole_tensor`` are derived from it):
      'row': nothing (no key statistic, no shift): the attention forms them one chunk at a time
      (``linear.feature_attention``) unless they are ``positional``;
      'key_max': a per-feature key maximum, the exp stabilizer: ``fn`` takes ``causal_chunk=C`` (and
      ``shift_init=``) and then returns ``(phi_q, phi_k, key_shift)``, features shifted by each row's
      running key max;
      'keys' (default): another statistic over the keys, or unknown: features formed whole;
      'tensor': one over the whole ``[B, H, ...]`` tensor (Skyformer's Performer: one key maximum over
      every example, head, key and feature): ``fn`` is called once with every head in the leading
      axes (W shared by the heads), never a head at a time.
    log_space: a ``components.LogSpaceForm`` (per-row log-magnitudes) for the memory-lean exp path
      (``linear.exp_feature_attention``), or None.
    normalizer_eps: the core's guard on D (``linear.safe_normalizer``): ``|D| < eps`` becomes ``+-eps``;
      ``SHIFTED_EPS`` for maps whose D carries a data-dependent shift (an exp-map's key maximum); a
      negative value is added to every D instead (``den + |eps|``, as Zoology's Based does).
    unit_key_shift: ``f(proj, dtype) -> [..., 1, M']``, a key shift bounding every unit-norm key's
      exponent from W alone (causal RPE on l2-normalized keys, nprf-rpe), or None.
    positional: ``fn`` takes ``positions=(i_q, i_k, M)`` (cosFormer's re-weighting).
    non_causal: why the map has no causal form ('' if it has one): causal attention refuses it.
    sequence_statistics: the map's parameters are means over the whole sequence (OPRF, SADERF), so a
      decoder refuses it (earlier positions would see later tokens).
    feature_dim: ``f(head_dim, num_features, map_dim) -> M'`` where M' is not ``parts * M`` or d.
    pallas_feature: the fused Pallas kernel's feature name ('exp', 'trig', 'elu', 'relu') or ''.
    grid: paired with every weight sampler as ``<name>-<sampler>`` (plus learnable FastFood).
    kind: the registry kind of a map registered on its own ('' = none of its own).
    sampler: with ``kind``: the fixed sampler drawing its W ('' = no random W).
    kind_options: with ``kind``: attention options the kind fixes, as ``(name, value)`` pairs (e.g.
      ``('redraw_every', 0)`` for a W drawn once, as the public code it follows).
    parameters: ``f(module, head_dim, num_heads, *, num_features, map_dim) -> tuple | None``, the
      learned parameters the attention module creates for the map (weights 'map').
    map_dim: the map's width follows the ``map_dim`` option.
    learnable: the learned parameters, for ``kernelformer kernels`` ('' = none).
  """

  name: str
  fn: Callable[..., tuple]
  target_kernel: str
  parts: int
  positive: bool = False
  paper: str = ''
  approximates: str = ''
  statistic: str = 'keys'
  log_space: Any = None
  normalizer_eps: float = 1e-6
  unit_key_shift: Optional[Callable[..., Any]] = None
  positional: bool = False
  non_causal: str = ''
  sequence_statistics: bool = False
  feature_dim: Optional[Callable[..., int]] = None
  pallas_feature: str = ''
  grid: bool = False
  kind: str = ''
  sampler: str = ''
  kind_options: tuple[tuple[str, Any], ...] = ()
  parameters: Optional[Callable[..., Any]] = None
  map_dim: bool = False
  learnable: str = ''

  def __post_init__(self):
    name = self.name
    if not isinstance(name, str) or not name or set(name) - _NAME_CHARS:
      raise ValueError(f'component name {name!r}: use lowercase letters, digits and _ (no "-": '
                       'kernels are named <component>-<sampler>)')
    if not callable(self.fn):
      raise TypeError(f'component {name!r}: {self.fn!r} is not callable')
    if self.target_kernel not in TARGET_KERNELS:
      raise ValueError(f"component {name!r}: target_kernel must be 'softmax', 'gaussian' or 'none', "
                       f'got {self.target_kernel!r}')
    if not isinstance(self.parts, int) or isinstance(self.parts, bool) or self.parts < 0:
      raise ValueError(f'component {name!r}: parts must be an int >= 0 (0: no projection), '
                       f'got {self.parts!r}')
    if self.statistic not in STATISTICS:
      raise ValueError(f'component {name!r}: statistic must be one of {", ".join(STATISTICS)}, '
                       f'got {self.statistic!r}')

  @property
  def row_wise(self) -> bool:
    """A row's features depend on that row alone (and no positions): formed one chunk at a time."""
    return self.statistic == 'row' and not self.positional

  @property
  def causal_shift(self) -> bool:
    """``fn`` takes ``causal_chunk=`` and returns each row's running key max as a third value."""
    return self.statistic == 'key_max'

  @property
  def whole_tensor(self) -> bool:
    """``fn`` takes a statistic over every head at once (called once with heads in the leading axes)."""
    return self.statistic == 'tensor'

  @property
  def uses_projection(self) -> bool:
    """Whether ``fn`` consumes a ``proj`` (a W, or the map's learned parameters)."""
    return self.parts > 0

  @property
  def kernel_text(self) -> str:
    """What the map computes or estimates at the attention module's input scale."""
    return self.approximates or _TARGET_TEXT[self.target_kernel]

  def feature_count(self, num_features: int, head_dim: int, *, map_dim: int = 0) -> int:
    """M', the feature dimension ``fn`` returns for M = ``num_features`` rows of W."""
    if self.feature_dim is not None:
      return self.feature_dim(head_dim, num_features=num_features, map_dim=map_dim)
    return self.parts * num_features if self.parts else head_dim
