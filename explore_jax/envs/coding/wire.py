"""Plain data across the sandbox's trust boundary: the one format values cross it in, both ways.

The tests run in the parent (`sandbox.py`) and call the program, which runs in a sandboxed child
(`_runner.py`), through proxies: the arguments go down and the results come back in this format.
Decoding builds nothing but

  None, bool, int, float, str, bytes, and lists, tuples, dicts, sets and frozensets of them;
  instances of the task's own classes (the classes its setup defines, e.g. LeetCode's ListNode),
    built from the decoding side's class of that name and holding the same kinds of values;
  an iterator over a list (what a generator, or another iterator, a call returned drained into);
  the program's objects the parent holds proxies of, by handle: on the child's side, and on the
    parent's only the proxies it sent (a call's changed arguments may hold them),

so whatever bytes the program's process sends, the parent gets builtin values, compared by builtin
code. Types are checked exactly (`type(x) is int`, never isinstance): a subclass of int, str or list,
or any object with an __eq__ of its own, is refused by the name of its type.

Limits, for each encoded value (one call's arguments, one result):

  MAX_BYTES       bytes of encoding (4 MiB);
  MAX_DEPTH       containers nested in containers (100); the attributes of task objects start again
                  at depth 1 (objects sit in a table, not inside each other, so a linked list of any
                  length stays shallow);
  MAX_COLLISIONS  distinct tuples, frozensets or ints beyond 2**61 that share one hash (32): values
                  built to collide would make every set or dict the tests build of them quadratic.

Format. A value is a tag byte and what follows it; lengths and counts are 4-byte little-endian:

  N T F                       None, True, False
  i <n> <n bytes>             int, two's complement, little-endian
  f <8 bytes>                 float, IEEE 754 binary64 (marshal's own encoding)
  s <n> <UTF-8>               str (lone surrogates pass through)
  b <n> <bytes>               bytes
  l t e z <count> <values>    list, tuple, set, frozenset
  d <count> <key value>...    dict
  g <count> <values>          an iterator, drained (only as the whole value)
  o <index> [<s-value>]       the task object of that index; at its first mention the s-value names
                              its class (indexes count up from the objects both sides already know)
  h <id>                      a handle: an object of the program's, by its number

and a message is a value followed by one dict of attributes (str keys) per task object, in index
order, the objects both sides knew before the message included: that is how a call's changes to the
objects it was given come back.

`sandbox.py` compiles this file and sends the code object to the child with its request, so it
imports nothing but marshal (built in) and keeps to builtins.
"""

import marshal

MAX_BYTES = 4 << 20
MAX_DEPTH = 100
MAX_COLLISIONS = 32
_HASH_MODULUS = (1 << 61) - 1   # an int's hash is the int modulo this: beyond it, ints can collide

_CONTAINER_TAGS = {list: b"l", tuple: b"t", set: b"e", frozenset: b"z"}
PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset})


class WireError(Exception):
  """A value that cannot cross. `kind`: "type" (`detail` names the type), "bytes", "depth",
  "collision" or "malformed" (`detail` says how)."""

  def __init__(self, kind, detail=""):
    super().__init__(kind, detail)
    self.kind = kind
    self.detail = detail


def _count(n):
  return n.to_bytes(4, "little")


def encode(value, classes=frozenset(), refs=None, known=(), iterate=False):
  """`value` in the format above: (data, objects, mutable).

  Args:
    classes: the names of the task's classes, whose instances cross as task objects.
    refs: a function giving the handle number of an object (or None): the parent's proxies.
    known: task objects both sides already hold, in index order.
    iterate: drain `value` when it is an iterator (a call's result).

  Returns the bytes, every task object in index order (`known` first), and whether the value holds
  anything a call could change in place (a list, dict, set or task object).

  Raises WireError; anything an iterator raises while it is drained passes through.
  """
  out = bytearray()
  extend, append = out.extend, out.append
  objects = list(known)
  index = {id(obj): i for i, obj in enumerate(objects)}
  mutable = [False]

  def item(x, depth):
    if len(out) > MAX_BYTES:
      raise WireError("bytes")
    kind = type(x)
    if kind is int:
      size = (x.bit_length() + 8) >> 3
      extend(b"i" + _count(size))
      extend(x.to_bytes(size, "little", signed=True))
    elif kind is str:
      data = x.encode("utf-8", "surrogatepass")
      extend(b"s" + _count(len(data)))
      extend(data)
    elif kind is float:
      append(102)  # f
      extend(marshal.dumps(x)[1:])
    elif x is None:
      append(78)  # N
    elif kind is bool:
      append(84 if x else 70)  # T, F
    elif kind in _CONTAINER_TAGS:
      if depth >= MAX_DEPTH:
        raise WireError("depth")
      if kind is list or kind is set:
        mutable[0] = True
      extend(_CONTAINER_TAGS[kind] + _count(len(x)))
      for y in x:
        item(y, depth + 1)
    elif kind is dict:
      if depth >= MAX_DEPTH:
        raise WireError("depth")
      mutable[0] = True
      extend(b"d" + _count(len(x)))
      for key, y in x.items():
        item(key, depth + 1)
        item(y, depth + 1)
    elif kind is bytes:
      extend(b"b" + _count(len(x)))
      extend(x)
    else:
      handle = refs(x) if refs is not None else None
      if handle is not None:
        extend(b"h" + _count(handle))
      elif kind.__name__ in classes:
        mutable[0] = True
        at = index.get(id(x))
        if at is not None:
          extend(b"o" + _count(at))
        else:
          index[id(x)] = len(objects)
          extend(b"o" + _count(len(objects)))
          objects.append(x)
          item(str(kind.__name__), depth)
      else:
        raise WireError("type", kind.__name__)

  if iterate and type(value) not in PLAIN_TYPES and hasattr(type(value), "__next__"):
    append(103)  # g
    at = len(out)
    extend(_count(0))
    n = 0
    for x in value:
      item(x, 1)
      n += 1
    out[at:at + 4] = _count(n)
  else:
    item(value, 0)
  i = 0
  while i < len(objects):  # the table: encoding attributes may add objects
    attributes = getattr(objects[i], "__dict__", None)
    if type(attributes) is not dict:
      raise WireError("type", type(objects[i]).__name__ + " without a __dict__")
    extend(b"d" + _count(len(attributes)))
    for key, y in attributes.items():
      if type(key) is not str:
        raise WireError("type", type(key).__name__ + " as an attribute name")
      item(key, 1)
      item(y, 1)
    i += 1
  if len(out) > MAX_BYTES:
    raise WireError("bytes")
  return bytes(out), objects, mutable[0]


