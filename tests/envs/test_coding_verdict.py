"""The verdict: tests run outside the program's process and compare plain data only.

Every hostile program here solves nothing and tries to pass anyway, one way per class of fake: a
value that compares equal to anything, reading the tests' expectations from inside its interpreter,
changing what the tests rely on, and ending the run early; each must fail and say what happened.
The honest programs use what plain data allows: arguments changed in place, generators, tuples,
sets, dicts, bytes, floats compared with a tolerance, the task's own classes, expected exceptions.
"""

import pytest

from explore_jax.envs.coding import TestCase, run_program, wire
from explore_jax.envs.coding import sandbox

TESTS = (TestCase("test_0", "assert f(2) == 6"), TestCase("test_1", "assert f(0) == 0"),
         TestCase("test_2", "assert f(-1) == -3"))
ALL = ("test_0", "test_1", "test_2")
GOOD = "def f(x):\n    return 3 * x\n"


def run(program, tests=TESTS, **kwargs):
  return run_program(program, tests, **{"time_limit_s": 2.0, **kwargs})


def _fails(result, *phrases, status="failed", failing=ALL):
  assert result.status == status, result
  assert result.failing == failing and not result.passed, result
  for phrase in phrases:
    assert phrase in result.message, result.message


# ---- a value that compares equal to anything -----------------------------------------------------

EVIL = ("class Evil:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n")
LISTS = (TestCase("test_0", "assert list(f(2)) == [6]"), TestCase("test_1", "assert list(f(0)) == [0]"),
         TestCase("test_2", "assert list(f(-1)) == [-3]"))
# Each of these passes its tests when the tests run in the program's interpreter.
EQUAL_TO_ANYTHING = {
    "eq-object": (EVIL + "def f(x):\n    return Evil()\n", "Evil", TESTS),
    "int-subclass": ("class Int(int):\n    def __eq__(self, other):\n        return True\n"
                     "    __hash__ = int.__hash__\n"
                     "def f(x):\n    return Int(7)\n", "Int", TESTS),
    "str-subclass": ("class Str(str):\n    def __eq__(self, other):\n        return True\n"
                     "    __hash__ = str.__hash__\n"
                     "def f(x):\n    return Str('no')\n", "Str", TESTS),
    "list-subclass": ("class List(list):\n    def __eq__(self, other):\n        return True\n"
                      "def f(x):\n    return List()\n", "List", TESTS),
    "tuple-subclass": ("class Tuple(tuple):\n    def __eq__(self, other):\n        return True\n"
                       "    __hash__ = tuple.__hash__\n"
                       "def f(x):\n    return Tuple()\n", "Tuple", TESTS),
    "nested": (EVIL + "def f(x):\n    return [Evil()]\n", "Evil", LISTS),
    "generator-of-evil": (EVIL + "def f(x):\n    yield Evil()\n", "Evil", LISTS),
    "everything-true": (EVIL + "    def __sub__(self, other):\n        return self\n"
                        "    def __abs__(self):\n        return self\n"
                        "    def __lt__(self, other):\n        return True\n"
                        "    def __bool__(self):\n        return True\n"
                        "def f(x):\n    return Evil()\n", "Evil", TESTS),
}


@pytest.mark.parametrize("name", EQUAL_TO_ANYTHING)
def test_a_value_that_equals_anything_is_refused_by_its_type(name):
  program, type_name, tests = EQUAL_TO_ANYTHING[name]
  result = run(program, tests)
  _fails(result, f"f returned an object of type {type_name}; only plain data is compared")


def test_asserts_of_every_form_are_decided_outside_the_program():
  program = EQUAL_TO_ANYTHING["everything-true"][0]
  for code in ["assert abs(f(1) - 3) < 1e-9", "assert f(1) is True", "assert f(1)",
               "assert not f(1) != 3", "assert f(1) >= 3 and f(1) <= 3", "assert f(1) in (3,)"]:
    result = run(program, [TestCase("t", code)])
    _fails(result, "returned an object of type Evil", failing=("t",))
  assert run(GOOD, [TestCase("t", "assert abs(f(1) - 3) < 1e-9 and f(1) is not True")]).passed


