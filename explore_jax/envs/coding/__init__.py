"""The coding environment: tasks, a sandbox for untrusted programs, and Coding-v0.

  sandbox.py  run_program(program, tests) -> ExecutionResult: the program in a fresh interpreter
              per call under resource limits, a user and network namespace where available, and an
              audit hook (_runner.py); the tests and the verdict outside it, calling the program
              through proxies (_attempt.py, the parent's end of the channel; _judge.py, the tests)
  wire.py     the plain data that crosses between them (exact types, size and depth limits)
  tasks.py    CodingTask; the procedural family (the tiny model's), HumanEval, JSONL datasets
              (MBPP, LeetCodeDataset, APPS); make_tasks(dataset) picks one by name
  env.py      CodingEnv ("explore_jax/Coding-v0"): strategy and code per attempt, failing tests as
              the outcome, the failure message as feedback

No jax anywhere in this package: it runs in actor processes.
"""

from explore_jax.envs.coding.env import CodingEnv, extract_code
from explore_jax.envs.coding.sandbox import (
    ExecutionResult,
    TestCase,
    network_isolation_available,
    run_program,
)
from explore_jax.envs.coding.tasks import (
    OPS,
    SPLITS,
    CodingTask,
    humaneval_tasks,
    load_jsonl_tasks,
    make_tasks,
    procedural_split,
    procedural_tasks,
)