def decode(data, classes=None, known=(), handles=None):
  """The value `data` encodes: (value, objects), objects being every task object in index order.

  Args:
    classes: class name -> the class to build task objects of (None: none may cross).
    known: task objects this side already holds, in index order: their attributes are overwritten
      with the message's (a call's changes to its arguments), and the value may refer to them.
    handles: handle number -> object (the child's table, or the proxies the parent sent; None: no
      handles may cross).

  Raises WireError on anything but a well-formed message within the limits.
  """
  if len(data) > MAX_BYTES:
    raise WireError("bytes")
  end = len(data)
  objects = list(known)
  buckets = {}
  pos = 0

  def take(n):
    nonlocal pos
    start = pos
    pos += n
    if pos > end:
      raise WireError("malformed", "truncated")
    return data[start:pos]

  def count():
    n = int.from_bytes(take(4), "little")
    if n > end - pos:
      raise WireError("malformed", "a count beyond the data")
    return n

  def guard(x):
    """Refuse the message when too many distinct values of `x`'s hash came in it."""
    try:
      h = hash(x)
    except TypeError:
      return
    seen = buckets.get(h)
    if seen is None:
      buckets[h] = [x]
    elif x not in seen:
      if len(seen) >= MAX_COLLISIONS:
        raise WireError("collision")
      seen.append(x)

  def items(n, depth):
    if depth > MAX_DEPTH:
      raise WireError("depth")
    return [value(depth) for _ in range(n)]

  def value(depth):
    nonlocal pos
    if pos >= end:
      raise WireError("malformed", "truncated")
    tag = data[pos]
    pos += 1
    if tag == 105:  # i
      size = count()
      x = int.from_bytes(take(size), "little", signed=True)
      if size >= 8 and abs(x) >= _HASH_MODULUS:
        guard(x)
      return x
    if tag == 115:  # s
      try:
        return take(count()).decode("utf-8", "surrogatepass")
      except UnicodeDecodeError:
        raise WireError("malformed", "text that is not UTF-8") from None
    if tag == 102:  # f
      return marshal.loads(b"g" + take(8))
    if tag == 78:
      return None
    if tag == 84:
      return True
    if tag == 70:
      return False
    if tag == 108:  # l
      return items(count(), depth + 1)
    if tag == 116:  # t
      x = tuple(items(count(), depth + 1))
      guard(x)
      return x
    if tag == 100:  # d
      n = count()
      if depth + 1 > MAX_DEPTH:
        raise WireError("depth")
      pairs = [(value(depth + 1), value(depth + 1)) for _ in range(n)]
      for key, _ in pairs:
        guard(key)
      try:
        return dict(pairs)
      except TypeError:
        raise WireError("malformed", "an unhashable dict key") from None
    if tag == 101 or tag == 122:  # e, z
      members = items(count(), depth + 1)
      for x in members:
        guard(x)
      try:
        x = set(members) if tag == 101 else frozenset(members)
      except TypeError:
        raise WireError("malformed", "an unhashable set member") from None
      if tag == 122:
        guard(x)
      return x
    if tag == 98:  # b
      return take(count())
    if tag == 103 and depth == 0:  # g
      return iter(items(count(), 1))
    if tag == 111:  # o
      at = int.from_bytes(take(4), "little")
      if at < len(objects):
        return objects[at]
      if at > len(objects) or pos >= end or data[pos] != 115:
        raise WireError("malformed", "an object out of order")
      name = value(depth)
      cls = classes.get(name) if classes is not None else None
      if not isinstance(cls, type):
        raise WireError("type", name)
      try:
        obj = cls.__new__(cls)
      except Exception as error:
        raise WireError("type", f"{name} ({type(error).__name__})") from None
      objects.append(obj)
      return obj
    if tag == 104 and handles is not None:  # h
      at = int.from_bytes(take(4), "little")
      if at not in handles:
        raise WireError("malformed", "an unknown handle")
      return handles[at]
    raise WireError("malformed", f"tag {tag}")

  result = value(0)
  i = 0
  while i < len(objects):
    if pos >= end or data[pos] != 100:
      raise WireError("malformed", "a missing object table")
    attributes = value(0)  # a dict, as the encoder wrote it: its values at depth 1
    if any(type(key) is not str for key in attributes):
      raise WireError("malformed", "an attribute name that is not a str")
    try:
      own = objects[i].__dict__
      own.clear()
      own.update(attributes)
    except (AttributeError, TypeError):
      raise WireError("type", type(objects[i]).__name__ + " without a __dict__") from None
    i += 1
  if pos != end:
    raise WireError("malformed", "bytes after the value")
  return result, objects
