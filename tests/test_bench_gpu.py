"""benchmarks/bench_gpu.py reads its parts' printed figures: the sampler's decode and roofline lines, the learner's
step time into MFU, and the device's data-sheet figures by kind; a stopped run resumes with the parts it lacks."""

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("bench_gpu", os.path.join(REPO, "benchmarks", "bench_gpu.py"))
bench_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_gpu)

SAMPLER_OUT = """device: NVIDIA H200 x1 (gpu), 16 CPU cores, load average 0.10
[ours, KV cache] batch 1: 180 new tokens/s (711.1 ms for 128 tokens; first call incl. compile 20.1 s; prefill 9.0 ms)
[decode] batch 1: 181 tokens/s, 5.528 ms/step
[roofline] batch 1: 1.198 GB/step (params 1.192 + KV 0.006) at 4800 GB/s -> bound 0.250 ms/step; measured 5.528 ms/step = 4.5% of roofline (217 GB/s achieved)
[ours, KV cache] batch 64: 10,880 new tokens/s (753.0 ms for 128 tokens; first call incl. compile 21.0 s; prefill 30.0 ms)
[decode] batch 64: 11,254 tokens/s, 5.687 ms/step
[roofline] batch 64: 1.582 GB/step (params 1.192 + KV 0.390) at 4800 GB/s -> bound 0.330 ms/step; measured 5.687 ms/step = 5.8% of roofline (278 GB/s achieved)
"""


def test_the_sampler_lines_become_decode_throughput_and_roofline_per_batch():
  rows = bench_gpu.sampler_rows(SAMPLER_OUT)
  assert rows == {1: {"decode_tokens_per_s": 181.0, "roofline_fraction": pytest.approx(0.045)},
                  64: {"decode_tokens_per_s": 11254.0, "roofline_fraction": pytest.approx(0.058)}}
  assert bench_gpu.sampler_rows("no figures") == {}


def test_the_learner_step_becomes_mfu_over_the_matmul_flops():
  out = "response-only logits: 250.0 ms per loss+grad (first call 30.1 s)\n"
  row = bench_gpu.learner_row(out, num_params=1e9, peak_tflops=1000.0)
  tokens = 8 * (2048 + 512)
  assert row["tokens"] == tokens and row["step_ms"] == pytest.approx(250.0)
  assert row["tflops_per_s"] == pytest.approx(6 * 1e9 * tokens / 0.25 / 1e12)
  assert row["mfu"] == pytest.approx(row["tflops_per_s"] / 1000.0)
  assert "mfu" not in bench_gpu.learner_row(out, num_params=1e9, peak_tflops=0.0)  # an unknown device
  assert bench_gpu.learner_row("crashed", 1e9, 1000.0) == {}


def test_device_figures_by_kind():
  assert bench_gpu.device_figures("NVIDIA H200") == (4800.0, 989.0)
  assert bench_gpu.device_figures("NVIDIA H100 80GB HBM3") == (3350.0, 989.0)
  assert bench_gpu.device_figures("TPU v5 lite") == (819.0, 197.0)
  assert bench_gpu.device_figures("Some GPU") == (0.0, 0.0)  # not listed: the command line gives them
  assert bench_gpu.device_figures("cpu") == (0.0, 0.0)


def test_the_attention_and_loop_lines_become_their_rows():
  attention = ("cpu: B 32, ...\ndense       4.933 ms per call (1.00x dense)\n"
               "blocked     3.466 ms per call (1.42x dense)\n")
  assert bench_gpu.attention_rows(attention) == {"dense": {"ms": 4.933, "vs_dense": 1.0},
                                                 "blocked": {"ms": 3.466, "vs_dense": 1.42}}
  loop = ("fixed      8 sampler calls (streaming: rounds), 3291 new tokens; 364 new tok/s in sampler calls (9.0 s, "
          "of which compiling 5.3 s); warm 880 tok/s; 333 over the rollouts\n  alone / loop (warm): 3.86x; the "
          "rollouts' response tokens: 3291\ncontinuous 4 sampler calls (streaming: rounds), 3291 new tokens; 326 "
          "new tok/s in sampler calls (10.1 s, of which compiling 8.7 s); warm 2,314 tok/s; 303 over the rollouts\n"
          "  alone / loop (warm): 1.47x; the rollouts' response tokens: 3291\nloop_vs_benchmark=1.47\n")
  assert bench_gpu.loop_rows(loop) == {"fixed": {"warm_tokens_per_s": 880.0, "alone_over_loop": 3.86},
                                       "continuous": {"warm_tokens_per_s": 2314.0, "alone_over_loop": 1.47}}
  assert bench_gpu.loop_rows("") == {} and bench_gpu.attention_rows("") == {}


def test_a_resumed_run_keeps_its_finished_parts_and_runs_the_failed_ones(tmp_path, monkeypatch):
  calls = []

  def run_part(args, timeout_s):
    calls.append(os.path.basename(args[0]))
    if args[0].endswith("learner.py") and len(calls) < 3:  # the first run's learner fails
      return "", 1.0, "did not finish in 1 s"
    out = {"sampler.py": SAMPLER_OUT, "learner.py": "response-only logits: 250.0 ms per loss+grad\n"}
    return out.get(os.path.basename(args[0]), ""), 1.0, ""

  monkeypatch.setattr(bench_gpu, "run_part", run_part)
  monkeypatch.setattr(bench_gpu, "device_kind", lambda: "NVIDIA H200")
  output = tmp_path / "accelerator.json"
  argv = ["bench_gpu.py", "--presets=qwen3-0.6b", "--parts=sampler,learner", f"--output={output}"]
  monkeypatch.setattr(sys, "argv", argv)
  bench_gpu.main()
  first = json.loads(output.read_text())["presets"]["qwen3-0.6b"]
  assert calls == ["sampler.py", "learner.py"] and first["learner"]["error"] and not first["sampler"]["error"]
  monkeypatch.setattr(sys, "argv", [*argv, "--resume"])
  bench_gpu.main()
  assert calls == ["sampler.py", "learner.py", "learner.py"]  # the sampler's figures were kept
  again = json.loads(output.read_text())["presets"]["qwen3-0.6b"]
  assert again["sampler"] == first["sampler"] and again["learner"]["step_ms"] == pytest.approx(250.0)
  monkeypatch.setattr(sys, "argv", [*argv, "--parts=sampler,gpu"])
  with pytest.raises(SystemExit):
    bench_gpu.main()
