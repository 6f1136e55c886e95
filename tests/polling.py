"""Polling for tests that wait on other processes (a killed browser or JVM going away)."""

import time


def wait_until(predicate, timeout_s=15.0):
  """True as soon as `predicate()` holds, False if it still does not after `timeout_s` seconds."""
  deadline = time.monotonic() + timeout_s
  while not predicate():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True
