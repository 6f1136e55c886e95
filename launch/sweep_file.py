"""Reading a sweep file (launch/sweep.py): its arms, the ones its `product` and `zip` make, and every check a
sweep makes before it launches anything.

A sweep file (a protocol: configs/protocols/, configs/sweeps/) defines `get_protocol()` returning a dict (or a
ConfigDict, whose keys cannot hold the dots of product/zip keys):
  arms         [{"name": ..., "config": "configs/x.py[:variant]" (relative to the repo; default: `config`),
                 "overrides": ["--config.a.b=v", ...]}, ...]
  config       the config file[:variant] of the arms that `product` and `zip` make
  product      {"config.a.b": [v1, v2], "config.c": {"label1": v1, "label2": v2}, ...}: an arm for every
               combination of the axes' values (the first axis varies slowest)
  zip          {"config.a.b": [v1, v2], "config.c.d": [w1, w2]}: values that go together, one row per arm (equal
               lengths); with `product`, the rows are one more axis of it (the last)
  seeds        RL seeds (a list, or a count n for 0..n-1): --config.seed=S
  warm_starts  warm-start seeds (list or count): --config.sft.seed=W; runs with the same W share the cached warm start
  overrides    ["--config.a.b=v", ...] common to every arm (iterations, tasks)
`arms`, `product` and `zip` may come together (explicit arms first). An arm that product/zip makes has the
overrides --config.a.b=v of its values (scalars: bool, int, float, str), and its name joins its values in axis
order with "_": a label where the axis gives {label: value}, else key=value with the key's last part (more
parts where two axes share it) and the value's characters other than letters, digits and . = + - made "-".
  {"config": "configs/sge_coding.py",
   "product": {"config.sge.p_failure": [0, 0.25], "config.rl.loss.eps_high": [0.2, 0.28]}}
makes p_failure=0_eps_high=0.2, p_failure=0_eps_high=0.28, p_failure=0.25_eps_high=0.2 and
p_failure=0.25_eps_high=0.28. Axis keys must be fields of `config` (checked by loading it), not set by the sweep
(seeds) nor by `overrides`.
"""

import importlib.util
import itertools
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KEYS = ("arms", "config", "product", "zip", "seeds", "warm_starts", "overrides")  # of a sweep file's dict
RESERVED = ("--config.seed=", "--config.sft.seed=", "--workdir=", "--config=")
AXIS = re.compile(r"config(\.[A-Za-z_][A-Za-z0-9_]*)+")  # a product / zip key: a config field's path
UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")  # characters a made arm name never holds (commas separate --only's names)
MAX_NAME = 120  # characters of a made arm name; longer ones want labels


class ProtocolError(ValueError):
  pass


def _resolve(path: str) -> str:
  """`path` as given (from the current directory), else relative to the repository root."""
  return path if os.path.exists(path) else os.path.join(REPO, path)


def _exec_file(path: str, name: str):
  """The module of the Python file at `path`, imported with the repository root on sys.path (configs/)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(REPO)
  return module


def _axis(where: str, key, values) -> list[tuple[str | None, object]]:
  """One product / zip axis as [(label or None, value)]: from a list of values or a {label: value} dict."""
  if not isinstance(key, str) or not AXIS.fullmatch(key):
    raise ProtocolError(f"{where}: {key!r} is not a config field path (config.a.b)")
  if key in ("config.seed", "config.sft.seed"):
    raise ProtocolError(f"{where}: {key} is set by the sweep (seeds and warm_starts come from the protocol)")
  if isinstance(values, dict):
    options = list(values.items())
    for label, _ in options:
      if not isinstance(label, str) or not label or UNSAFE.search(label) or label.startswith("."):
        raise ProtocolError(f"{where}: {key}: label {label!r} is not a name (letters, digits, . _ = + -)")
  elif isinstance(values, (list, tuple)):
    options = [(None, v) for v in values]
  else:
    raise ProtocolError(f"{where}: {key} needs a list of values or a {{label: value}} dict, not {values!r}")
  if not options:
    raise ProtocolError(f"{where}: {key} has no values")
  for _, value in options:
    if not isinstance(value, (bool, int, float, str)):
      raise ProtocolError(f"{where}: {key}: {value!r} is not a bool, int, float or str (set it in an arm instead)")
  return options


def _short_keys(keys: list[str]) -> dict[str, str]:
  """Each key's shortest tail of dotted parts that no other key ends with: p_failure, loss.clip beside x.clip."""
  parts = {key: key.split(".")[1:] for key in keys}
  short = {}
  for key, mine in parts.items():
    n = next((n for n in range(1, len(mine)) if all(theirs[-n:] != mine[-n:] for other, theirs in parts.items()
                                                    if other != key)), len(mine))
    short[key] = ".".join(mine[-n:])
  return short