# ---- reading the tests' expectations from inside the interpreter ---------------------------------

# Each of these passes TESTS when the tests run in the program's interpreter: the expected value is
# the last int among the constants of the test's code, found through the caller's frame, inspect,
# or the garbage collector (the test whose constants start with the argument).
READERS = {
    "caller-frame": ("import sys\n"
                     "def f(x):\n"
                     "    consts = sys._getframe(1).f_code.co_consts\n"
                     "    return [c for c in consts if type(c) is int][-1]\n"),
    "inspect": ("import inspect\n"
                "def f(x):\n"
                "    consts = inspect.currentframe().f_back.f_code.co_consts\n"
                "    return [c for c in consts if type(c) is int][-1]\n"),
    "gc-code-objects": ("import gc\n"
                        "def f(x):\n"
                        "    for o in gc.get_objects():\n"
                        "        for entry in (o if type(o) is list else ()):\n"
                        "            for item in (entry if type(entry) is tuple else ()):\n"
                        "                if getattr(item, 'co_filename', '').startswith('<test'):\n"
                        "                    ints = [c for c in item.co_consts if type(c) is int]\n"
                        "                    if ints and ints[0] == x:\n"
                        "                        return ints[-1]\n"
                        "    return None\n"),
    "caller-locals": ("import sys\n"
                      "def f(x):\n"
                      "    return sys._getframe(1).f_locals.get('want')\n"),
}
LOCALS = tuple(TestCase(f"test_{i}", f"def __check__(candidate):\n    want = {y}\n"
                                     f"    assert candidate({x}) == want\n__check__(f)\n")
               for i, (x, y) in enumerate([(2, 6), (0, 0), (-1, -3)]))


@pytest.mark.parametrize("name", READERS)
def test_the_tests_expectations_are_not_in_the_programs_interpreter(name):
  tests = LOCALS if name == "caller-locals" else TESTS
  result = run(READERS[name], tests)
  assert result.status == "failed" and not result.passed, result
  assert "(got " in result.message or "only plain data" in result.message, result.message


# ---- changing what the tests rely on -------------------------------------------------------------


def test_rebound_builtins_do_not_reach_the_tests():
  program = ("import builtins\n"
             "builtins.abs = lambda x: 0\nbuiltins.len = lambda x: 3\n"
             "builtins.isinstance = lambda *a: True\nbuiltins.sorted = lambda x: [1, 2, 3]\n"
             "builtins.AssertionError = type('Quiet', (Exception,), {})\n"
             "def f(x):\n    return [9]\n")
  tests = [TestCase("abs", "assert abs(f(1)[0] - 3) < 1e-6"), TestCase("len", "assert len(f(1)) == 3"),
           TestCase("isinstance", "assert isinstance(f(1), str)"),
           TestCase("sorted", "assert sorted(f(1)) == [1, 2, 3]")]
  result = run(program, tests)
  assert result.status == "failed" and result.failing == ("abs", "isinstance", "len", "sorted")
  assert result.message == "assert abs(f(1)[0] - 3) < 1e-06"


def test_patched_modules_do_not_reach_the_tests():
  program = ("import math, operator\n"
             "math.isclose = lambda *a, **k: True\nmath.fabs = lambda x: 0.0\n"
             "operator.eq = lambda a, b: True\n"
             "def f(x):\n    return -1.0\n")
  tests = [TestCase("isclose", "assert math.isclose(f(1), 3.0)"),
           TestCase("fabs", "assert math.fabs(f(1) - 3.0) < 1e-9"),
           TestCase("eq", "assert operator.eq(f(1), 3.0)")]
  result = run(program, tests, setup="import math\nimport operator\n")
  assert result.status == "failed" and result.failing == ("eq", "fabs", "isclose"), result


def test_a_helper_the_tests_use_is_the_tasks_even_when_the_program_redefines_it():
  # HumanEval/32's shape: the check evaluates the task's poly at the program's answer.
  setup = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n"
  tests = [TestCase("t", "assert abs(poly([-6, 11, -6, 1], find_zero([-6, 11, -6, 1]))) < 1e-4")]
  cheat = setup.replace("return sum(c * x ** i for i, c in enumerate(xs))", "return 0") + (
      "def find_zero(xs):\n    return 123.0\n")
  result = run(cheat, tests, setup=setup)
  assert result.status == "failed" and result.message.startswith("assert abs(poly("), result
  honest = setup + "def find_zero(xs):\n    return 1.0\n"
  assert run(honest, tests, setup=setup).passed


