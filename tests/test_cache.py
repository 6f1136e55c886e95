"""explore_jax/cache.py: where the local cache keeps what it keeps."""

from explore_jax import cache


def test_compiled_programs_live_under_the_cache_root_unless_given_a_place_of_their_own(tmp_path, monkeypatch):
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "root"))
  monkeypatch.delenv("EXPLORE_JAX_XLA_CACHE", raising=False)
  assert cache.xla_root() == str(tmp_path / "root" / "xla")
  monkeypatch.setenv("EXPLORE_JAX_XLA_CACHE", str(tmp_path / "programs"))
  assert cache.xla_root() == str(tmp_path / "programs")
  assert cache.warm_start_dir("k") == str(tmp_path / "root" / "sft" / "k")  # the rest stays under the root