def grid_arms(config: str, product: dict, zipped: dict) -> list[dict]:
  """The arms of a product and/or zip of override axes (the module docstring gives the rules), in order."""
  for what, axes in (("product", product), ("zip", zipped)):
    if not isinstance(axes, dict):
      raise ProtocolError(f"{what} must be a dict of config.a.b: values, not {axes!r}")
  both = [key for key in product if key in zipped]
  if both:
    raise ProtocolError(f"{both[0]} is in both product and zip")
  axes = [[[(key, label, value)] for label, value in _axis("product", key, values)]
          for key, values in product.items()]
  if zipped:
    columns = {key: _axis("zip", key, values) for key, values in zipped.items()}
    lengths = {key: len(column) for key, column in columns.items()}
    if len(set(lengths.values())) > 1:
      raise ProtocolError("zip needs lists of one length: " + ", ".join(f"{k} has {n}" for k, n in lengths.items()))
    axes.append([[(key, *columns[key][i]) for key in columns] for i in range(len(next(iter(columns.values()))))])
  short = _short_keys([*product, *zipped])
  arms = []
  for combination in itertools.product(*axes):
    settings = [setting for option in combination for setting in option]
    name = "_".join(label or f"{short[key]}={UNSAFE.sub('-', str(value))}" for key, label, value in settings)
    if len(name) > MAX_NAME:
      raise ProtocolError(f"arm name {name[:60]}... is {len(name)} characters: give the axes labels "
                          "({label: value} instead of [value, ...])")
    arms.append({"name": name, "config": config, "overrides": [f"--{key}={value}" for key, _, value in settings]})
  return arms


def check_fields(config: str, keys: list[str]) -> None:
  """Raises ProtocolError naming the first of `keys` (config.a.b) that is not a field of `config`, so a typo is
  found by a dry run rather than by every run failing."""
  path, _, variant = config.partition(":")
  try:
    module = _exec_file(os.path.join(REPO, path), "_sweep_config")
    c = module.get_config(variant) if ":" in config else module.get_config()
  except Exception as e:  # noqa: BLE001 - whatever a config file raises, name it
    raise ProtocolError(f"config {config!r} does not load: {type(e).__name__}: {e}") from e
  for key in keys:
    node, parts = c, key.split(".")
    for i, part in enumerate(parts[1:], 2):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError, IndexError):
        raise ProtocolError(f"{key} is not a field of {config} (it has no {'.'.join(parts[:i])})") from None


def load_protocol(path: str) -> dict:
  """The checked dict of the sweep (protocol) file at `path`, every arm explicit."""
  path = _resolve(path)
  if not os.path.isfile(path):
    raise ProtocolError(f"no protocol file {path}")
  module = _exec_file(path, "_protocol")
  if not hasattr(module, "get_protocol"):
    raise ProtocolError(f"{path} defines no get_protocol()")
  protocol = module.get_protocol()
  protocol = protocol.to_dict() if hasattr(protocol, "to_dict") else dict(protocol)
  unknown = set(protocol) - set(KEYS)
  if unknown:
    raise ProtocolError(f"unknown protocol keys {sorted(unknown)}; known: {', '.join(KEYS)}")

  def seeds(key):
    value = protocol.get(key, 1 if key == "warm_starts" else None)
    if value is None:
      raise ProtocolError(f"the protocol names no {key}")
    value = list(range(value)) if isinstance(value, int) else [int(v) for v in value]
    if not value or len(set(value)) != len(value):
      raise ProtocolError(f"{key} must be distinct integers, at least one: {value}")
    return value

  def overrides(values, where):
    values = list(values or ())
    for v in values:
      if not isinstance(v, str) or not v.startswith("--config.") or "=" not in v:
        raise ProtocolError(f"{where}: override {v!r} is not of the form --config.a.b=value")
      if v.startswith(RESERVED):
        raise ProtocolError(f"{where}: {v!r} is set by the sweep (seeds and workdir come from the protocol)")
    return values

  def config_file(config):
    return bool(config) and isinstance(config, str) and os.path.isfile(os.path.join(REPO, config.split(":")[0]))

  base, product, zipped = protocol.get("config"), protocol.get("product") or {}, protocol.get("zip") or {}
  common = overrides(protocol.get("overrides"), "common overrides")
  if base is not None and not config_file(base):
    raise ProtocolError(f"config: no config file {base!r} in {REPO}")
  grid = []
  if product or zipped:
    if base is None:
      raise ProtocolError("product and zip make arms of `config`, and the protocol names none")
    grid = grid_arms(base, product, zipped)
    keys = [*product, *zipped]
    twice = [key for key in keys if any(o.startswith(f"--{key}=") for o in common)]
    if twice:
      raise ProtocolError(f"{twice[0]} is set by both the common overrides and product/zip")
    check_fields(base, keys)

  arms = []
  for arm in [*(protocol.get("arms") or ()), *grid]:
    arm = dict(arm)
    name, config = arm.get("name"), arm.get("config") or base
    if not name or not isinstance(name, str) or os.sep in name or "," in name or name.startswith(".") \
        or name == "compare":
      raise ProtocolError(f"bad arm name {name!r} (a directory name without commas, not 'compare')")
    if not config_file(config):
      raise ProtocolError(f"arm {name!r}: no config file {config!r} in {REPO}")
    arms.append({"name": name, "config": config, "overrides": overrides(arm.get("overrides"), f"arm {name!r}")})
  if not arms:
    raise ProtocolError("the protocol has no arms")
  names = [a["name"] for a in arms]
  if len(set(names)) != len(names):
    raise ProtocolError(f"arm names repeat: {sorted({n for n in names if names.count(n) > 1})}")
  return {"arms": arms, "seeds": seeds("seeds"), "warm_starts": seeds("warm_starts"), "overrides": common}