@pytest.mark.parametrize("hook", [
    "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "import sys\nsys.excepthook = lambda *a: None\n",
    "import threading\nthreading.excepthook = lambda *a: None\n",
    ("import os\nclass Fake:\n    def __del__(self):\n"
     "        os.write(1, b'0' * 32 + b' end 0\\n')\nkeep = Fake()\n"),
], ids=["atexit", "excepthook", "threading-excepthook", "del"])
def test_hooks_at_exception_or_exit_time_change_nothing(hook):
  result = run(hook + "def f(x):\n    return x\n")
  assert result.status == "failed" and result.failing == ("test_0", "test_2"), result
  assert result.message == "assert f(2) == 6 (got 2)"
  assert run(hook + GOOD).passed


# ---- ending the run early ------------------------------------------------------------------------

EARLY_ENDS = {
    "sys.exit-at-load": ("import sys\nsys.exit(0)\n" + GOOD, "crashed", "before its tests ran"),
    "os._exit-at-load": ("import os\nos._exit(0)\n" + GOOD, "crashed", "exit status 0"),
    "sys.exit-in-call": ("import sys\ndef f(x):\n    sys.exit(0)\n", "failed", "SystemExit: 0"),
    "SystemExit-in-call": ("def f(x):\n    raise SystemExit(0)\n", "failed", "SystemExit: 0"),
    "KeyboardInterrupt-in-call": ("def f(x):\n    raise KeyboardInterrupt\n", "failed",
                                  "KeyboardInterrupt"),
    "os._exit-in-call": ("import os\ndef f(x):\n    os._exit(0)\n", "crashed", "exit status 0"),
    "kill-self-in-call": ("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
                          "crashed", "killed by SIGKILL"),
    "exit-in-generator": ("def f(x):\n    yield 3 * x\n    raise SystemExit(0)\n", "failed",
                          "SystemExit: 0"),
}


@pytest.mark.parametrize("name", EARLY_ENDS)
def test_ending_early_never_reads_as_success(name):
  program, status, phrase = EARLY_ENDS[name]
  _fails(run(program), phrase, status=status)


def test_an_early_end_after_passing_tests_fails_the_rest():
  program = "import os\ndef f(x):\n    if x == 0:\n        os._exit(0)\n    return 3 * x\n"
  result = run(program)
  assert result.status == "crashed" and result.failing == ALL, result  # a crash voids the attempt
  program = "def f(x):\n    if x == 0:\n        raise SystemExit(0)\n    return 3 * x\n"
  result = run(program)
  assert result.status == "failed" and result.failing == ("test_1",), result


# A program that takes over its interpreter: it finds the token and the reply pipe in the runner's
# frames and writes frames of its own.
TAKEOVER = """import sys, os
def channel():
    frame = sys._getframe()
    while frame is not None:
        if 'token' in frame.f_locals and 'reply_fd' in frame.f_locals:
            return frame.f_locals['token'], frame.f_locals['reply_fd']
        frame = frame.f_back

def forge(kind, payload):
    token, fd = channel()
    os.write(fd, token.encode() + b' ' + kind + b' ' + str(len(payload)).encode() + b'\\n' + payload)

def text(*parts):
    out = b't' + len(parts).to_bytes(4, 'little')
    for part in parts:
        out += b's' + len(part.encode()).to_bytes(4, 'little') + part.encode()
    return out
"""


