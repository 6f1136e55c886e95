"""The tests' side of an attempt (sandbox.py): the tests compiled with their asserts rewritten, the names they
read from the program, and `judge`, which runs the task's setup and the tests here against the program's proxies
and says what the first failure was. Nothing here runs the program's code: every call goes through the
`_attempt.Attempt`. No jax here: the sandbox runs in actor processes.
"""

from __future__ import annotations

import ast
import builtins
import functools
import threading
from typing import Any, Sequence

from explore_jax.envs.coding._attempt import Attempt, AttemptOver, ProgramError

_ASSERT_MARK = "__explore_jax_assert__"   # a rewritten assert's message tuple starts with it
_GOT = "__explore_jax_got__"
_BUILTIN_NAMES = frozenset(dir(builtins))

# CPython 3.11 keeps the AST converter's recursion depth per interpreter, not per thread: when a
# thread switch lands inside a conversion (a finaliser running Python code is enough), a concurrent
# ast.parse or compile(tree) fails with "SystemError: AST constructor recursion depth mismatch"
# (python/cpython#106905). Environments run in threads, so every tree here goes through one lock.
AST_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
  """`ast.parse`, safe to call from several threads at once."""
  with AST_LOCK:
    return ast.parse(source, filename)


class _AssertRewriter(ast.NodeTransformer):
  """`assert a == b` -> `assert (got := a) == b, (MARK, "assert a == b", got)`; others keep their
  test and get (MARK, source) as message, so the runner can say which assert failed."""

  def visit_Assert(self, node: ast.Assert) -> ast.Assert:
    source = "assert " + ast.unparse(node.test)
    if len(source) > 200:
      source = source[:197] + "..."
    test = node.test
    parts: list[ast.expr] = [ast.Constant(_ASSERT_MARK), ast.Constant(source)]
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
      got = ast.NamedExpr(target=ast.Name(_GOT, ast.Store()), value=test.left)
      test = ast.Compare(left=got, ops=test.ops, comparators=test.comparators)
      parts.append(ast.Name(_GOT, ast.Load()))
    rewritten = ast.copy_location(ast.Assert(test=test, msg=ast.Tuple(parts, ast.Load())), node)
    return ast.fix_missing_locations(rewritten)


@functools.lru_cache(maxsize=8192)
def compile_trusted(source: str, filename: str):
  """A test's or setup's code object, asserts rewritten (tests come from tasks, not the model)."""
  try:
    tree = _AssertRewriter().visit(parse_python(source, filename))
    with AST_LOCK:
      return compile(tree, filename, "exec", dont_inherit=True)
  except (SyntaxError, ValueError) as e:
    raise ValueError(f"{filename} does not compile: {e}") from None



@functools.lru_cache(maxsize=8192)
def names_used(source: str) -> frozenset[str]:
  """The names a test reads that it does not bind at its top level and that are not builtins."""
  tree = parse_python(source)
  loaded = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
  bound = set()
  for statement in tree.body:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      bound.add(statement.name)
    elif isinstance(statement, (ast.Import, ast.ImportFrom)):
      bound.update(alias.asname or alias.name.partition(".")[0] for alias in statement.names)
    else:
      bound.update(node.id for node in ast.walk(statement)
                   if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store))
  return frozenset(loaded - bound - _BUILTIN_NAMES)


@functools.lru_cache(maxsize=1024)
def setup_classes(setup: str) -> tuple[str, ...]:
  """The classes the setup defines at its top level: the task's classes, which may cross."""
  if not setup.strip():
    return ()
  try:
    tree = parse_python(setup)
  except SyntaxError:
    return ()
  return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))


# ---- messages -------------------------------------------------------------------------------------


def _short_repr(value: Any, limit: int = 120) -> str:
  try:
    text = str(repr(value))
  except Exception:
    text = f"<{type(value).__name__} that cannot be shown>"
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _exception_line(error: BaseException) -> str:
  if isinstance(error, ProgramError):
    return error.line  # the child cut the text
  try:
    text = str(error)
  except Exception:
    text = ""
  if len(text) > 300:
    text = text[:297] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _collapse(frames: Sequence[str]) -> list[str]:
  """Frames with runs of one frame collapsed, as Python's tracebacks do."""
  lines: list[str] = []
  repeats = 0
  for frame in [*frames, None]:
    if lines and frame == lines[-1]:
      repeats += 1
      continue
    if repeats:
      lines.append(f"  [Previous line repeated {repeats} more times]")
      repeats = 0
    if frame is not None:
      lines.append(frame)
  return lines


def _describe(error: BaseException, stdin: str | None, sources: dict[str, str]) -> str:
  """A failure's message: a rewritten assert's source (and value), or the last lines of the
  traceback through the tests and, for a call that failed, the program."""
  try:
    args = error.args if isinstance(error, AssertionError) else ()
    if (not isinstance(error, ProgramError) and len(args) == 1 and type(args[0]) is tuple
        and len(args[0]) in (2, 3) and args[0][0] == _ASSERT_MARK):
      text = str(args[0][1])
      if len(args[0]) == 3:
        text += f" (got {_short_repr(args[0][2])})"
    else:
      frames = []
      tb = error.__traceback__
      while tb is not None:
        code = tb.tb_frame.f_code
        source = sources.get(code.co_filename)
        if source is not None:
          lines = source.splitlines()
          number = tb.tb_lineno or 0
          line = lines[number - 1].strip() if 0 < number <= len(lines) else ""
          frames.append(f'  File "{code.co_filename}", line {number}, in {code.co_name}'
                        + (f"\n    {line}" if line else ""))
        tb = tb.tb_next
      if isinstance(error, ProgramError):
        frames.extend(error.frames)
      text = "\n".join(_collapse(frames)[-3:] + [_exception_line(error)])
    return f"On input {_short_repr(stdin, 60)}: {text}" if stdin is not None else text
  except Exception:
    return type(error).__name__


# ---- the tests -------------------------------------------------------------------------------------


def judge(attempt: Attempt, tests: list[tuple], setup_code, setup: str,
          class_names: tuple[str, ...]) -> tuple[list[bool], str]:
  """Run the setup and the tests here, the program's names bound to proxies: (one bool per test
  run, the first failure's message). Stops when the attempt is over."""
  namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
  sources = {"<setup>": setup}
  sources.update((f"<{name}>", source) for name, _, source, _ in tests)
  if setup_code is not None:
    try:
      exec(setup_code, namespace)
    except Exception as error:
      attempt.over = ("crashed", "The task's setup raised an exception:\n"
                      + _describe(error, None, sources))
      return [], ""
  attempt.classes = {name: namespace[name] for name in class_names
                     if isinstance(namespace.get(name), type)}
  attempt.class_names = frozenset(attempt.classes)
  try:
    attempt.bind(namespace)
  except AttemptOver:
    return [], ""
  base = dict(namespace)
  passed: list[bool] = []
  message = ""
  for name, code, _, stdin in tests:
    attempt.test = name
    ok = False
    try:
      if stdin is None:
        exec(code, namespace)
      else:
        scope = dict(base)
        scope["__output__"] = attempt.stdin(stdin)
        exec(code, scope)
      ok = attempt.over is None
    except AttemptOver:
      pass
    except Exception as error:
      if not message and attempt.over is None:
        message = _describe(error, stdin, sources)
    passed.append(ok)
    if attempt.over is not None:
      return passed, message
  attempt.test = ""
  return passed, message

