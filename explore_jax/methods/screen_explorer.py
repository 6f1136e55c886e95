"""ScreenExplorer: open-ended GUI exploration driven by curiosity, change and intent rewards (METHODS.md).

  Screens      the world runs inside the ScreenReader wrapper (config.env.screen_reading; envs/screen_reading.py):
               every step's info["screen"] holds the screen before and after its action, each an image latent,
               OCR line boxes and their text.
  Records      per step: both latents, the text embeddings of both screens ("Screen OCR: " + the boxes' texts),
               of the reply's intent (a zero vector when there is none) and of the text under a click, whether a
               click hit a box, and the action's bytes (record fields `se_*`). Texts are embedded on the learner
               with the run's encoder (config.embedding.encoder; MiniLM by default).
  World model  an aux model trained in the "before_rewards" phase (rl/world_model.py): `epochs` shuffled passes
               over the iteration's well-formed steps in batches of `batch_size`, AdamW (0.9, 0.95), decay 0.01;
               the rewards score the predictions of the last pass (keep_outputs), as the released code does.
  Rewards      the eight terms of rl/screen_rewards.py, each switchable, summed unweighted and multiplied by the
               format check (screen_explorer.format = "gate") or with it added as a term ("term").
  Advantage    the `screen_explorer` estimator: one group over every step of the iteration.
  Diversity    observe() logs eqs. 5-6 over the iteration's after-states, visual and textual: d_seq (per
               trajectory, averaged) and D_grp (all trajectories of the iteration, the paper's group);
               evaluation reports the visual ones (train/evaluation.py).
  Distillation the experience stream: from iteration `distill.from_iteration` on, observe_update() keeps the
               well-formed steps with advantage > 0 and a clear intent (`clear_intent`) as SFT demonstrations
               (the prompt the policy saw, its screenshot and the reply), one JSONL file per iteration under
               <workdir>/distill/; `configs/screen_explorer_*.py:distill` fine-tunes a fresh base model on them.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult
from explore_jax.envs import screen_actions
from explore_jax.methods import grpo
from explore_jax.methods.base import BuildContext, Method, register_method

AUX = "world_model"
# The policy's instructions (our wording of the released schema's: explore, say why, answer in JSON).
SYSTEM_PROMPT = ("You are exploring a computer screen to discover what it can do. Look at the screenshot, choose "
                 "one action that will show you something new, and say what you expect. Reply with JSON only: "
                 '{"intent": "<what you want to find out>", "action": "<one action>"}, where the action is '
                 'Move(x, y), Click(x, y), RightClick(x, y), DoubleClick(x, y), ScrollUp(x, y), ScrollDown(x, y), '
                 'Text(x, y, "text") or Key("Ctrl+S"), in screen pixels.')
TERMS = ("inst_vis", "inst_text", "seq_vis", "seq_text", "world_vis", "world_text", "des", "inter")
FIELDS = ("se_before_latent", "se_after_latent", "se_before_text", "se_after_text", "se_intent", "se_box")
_FAR = 1 << 30  # the bound a canonical action's coordinates are re-read under (the world checked them)


def configure(c: Any) -> Any:
  """ScreenExplorer's recipe: GRPO's clipped loss (0.2 / 0.28), k3 KL 0.04 to the base, lr 4e-5, temperature 1."""
  grpo.configure(c, "grpo")
  c.method = "screen_explorer"
  c.rl.advantage = "screen_explorer"
  c.rl.advantage_options = {"eps": 1e-6, "normalize_std": True}
  c.rl.loss.eps_low, c.rl.loss.eps_high = 0.2, 0.28
  c.rl.loss.kl_coef, c.rl.loss.kl_type = 0.04, "k3"
  c.rl.format_penalty = 0.0     # the format check gates the exploration terms instead
  c.rl.first_update = 6         # the released actor updates from episode 6 on (episode > 5)
  c.optimizer.learning_rate = 4e-5
  c.rollout.temperature = 1.0
  c.system_prompt = SYSTEM_PROMPT
  return add_config(c)


def add_config(c: Any) -> Any:
  import ml_collections

  c.embedding.encoder = "all-minilm-l6-v2"
  c.env.screen_reading.latent = "patch_stats"
  c.env.screen_reading.ocr = True
  c.env.screen_reading.oracle = "world"     # the warm start's JSON replies (envs/screen_reader.py)
  s = c.screen_explorer = ml_collections.ConfigDict()
  s.terms = ml_collections.ConfigDict({name: True for name in TERMS})
  s.sequence_form = "paper"     # "paper" (E_{i<t<j}) or "code" ([s_0, s'_0 ...] over the well-formed steps)
  s.format = "gate"             # "gate": r_format x sum (eq. 1, the code); "term": r_format + sum
  s.task_reward = False         # whether the world's own reward adds to the terms (the desktop has none)
  s.latent_dim = 384            # patch_stats' 8 x 8 x 3 x 2
  w = s.world_model = ml_collections.ConfigDict()
  w.image_tokens, w.action_len, w.hidden, w.layers, w.heads, w.mlp = 64, 64, 128, 2, 4, 512
  w.epochs, w.batch_size = 3, 2
  w.learning_rate, w.weight_decay, w.max_grad_norm = 4e-5, 0.01, 1.0
  d = s.distill = ml_collections.ConfigDict()
  d.enabled = True
  d.from_iteration = 30         # "episode >= 30" (0-based iterations; one iteration is the paper's episode)
  d.min_intent_words = 3        # clear_intent's shortest intent
  s.snapshots_every = 5         # every N iterations the first episode's screens and replies in <workdir>/screens/
  return c


_ACTION_LIKE = re.compile(r"^\s*(Move|Click|RightClick|DoubleClick|ScrollUp|ScrollDown|Text|Key)\s*\(", re.I)


def clear_intent(intent: str, min_words: int = 3) -> bool:
  """The distillation's "clear intent" (the paper does not define it; this is our reading): at least `min_words`
  words with letters, and not the action itself written again."""
  words = [w for w in str(intent).split() if any(ch.isalpha() for ch in w)]
  return len(words) >= min_words and not _ACTION_LIKE.match(str(intent))


@register_method("screen_explorer")
class ScreenExplorer(Method):
  """Screen records, the world model, the eight exploration terms, diversity and the distillation stream."""

  name = "screen_explorer"

  def __init__(self, config: Any):
    super().__init__(config)
    s = config.screen_explorer
    unknown = sorted(set(s.terms) - set(TERMS))
    if unknown:
      raise ValueError(f"screen_explorer.terms has unknown term(s) {unknown}; the terms are {TERMS}")
    if s.format not in ("gate", "term"):
      raise ValueError(f"screen_explorer.format must be 'gate' or 'term', got {s.format!r}")
    if s.sequence_form not in ("paper", "code"):
      raise ValueError(f"screen_explorer.sequence_form must be 'paper' or 'code', got {s.sequence_form!r}")
    if not config.env.get("screen_reading"):
      raise ValueError("ScreenExplorer reads the screens around every step: set config.env.screen_reading "
                       "(screen_explorer.add_config does)")
    self.terms = tuple(t for t in TERMS if s.terms[t])
    self.intrinsic_names = tuple(f"se_{t}" for t in self.terms) + (("se_format",) if s.format == "term" else ())
    self.encode, self.dim, self.workdir = None, 0, ""
    self._calls = 0
    self._vectors: dict[str, np.ndarray] = {}  # the iteration's text embeddings, by text
    self._results: dict[int, EpisodeResult] = {}  # the iteration's training episodes, by trajectory id

  def setup(self, ctx: BuildContext) -> None:
    if ctx.encode is None:
      raise ValueError("ScreenExplorer needs the run's text encoder (BuildContext.encode)")
    self.encode, self.dim, self.workdir = ctx.encode, int(ctx.embedding_dim), ctx.workdir
    if self.config.screen_explorer.distill.enabled and "://" in self.workdir:
      raise ValueError(f"ScreenExplorer writes its distillation steps into a local run directory, not "
                       f"{self.workdir}; set screen_explorer.distill.enabled=False for a bucket")

  def _world_config(self):
    from explore_jax.rl import world_model

    w = self.config.screen_explorer.world_model
    return world_model.WorldModelConfig(latent_dim=int(self.config.screen_explorer.latent_dim),
                                        image_tokens=int(w.image_tokens), text_dim=self.dim,
                                        action_len=int(w.action_len), hidden=int(w.hidden), layers=int(w.layers),
                                        heads=int(w.heads), mlp=int(w.mlp))

  def _encode(self, texts: list[Optional[str]]) -> np.ndarray:
    """Unit rows for the texts, each distinct one encoded once per iteration; None and "" give zero rows."""
    new = sorted({t for t in texts if t and t not in self._vectors})
    if new:
      self._vectors.update(zip(new, np.asarray(self.encode(new), np.float32)))
    zero = np.zeros(self.dim, np.float32)
    return np.stack([self._vectors[t] if t else zero for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

  # ---- bookkeeping: diversity ----------------------------------------------------------------------
  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    from explore_jax.rl import screen_rewards as sr

    if not training:
      return {}
    self._vectors = {}
    self._results = {r.spec.traj_id: r for r in results}
    episodes = [[_screens(s)["after"] for s in r.steps] for r in results if r.steps]
    if not episodes:
      return {}
    T = max(len(e) for e in episodes)
    mask = np.array([[t < len(e) for t in range(T)] for e in episodes])
    out = {}
    for kind, vectors in (("vis", [[a["latent"] for a in e] for e in episodes]),
                          ("text", [list(self._encode([sr.screen_text(a["boxes"]) for a in e])) for e in episodes])):
      after = np.zeros((len(episodes), T, len(vectors[0][0])), np.float32)
      for i, e in enumerate(vectors):
        after[i, :len(e)] = e
      out[f"diversity/d_seq_{kind}"] = float(np.mean(sr.sequence_diversity(after, mask)))
      out[f"diversity/d_grp_{kind}"] = float(sr.group_diversity(after.reshape(1, -1, after.shape[-1]),
                                                                mask.reshape(1, -1))[0])
    return out

  # ---- records -------------------------------------------------------------------------------------
  def record_fields(self, ctx: BuildContext) -> dict[str, Any]:
    from explore_jax.replay import ExtraField

    d, e = int(self.config.screen_explorer.latent_dim), int(ctx.embedding_dim)
    a = int(self.config.screen_explorer.world_model.action_len)
    return {"se_before_latent": ExtraField((d,), "float32"), "se_after_latent": ExtraField((d,), "float32"),
            **{name: ExtraField((e,), "float32") for name in FIELDS[2:]},
            "se_hit": ExtraField((), "bool"), "se_actions": ExtraField((a,), "int32")}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    from explore_jax.rl import screen_rewards as sr, world_model

    screens = [_screens(s) for s in result.steps]
    texts, hits, actions = [], [], []
    for s, screen in zip(result.steps, screens):
      action = s.info.get("action") or ""
      parsed = screen_actions.parse_action(action, _FAR, _FAR)[0] if action else None
      hit = sr.click_hit_text(screen["before"]["boxes"], parsed.kind, parsed.x, parsed.y) if parsed else None
      texts += [sr.screen_text(screen["before"]["boxes"]), sr.screen_text(screen["after"]["boxes"]),
                str(s.info.get("intent") or ""), hit]
      hits.append(hit is not None)
      actions.append(action)
    vectors = self._encode(texts).reshape(len(result.steps), 4, self.dim)
    ids, _ = world_model.action_bytes(actions, int(self.config.screen_explorer.world_model.action_len))
    return [{"se_before_latent": np.asarray(sc["before"]["latent"], np.float32),
             "se_after_latent": np.asarray(sc["after"]["latent"], np.float32),
             "se_before_text": v[0], "se_after_text": v[1], "se_intent": v[2], "se_box": v[3],
             "se_hit": h, "se_actions": a} for sc, v, h, a in zip(screens, vectors, hits, ids)]

  # ---- the world model -----------------------------------------------------------------------------
  def aux_models(self, ctx: BuildContext) -> dict[str, Any]:
    from explore_jax.rl import world_model
    from explore_jax.train.aux_models import AuxModelSpec

    w, cfg = self.config.screen_explorer.world_model, self._world_config()
    return {AUX: AuxModelSpec(init=functools.partial(world_model.init, config=cfg),
                              loss=functools.partial(world_model.loss, config=cfg), batches=self._batches,
                              param_axes=world_model.param_axes(cfg), phase="before_rewards",
                              learning_rate=float(w.learning_rate), weight_decay=float(w.weight_decay),
                              max_grad_norm=float(w.max_grad_norm), betas=(0.9, 0.95), keep_outputs=True)}

  def _batches(self, records: Any) -> list[dict[str, np.ndarray]]:
    """`epochs` shuffled passes over the well-formed steps in batches of `batch_size` (the last one padded)."""
    w = self.config.screen_explorer.world_model
    x = {k: np.asarray(v) for k, v in records.extras.items()}
    rows = np.flatnonzero(np.asarray(records.valid) & (np.asarray(records.format_reward) > 0))
    rng = np.random.default_rng([int(self.config.seed), self._calls])
    self._calls += 1
    size, out = int(w.batch_size), []
    for _ in range(int(w.epochs)):
      order = rng.permutation(rows)
      for start in range(0, len(order), size):
        part = np.full(size, -1, np.int64)
        part[:len(order[start:start + size])] = order[start:start + size]
        take = np.maximum(part, 0)
        out.append({"latent": x["se_before_latent"][take], "text": x["se_before_text"][take],
                    "actions": x["se_actions"][take], "next_latent": x["se_after_latent"][take],
                    "next_text": x["se_after_text"][take], "mask": part >= 0, "row": part.astype(np.int32)})
    return out

  # ---- rewards -------------------------------------------------------------------------------------
  def extrinsic_rewards(self, records: Any) -> np.ndarray:
    """The world's reward when screen_explorer.task_reward is on, else none: exploration alone trains."""
    if self.config.screen_explorer.task_reward:
      return super().extrinsic_rewards(records)
    return np.zeros(np.shape(records.task_reward), np.float32)

  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    """The switched-on terms per record. "gate": each multiplied by the format check, so their sum is eq. 1's
    r_format x sum; "term": as they are, with r_format beside them (rl/screen_rewards.total either way). The
    world-model terms are 0 on steps the world model did not see (malformed ones: nothing to predict)."""
    from explore_jax.rl import screen_rewards as sr

    x = {k: np.asarray(v) for k, v in records.extras.items()}
    valid = np.asarray(records.valid, bool)
    fmt = (np.asarray(records.format_reward) > 0) & valid
    kept = (aux_outputs or {}).get(AUX) or {}
    n = len(valid)
    seen = np.zeros(n, bool)
    pred_latent, pred_text = np.zeros_like(x["se_after_latent"]), np.zeros_like(x["se_after_text"])
    if "latent" in kept:  # (no outputs at all where the world model saw no step)
      # The kept rows run to the last record the world model saw (train/aux_models.last_outputs), not to N.
      m = min(n, len(kept["seen"]))
      seen[:m] = np.asarray(kept["seen"])[:m]
      rows = np.flatnonzero(seen)
      pred_latent[rows], pred_text[rows] = np.asarray(kept["latent"])[rows], np.asarray(kept["text"])[rows]
    terms = {
        "inst_vis": lambda: sr.instant_change(x["se_before_latent"], x["se_after_latent"]),
        "inst_text": lambda: sr.instant_change(x["se_before_text"], x["se_after_text"]),
        "seq_vis": lambda: self._sequence(records, "se_before_latent", "se_after_latent", fmt),
        "seq_text": lambda: self._sequence(records, "se_before_text", "se_after_text", fmt),
        "world_vis": lambda: np.asarray(sr.world_model_surprise(x["se_after_latent"], pred_latent)) * seen,
        "world_text": lambda: np.asarray(sr.world_model_surprise(x["se_after_text"], pred_text)) * seen,
        "des": lambda: sr.intent_alignment(x["se_intent"], x["se_before_text"], x["se_after_text"]),
        "inter": lambda: sr.intent_box(x["se_intent"], x["se_box"], x["se_hit"]),
    }
    gate = fmt if self.config.screen_explorer.format == "gate" else valid
    out = {f"se_{t}": (np.asarray(terms[t]()) * gate).astype(np.float32) for t in self.terms}
    if self.config.screen_explorer.format == "term":
      out["se_format"] = fmt.astype(np.float32)
    return out

  def _sequence(self, records: Any, before: str, after: str, fmt: np.ndarray) -> np.ndarray:
    """r_seq per record: each trajectory's steps in order as one row of `sequence_change`."""
    from explore_jax.rl import screen_rewards as sr

    form = self.config.screen_explorer.sequence_form
    valid = np.asarray(records.valid, bool)
    traj, step = np.asarray(records.traj_id), np.asarray(records.step_index)
    counted = fmt if form == "code" else valid
    out = np.zeros(len(valid), np.float32)
    trajectories = sorted(set(traj[valid].tolist()))
    if not trajectories:
      return out
    T = int(step[valid].max()) + 1
    b, a = np.asarray(records.extras[before]), np.asarray(records.extras[after])
    afters = np.zeros((len(trajectories), T, a.shape[-1]), np.float32)
    firsts = np.zeros((len(trajectories), a.shape[-1]), np.float32)
    mask = np.zeros((len(trajectories), T), bool)
    where = {}
    for row, t in enumerate(trajectories):
      idx = np.flatnonzero(valid & (traj == t))
      idx = idx[np.argsort(step[idx])]
      afters[row, step[idx]] = a[idx]
      mask[row, step[idx]] = counted[idx]
      first = idx[counted[idx]]
      if first.size:
        firsts[row] = b[first[0]]
      where[row] = idx
    values = np.asarray(sr.sequence_change(firsts, afters, mask, form))
    for row, idx in where.items():
      out[idx] = values[row, step[idx]]
    return out

  # ---- the experience stream -------------------------------------------------------------------------
  def observe_update(self, iteration: int, records: Any, advantages: Any, valid: np.ndarray) -> dict[str, float]:
    """Keeps this iteration's distillation steps (module docstring) in <workdir>/distill/iter_<n>.jsonl, and
    every `snapshots_every` iterations a snapshot of what the agent did."""
    every = int(self.config.screen_explorer.get("snapshots_every", 0))
    if every > 0 and iteration % every == 0 and self.workdir and self._results:
      self._snapshot(iteration)
    d = self.config.screen_explorer.distill
    if not d.enabled or iteration < int(d.from_iteration) or not self.workdir:
      return {}
    from explore_jax.train import sft_data

    adv = np.asarray(advantages)
    fmt = np.asarray(records.format_reward) > 0
    traj, step = np.asarray(records.traj_id), np.asarray(records.step_index)
    hook, demos = self.prompt_hook(), []
    for i in np.flatnonzero(np.asarray(valid, bool) & fmt & (adv > 0)):
      result = self._results.get(int(traj[i]))
      if result is None or int(step[i]) >= len(result.steps):
        continue
      s = result.steps[int(step[i])]
      if not clear_intent(str(s.info.get("intent") or ""), int(d.min_intent_words)):
        continue
      history = [(past.observation, past.response_text) for past in result.steps[:int(step[i])]]
      demos.append(sft_data.demonstration(hook(s.observation, history, {}, {}), s.response_text))
    folder = os.path.join(self.workdir, "distill")
    os.makedirs(folder, exist_ok=True)
    kept = sft_data.write_demonstrations(os.path.join(folder, f"iter_{iteration:06d}.jsonl"), demos)
    return {"distill/steps_kept": float(kept)}


  def _snapshot(self, iteration: int) -> None:
    """<workdir>/screens/iter_<n>/: the first episode's screenshot before each step (step_<t>.png) and the
    replies with their rewards' inputs (steps.json): what the agent looked at and what it did."""
    import json

    from PIL import Image

    result = self._results[min(self._results)]
    folder = os.path.join(self.workdir, "screens", f"iter_{iteration:06d}")
    os.makedirs(folder, exist_ok=True)
    steps = []
    for t, s in enumerate(result.steps):
      if isinstance(s.observation, dict) and "screenshot" in s.observation:
        Image.fromarray(np.asarray(s.observation["screenshot"], np.uint8)).save(os.path.join(folder, f"step_{t}.png"))
      steps.append({"step": t, "reply": s.response_text, "action": s.info.get("action"),
                    "intent": s.info.get("intent", ""), "format_ok": bool(s.format_reward > 0)})
    with open(os.path.join(folder, "steps.json"), "w") as f:
      json.dump({"iteration": iteration, "trajectory": int(result.spec.traj_id), "steps": steps}, f, indent=1)


def _screens(step: Any) -> dict[str, Any]:
  screen = step.info.get("screen")
  if not screen or "before" not in screen:
    raise ValueError("ScreenExplorer reads info['screen'] of every step: the world must run inside "
                     "ScreenReading-v0 (config.env.screen_reading; envs/screen_reader.py)")
  return screen