@pytest.mark.parametrize("forgery, status, phrase", [
    ("forge(b'end', text('bye', '', ''))\n    os._exit(0)", "crashed",
     "a last frame before the tests were done"),
    ("forge(b'end', text('passed', '', ''))\n    os._exit(0)", "crashed", "a malformed last frame"),
    ("forge(b'value', b'\\x05\\x00\\x00\\x00zzzzz')\n    return 0", "crashed",
     "an answer where the last frame belonged"),
    ("forge(b'value', b'\\x01\\x00\\x00\\x00T')\n    import time\n    time.sleep(5)", "failed",
     "(got True)"),
], ids=["bye", "status-passed", "malformed-value", "true-for-everything"])
def test_a_program_that_forges_frames_still_only_answers_calls(forgery, status, phrase):
  result = run(TAKEOVER + f"def f(x):\n    {forgery}\n", time_limit_s=1.0)
  assert result.status in (status, "timeout") and not result.passed, result
  assert phrase in result.message or result.status == "timeout", result.message


# ---- honest programs -----------------------------------------------------------------------------


def test_arguments_changed_in_place_come_back_into_the_tests_objects():
  tests = [TestCase("sort", "a = [3, 1, 2]\nassert sort_in_place(a) is None\nassert a == [1, 2, 3]"),
           TestCase("rows", "m = [[1, 2], [3, 4]]\nrow = m[0]\nrotate(m)\n"
                            "assert m == [[3, 1], [4, 2]] and row is m[0] and row == [3, 1]"),
           TestCase("dict", "d = {'a': 1}\nadd(d, 'b', 2)\nassert d == {'a': 1, 'b': 2}"),
           TestCase("set", "s = {1}\nadd(s, 2)\nassert s == {1, 2}"),
           TestCase("keyword", "xs = [2, 1]\nsort_in_place(values=xs)\nassert xs == [1, 2]"),
           TestCase("untouched", "t = ([1], (2,))\nassert total(t) == 3 and t == ([1], (2,))")]
  program = ("def sort_in_place(values):\n    values.sort()\n"
             "def rotate(m):\n    n = len(m)\n    rows = [[m[n - 1 - j][i] for j in range(n)] "
             "for i in range(n)]\n    for i in range(n):\n        m[i][:] = rows[i]\n"
             "def add(container, *item):\n"
             "    if isinstance(container, dict):\n        container[item[0]] = item[1]\n"
             "    else:\n        container.add(item[0])\n"
             "def total(t):\n    return t[0][0] + t[1][0]\n")
  result = run(program, tests)
  assert result.passed, result


def test_generators_and_other_iterators_are_drained_into_an_iterator():
  program = ("def f(n):\n    for i in range(n):\n        yield i * i\n"
             "def g(n):\n    return map(str, range(n))\n"
             "def h(n):\n    return iter({n: 1})\n")
  tests = [TestCase("list", "assert list(f(4)) == [0, 1, 4, 9]"),
           TestCase("sorted", "assert sorted(g(3), reverse=True) == ['2', '1', '0']"),
           TestCase("next", "it = f(3)\nassert next(it) == 0 and list(it) == [1, 4]"),
           TestCase("keys", "assert list(h(5)) == [5]")]
  assert run(program, tests).passed
  result = run(program, [TestCase("compared", "assert f(2) == [0, 1]")])
  assert result.failing == ("compared",) and "(got <list_iterator" in result.message
  result = run("def f(n):\n    while True:\n        yield 0\n", [TestCase("endless", "list(f(1))")])
  assert result.status in ("failed", "timeout") and not result.passed
  assert result.status == "timeout" or "limit of one value" in result.message, result


def test_plain_values_of_every_kind_cross_exactly():
  program = ("def f(kind):\n"
             "    return {'tuple': (1, 'a', None), 'set': {1, 2.5, 'x'},\n"
             "            'frozen': frozenset({(1, 2)}),\n"
             "            'dict': {(1, 2): [b'\\x00\\xff'], None: {True: -0.0}},\n"
             "            'bytes': bytes(range(256)), 'float': 0.1 + 0.2, 'big': -(7 ** 99),\n"
             "            'text': 'é\\u2603\\ud800\\n', 'bool': True, 'none': None,\n"
             "            'inf': float('-inf')}[kind]\n")
  tests = [TestCase("tuple", "assert f('tuple') == (1, 'a', None) and type(f('tuple')) is tuple"),
           TestCase("set", "assert f('set') == {1, 2.5, 'x'} and type(f('set')) is set"),
           TestCase("frozen", "assert f('frozen') == frozenset({(1, 2)})"),
           TestCase("dict", "assert f('dict') == {(1, 2): [b'\\x00\\xff'], None: {True: -0.0}}"),
           TestCase("bytes", "assert f('bytes') == bytes(range(256))"),
           TestCase("float", "assert abs(f('float') - 0.3) < 1e-9 and f('float') != 0.3"),
           TestCase("big", "assert f('big') == -(7 ** 99)"),
           TestCase("text", "assert f('text') == 'é\\u2603\\ud800\\n'"),
           TestCase("bool", "assert f('bool') is True and f('none') is None"),
           TestCase("inf", "assert f('inf') == float('-inf')")]
  result = run(program, tests)
  assert result.passed, result


