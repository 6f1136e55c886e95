"""The coding environment: a sandbox that runs untrusted programs against tests.

  sandbox.py  run_program(program, tests) -> ExecutionResult: a fresh interpreter per call under
              resource limits, a user and network namespace where available, and an audit hook

No jax anywhere in this package: it runs in actor processes.
"""

from explore_jax.envs.coding.sandbox import (
    ExecutionResult,
    TestCase,
    network_isolation_available,
    run_program,
)