LINKED = """class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right

def list_node(values):
    head = None
    for value in reversed(values):
        head = ListNode(value, head)
    return head

def values_of(node):
    out = []
    while node is not None:
        out.append(node.val)
        node = node.next
    return out

def is_same_list(a, b):
    return values_of(a) == values_of(b)

def tree_node(values):
    nodes = [None if v is None else TreeNode(v) for v in values]
    children = nodes[1:]
    for node in nodes:
        if node is not None and children:
            node.left = children.pop(0)
            if children:
                node.right = children.pop(0)
    return nodes[0] if nodes else None

def is_same_tree(a, b):
    if a is None or b is None:
        return a is b
    return a.val == b.val and is_same_tree(a.left, b.left) and is_same_tree(a.right, b.right)
"""


def test_the_tasks_own_classes_cross_as_objects_of_the_receiving_side():
  program = ("class Solution:\n"
             "    def reverseList(self, head):\n"
             "        previous = None\n"
             "        while head:\n"
             "            head.next, previous, head = previous, head, head.next\n"
             "        return previous\n"
             "    def reorderList(self, head):\n"
             "        nodes = []\n"
             "        while head:\n"
             "            nodes.append(head)\n"
             "            head = head.next\n"
             "        order = [nodes[i // 2] if i % 2 == 0 else nodes[-1 - i // 2] "
             "for i in range(len(nodes))]\n"
             "        for a, b in zip(order, order[1:] + [None]):\n"
             "            a.next = b\n"
             "    def invertTree(self, root):\n"
             "        if root:\n"
             "            root.left, root.right = (self.invertTree(root.right),\n"
             "                                     self.invertTree(root.left))\n"
             "        return root\n")
  tests = [
      TestCase("reverse", "assert is_same_list(Solution().reverseList(head=list_node([1, 2, 3])), "
                          "list_node([3, 2, 1]))"),
      TestCase("long", "assert values_of(Solution().reverseList(list_node(list(range(3000))))) == "
                       "list(range(2999, -1, -1))"),
      TestCase("in-place", "head = list_node([1, 2, 3, 4])\nsecond = head.next\n"
                           "assert Solution().reorderList(head) is None\n"
                           "assert values_of(head) == [1, 4, 2, 3] and head.next.next is second"),
      TestCase("tree", "assert is_same_tree(Solution().invertTree(tree_node([4, 2, 7, 1, 3])), "
                       "tree_node([4, 7, 2, None, None, 3, 1]))"),
      TestCase("empty", "assert Solution().reverseList(None) is None")]
  result = run(program, tests, setup=LINKED)
  assert result.passed, result
  cheat = program + ("def is_same_list(a, b):\n    return True\n"
                     "class ListNode:\n    def __eq__(self, other):\n        return True\n")
  tests = [TestCase("reverse", "assert is_same_list(Solution().reverseList(list_node([1, 2])), "
                               "list_node([1, 2]))"),
           TestCase("eq", "assert Solution().reverseList(list_node([1])) == list_node([5])")]
  result = run(cheat, tests, setup=LINKED)
  assert result.status == "failed" and result.failing == ("eq", "reverse"), result


def test_a_class_called_without_arguments_gives_a_proxy_that_compares_nothing():
  program = "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"
  tests = [TestCase("call", "assert Solution().twoSum(nums=[2, 7], target=9) == [0, 1]"),
           TestCase("compare", "assert Solution() == Solution()"),
           TestCase("truth", "assert Solution()"),
           TestCase("with-args", "assert f(1) == 1")]
  result = run(program + "class f:\n    def __init__(self, x):\n        pass\n", tests)
  assert result.test_passed == (True, False, False, False), result
  assert "Solution() is the program's object of type Solution; only plain data" in result.message
  result = run(program + "class f:\n    def __init__(self, x):\n        pass\n", tests[3:])
  assert "f returned an object of type f; only plain data is compared" in result.message


def test_a_proxy_passed_back_to_the_program_is_its_own_object_again():
  program = ("def f(x):\n    return 3 * x\n"
             "def apply(functions, x):\n    functions.append(len(functions))\n"
             "    return functions[0](x)\n")
  test = TestCase("t", "fs = [f]\nassert apply(fs, 2) == 6\nassert fs[0] is f and fs[1] == 1")
  assert run(program, [test]).passed


def test_exceptions_come_back_as_their_builtin_types():
  program = "def f(x):\n    if x < 0:\n        raise ValueError(f'negative: {x}')\n    return 3 * x\n"
  tests = [TestCase("expected", "try:\n    f(-1)\nexcept ValueError as e:\n"
                                "    assert 'negative' in str(e)\nelse:\n    assert False\n"),
           TestCase("unexpected", "assert f(-2) == -6")]
  result = run(program, tests)
  assert result.test_passed == (True, False)
  assert result.message == ('  File "<unexpected>", line 1, in <module>\n    assert f(-2) == -6\n'
                            '  File "<program>", line 3, in f\n'
                            "    raise ValueError(f'negative: {x}')\nValueError: negative: -2")


# ---- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, phrase", [
    ("return 'x' * (5 << 20)", f"more than {wire.MAX_BYTES} bytes (4 MiB) of data, the limit"),
    ("return [1] * (3 << 20)", f"more than {wire.MAX_BYTES} bytes (4 MiB) of data, the limit"),
    ("v = []\n    for _ in range(101):\n        v = [v]\n    return v",
     f"data nested deeper than {wire.MAX_DEPTH} levels, the limit"),
    ("return {k * (2 ** 61 - 1) for k in range(1, 200)}",
     f"more than {wire.MAX_COLLISIONS} distinct values with one hash, the limit"),
], ids=["bytes", "items", "depth", "collisions"])
def test_results_over_the_limits_fail_and_name_the_limit(body, phrase):
  result = run(f"def f(x):\n    {body}\n", time_limit_s=10.0)
  _fails(result, f"f returned {phrase}")


def test_results_within_the_limits_pass():
  program = ("def f(x):\n    v = []\n    for _ in range(99):\n        v = [v]\n    return v\n"
             "def g(x):\n    return 'y' * (4 << 20 - 1)\n"
             "def h(x):\n    return {k * (2 ** 61 - 1) for k in range(1, 33)}\n")
  tests = [TestCase("deep", "v = f(0)\nfor _ in range(99):\n    v = v[0]\nassert v == []"),
           TestCase("long", "assert len(g(0)) == 4 << 20 - 1"),
           TestCase("collide", "assert len(h(0)) == 32")]
  assert run(program, tests, time_limit_s=10.0).passed


def test_arguments_that_cannot_cross_fail_the_test_that_passes_them():
  result = run(GOOD, [TestCase("t", "assert f(lambda: 0) == 0")])
  assert result.failing == ("t",)
  assert "f cannot be given an object of type function; only plain data crosses" in result.message


def test_a_call_that_hangs_ends_the_attempt_within_the_limit():
  result = run("def f(x):\n    while x == 0:\n        pass\n    return 3 * x\n", time_limit_s=1.0)
  assert result.status == "timeout" and result.test_passed == (True, False, False)
  assert result.message == "Time limit of 1.0 s exceeded (in test_1)"
  assert result.seconds < 1.0 + sandbox._STARTUP_ALLOWANCE_S + 5.0
  result = run("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
               "def f(x):\n    while True:\n        pass\n", time_limit_s=1.0)
  assert result.status == "timeout" and result.seconds < 1.0 + sandbox._STARTUP_ALLOWANCE_S + 5.0
