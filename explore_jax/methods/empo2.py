"""EMPO²: exploratory memory-augmented on- and off-policy optimization (METHODS.md "EMPO2"; the paper's section 3,
Algorithm 1, eq. 2, appendix B and table 3).

  Tips          after every training episode, in every mode, the policy writes one tip (`final_prompt`: the whole
                episode as a chat, then the paper's tip-generation prompt; rollout.final_max_new_tokens, the
                released code's 512). Evaluation writes none and reads none.
  Memory M      per task (a seed of the held-in pool), at most `memory_size` tips, oldest dropped, exact
                duplicates skipped; each entry holds the tip, its key (the embedding of the state it was written
                from: the episode's last observation) and the episode's return. entries="step" stores the
                released code's form instead: one entry per step, "<tip>; At that timestep, the specific action
                you took was a_t; Eventually you got the score R", keyed by the embedding of the final chat.
  Modes         a rollout is memory-free with probability p; otherwise memory-augmented, and then updated
                on-policy with its tips with probability q, off-policy otherwise (per rollout: the paper's
                Algorithm 1 as the issue reads it; mode_draw="iteration": one draw for the whole iteration, the
                released code's u < (1-p)(1-q) off-policy, u < 1-p on-policy with tips, else plain).
  Retrieval     a memory-augmented step embeds its query (the current observation; query="history": the chat
                without the system prompt, as the released code) through the learner's encoder (EmbedRequest),
                keeps the entries of cosine > `retrieve_threshold`, ranks them by return and shows at most
                `top_k` after the header, inside <tip>...</tip>, at the end of the step's user message.
  Off-policy    the record keeps the prompt without tips (Prompt.variants); update_batch scores an off-policy
                row's response under it, while its behaviour log-probs stay those sampled with tips (table 3).
  Masking       rl.loss.low_prob_mask: "token" (eq. 2) or "sequence" (the released code); configs say which.
  Novelty       novelty="state": r = 1/n over a memory of distinct states (empo2_memory.StateNovelty), every
                step, every mode; novelty="retrieved": the released code's 1/(count + 1), count = tips retrieved,
                in tip modes only; "off". Weighted by novelty_coef and added to the reward.

Memories are keyed by the task's seed, so training draws tasks from a finite pool (rollout.task_pool), and they
are checkpointed: tips in the JSON state, keys and returns in the orbax array state (float16, exact on resume).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Prompt, as_prompt
from explore_jax.methods.base import BuildContext, Method, ObservationPrompt, join_text, observation_text, \
    register_method
from explore_jax.methods.empo2_memory import StateNovelty, TipMemory, retrieve

# Appendix B, "Tip Generation Prompt" (as the released code words it too).
TIP_PROMPT = ("Thanks for your playing. Now you have ended a trajectory and collect some meaningless or valuable "
              "information from the interactions with the environment. Please summary the trajectory, and also "
              "summary what information you get from this trajectory, and how far this trajectory is from fully "
              "completing the task. Please response with only one sentence with only one line, do not include any "
              "extra words. You sentence should be less than 100 words.")
MEMORY_HEADER = "Here are some memories you collected in your previous exploration:"
NO_TIPS = "no_tips"                      # the prompt variant an off-policy update scores under
PLAIN, ON_POLICY, OFF_POLICY = 0, 1, 2   # a rollout's mode, as records carry it
MODE_NAMES = ("plain", "on_policy_tips", "off_policy")
MAX_TIP_CHARS = 600


def configure(c: Any) -> Any:
  """Writes EMPO²'s defaults into config `c`: GRPO's advantage (both the paper and the released code use it) and
  add_config's fields."""
  from explore_jax.methods import grpo

  grpo.configure(c, "grpo")
  c.method = "empo2"
  return add_config(c)


def add_config(c: Any) -> Any:
  """EMPO²'s own fields, for a config whose method includes it ("empo2", "sge+empo2"): the `empo2` block (the
  paper's symbols in the comments), eq. 2's token-level masking, and the sentence encoder retrieval embeds with."""
  import ml_collections

  c.embedding.encoder = "all-minilm-l6-v2"   # the released code's all-MiniLM-L6-v2
  c.rl.loss.low_prob_mask = "token"          # eq. 2; "sequence": the released code's (its config turns it off: "")
  c.rl.loss.low_prob_log_threshold = -5.0    # log delta; the paper gives none, the released code -5
  e = c.empo2 = ml_collections.ConfigDict()
  e.p_memory_free = 0.75         # p: a rollout is memory-free with probability p
  e.q_on_policy = 1 / 3          # q: a memory-augmented rollout is updated on-policy (tips kept) with probability q
  e.mode_draw = "rollout"        # "rollout": p and q drawn per rollout; "iteration": once per iteration (released)
  e.memory_size = 1000           # |M| per task, oldest dropped
  e.top_k = 10                   # tips shown at most
  e.retrieve_threshold = 0.5     # cosine similarity a tip's key must exceed
  e.entries = "episode"          # "episode": a tip per episode (paper); "step": one entry per step (released)
  e.query = "state"              # "state": the observation (paper); "history": the chat (released)
  e.novelty = "state"            # r = 1/n over distinct states (paper); "retrieved": 1/(count + 1) (released); "off"
  # The paper adds 1/n to ScienceWorld's 0-100 score; our rewards are that score / 100, so the same weight is 0.01.
  e.novelty_coef = 0.01
  e.novelty_threshold = 0.95     # cosine at or above which two states are "similar" (the paper gives none)
  e.state_memory_size = 1000     # distinct states kept per task for the novelty reward
  e.tip_prompt = TIP_PROMPT
  e.memory_header = MEMORY_HEADER
  # Past rollout.max_prompt_tokens, a memory-augmented step drops its lowest-ranked tips and a tip prompt the middle
  # of its episode (TipPrompt), so that neither loses its observation or task to the actor's left cut; False cuts
  # from the left as the first EMPO2 protocol runs did (configs/protocols/empo2.py, round 0).
  e.fit_prompts = True
  return c


def draw_mode(u_memory: float, u_update: float, p: float, q: float) -> int:
  """Algorithm 1, lines 5 and 24: memory-free with probability p, else on-policy with tips with q, else
  off-policy (two uniforms, so the stream does not depend on the outcome)."""
  if u_memory < p:
    return PLAIN
  return ON_POLICY if u_update < q else OFF_POLICY


def draw_iteration_mode(u: float, p: float, q: float) -> int:
  """The released code's one draw per iteration: u < (1-p)(1-q) off-policy, u < 1-p on-policy with tips
  (0.17 / 0.25 at p = 0.75, q = 1/3), else plain."""
  if u < (1 - p) * (1 - q):
    return OFF_POLICY
  return ON_POLICY if u < 1 - p else PLAIN


def tip_block(tips: list[str], header: str = MEMORY_HEADER) -> str:
  """What a memory-augmented step's user message ends with."""
  return join_text(header, "<tip>" + "\n".join(tips) + "</tip>")


def chat_text(messages: list[dict[str, str]]) -> str:
  """A chat as the released code embeds it: "role:content" lines, the system prompt left out."""
  return "\n".join(f"{m['role']}:{m['content']}" for m in messages if m["role"] != "system")


@dataclasses.dataclass(frozen=True)
class TipPrompt:
  """The actors' prompt: whatever `inner` builds (ObservationPrompt's, or SGE's strategy prompt in "empo2+sge"),
  with retrieved tips in memory-augmented steps and the tip-generation prompt after a training episode.
  Picklable, jax-free."""
  inner: Any = dataclasses.field(default_factory=ObservationPrompt)
  tip_prompt: str = TIP_PROMPT
  header: str = MEMORY_HEADER
  retrieve_threshold: float = 0.5
  top_k: int = 10
  query: str = "state"
  fit: bool = True  # shorter forms past the budget (fewer tips; a tip prompt without the episode's middle)

  def __post_init__(self):
    clashes = [name for name in ("embedding_texts", "final_prompt") if hasattr(self.inner, name)]
    if clashes:
      raise ValueError(f"EMPO2's tips cannot wrap a prompt hook that has its own {clashes}")

  def embedding_texts(self, observation, history, context, info) -> list[str]:
    if not context.get("memory"):
      return []
    if self.query == "history":
      return [chat_text(self._inner(observation, history, context, info).messages)]
    return [observation_text(observation)]

  def _inner(self, observation, history, context, info) -> Prompt:
    return as_prompt(self.inner(observation, history, context, info))

  def __call__(self, observation, history, context, info):
    inner = self._inner(observation, history, context, info)
    messages = inner.messages
    if context.get("mode", PLAIN) == PLAIN:
      return inner if inner.variants or inner.images or inner.notes or inner.shorter else messages
    memory = context.get("memory")
    shown = []
    if memory and "embeddings" in info:
      order = retrieve(memory["keys"], memory["returns"], np.asarray(info["embeddings"])[0],
                       threshold=self.retrieve_threshold, k=self.top_k)
      shown = [memory["tips"][i] for i in order]

    def forms():
      # Past the budget the inner prompt's shorter forms come first, with every tip; then, on the shortest of them,
      # the tips go one at a time, lowest ranked first: a step never loses its observation to its tips.
      last = messages
      for form, _ in itertools.islice(inner.forms(), 1, None):
        last = form
        yield Prompt(self.with_tips(form, shown), notes={**inner.notes, "tips": len(shown)})
      for k in range(len(shown) - 1, -1, -1):
        yield Prompt(self.with_tips(last, shown[:k]), notes={**inner.notes, "tips": k})

    return Prompt(self.with_tips(messages, shown), variants={**inner.variants, NO_TIPS: messages},
                  images=inner.images, notes={**inner.notes, "tips": len(shown)}, shorter=forms() if self.fit else ())

  def with_tips(self, messages: list[dict[str, str]], tips: list[str]) -> list[dict[str, str]]:
    """`messages` with `tips` (best first) after the last message's text, or as they are when there are none."""
    if not tips:
      return messages
    last = messages[-1]
    return messages[:-1] + [{**last, "content": join_text(last["content"], tip_block(tips, self.header))}]

  def final_prompt(self, observation, history, context, info) -> Optional[Prompt]:
    """The whole episode as a chat, then the final observation and the tip-generation prompt. Past the budget
    the middle of the episode goes first, oldest first: its first step (where it started) and its last steps
    stay, then only the final observation is left."""
    if not context.get("tip"):
      return None
    final = {"role": "user", "content": join_text(observation_text(observation), self.tip_prompt)}
    chat = lambda steps: self.episode_chat(observation, steps) + [final]  # noqa: E731
    n = len(history)
    shorter = itertools.chain((chat(history[:1] + history[n - k:]) for k in range(n - 2, -1, -1)), [chat([])])
    return Prompt(chat(history), shorter=shorter if history and self.fit else ())

  def episode_chat(self, observation, history) -> list[dict[str, str]]:
    system = getattr(self.inner, "system", "")
    messages = [{"role": "system", "content": system}] if system else []
    for past, action in history:
      messages += [{"role": "user", "content": observation_text(past)}, {"role": "assistant", "content": action}]
    return messages

  def oracle_final_text(self, observations: list[str], actions: list[str], final_observation: str,
                        success: bool) -> str:
    """The tip a warm start teaches for an oracle episode (train/sft_data.py): where it went (its actions), what
    it found last (the final observation's first sentence, leaving out the lines every observation repeats, such
    as the task) and the outcome. The tiny model cannot write a tip otherwise; a pretrained one writes its own
    zero-shot."""
    repeated = set(str(observations[0]).splitlines()) if observations else set()
    fresh = [line for line in str(final_observation).splitlines() if line not in repeated]
    first = " ".join(" ".join(fresh or [str(final_observation)]).split()).split(". ")[0][:160]
    outcome = "the task is complete" if success else "the task is not complete yet"
    return f"I did {'; '.join(actions[-8:])}; then I saw: {first}; {outcome}."


@register_method("empo2")
class EMPO2(Method):
  """Tips written by the policy, memory-augmented rollouts, on- and off-policy updates, a novelty reward."""

  name = "empo2"
  intrinsic_names = ("novelty",)

  def __init__(self, config: Any):
    super().__init__(config)
    e = config.empo2
    for name in ("p_memory_free", "q_on_policy"):
      if not 0.0 <= float(e[name]) <= 1.0:
        raise ValueError(f"empo2.{name} must be a probability, got {e[name]}")
    choices = {"mode_draw": ("rollout", "iteration"), "entries": ("episode", "step"), "query": ("state", "history"),
               "novelty": ("state", "retrieved", "off")}
    for name, allowed in choices.items():
      if e[name] not in allowed:
        raise ValueError(f"empo2.{name} must be one of {allowed}, got {e[name]!r}")
    if int(config.rollout.task_pool) <= 0:
      raise ValueError("EMPO2 keeps its memories per task: set rollout.task_pool to the held-in pool's size")
    self.slots = int(config.rollout.task_pool)
    self.tips = TipMemory(int(e.memory_size))
    self.states = StateNovelty(int(e.state_memory_size), float(e.novelty_threshold))
    self.encode = None
    self.dim = 0
    self._iteration_draw: Optional[tuple[float, float]] = None
    self._novelty: dict[tuple[int, int], float] = {}
    self._restoring: dict[str, Any] = {}

  def setup(self, ctx: BuildContext) -> None:
    if ctx.encode is None:
      raise ValueError("EMPO2 needs the run's text encoder (BuildContext.encode)")
    self.encode, self.dim = ctx.encode, int(ctx.embedding_dim)

  # ---- rollout -------------------------------------------------------------------------------------
  def prompt_hook(self) -> TipPrompt:
    return self.wrap_prompt_hook(super().prompt_hook())

  def wrap_prompt_hook(self, hook: Any) -> TipPrompt:
    e = self.config.empo2
    return TipPrompt(inner=hook, tip_prompt=e.tip_prompt, header=e.memory_header,
                     retrieve_threshold=float(e.retrieve_threshold), top_k=int(e.top_k), query=e.query,
                     fit=bool(e.fit_prompts))

  def episode_context(self, spec: EpisodeSpec, rng: np.random.Generator) -> dict[str, Any]:
    e = self.config.empo2
    u = (float(rng.random()), float(rng.random()))  # drawn for every episode: the stream never depends on M
    if e.mode_draw == "iteration":
      if spec.traj_id == 0:  # an iteration's specs start at trajectory 0: its first draw is the iteration's
        self._iteration_draw = u
      mode = draw_iteration_mode(self._iteration_draw[0], float(e.p_memory_free), float(e.q_on_policy))
    else:
      mode = draw_mode(*u, float(e.p_memory_free), float(e.q_on_policy))
    context: dict[str, Any] = {"mode": mode, "tip": True}
    memory = self.tips.snapshot(self._slot(spec))
    if mode != PLAIN and memory is not None:
      context["memory"] = memory
    return context

  def _slot(self, spec: EpisodeSpec) -> int:
    if not 0 <= spec.seed < self.slots:
      raise ValueError(f"EMPO2: task seed {spec.seed} is outside the held-in pool 0..{self.slots - 1}")
    return int(spec.seed)

  # ---- bookkeeping ---------------------------------------------------------------------------------
  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    """Algorithm 1, lines 18-20: each finished training episode's tip enters M; the novelty of its states."""
    if not training:
      return {}
    e = self.config.empo2
    finished = sorted((r for r in results if not r.dropped and r.steps), key=lambda r: r.spec.episode_id)
    if e.entries == "episode":  # keyed by the state the tip was written from
      key_texts = [r.final_observation for r in finished]
    else:  # keyed by the final chat, as the released code keys every step's entry
      hook = self.prompt_hook()
      key_texts = [chat_text(hook.episode_chat(r.final_observation, [(s.observation, s.response_text)
                                                                     for s in r.steps])) for r in finished]
    keys = self._encode(key_texts)
    added = 0
    for r, key in zip(finished, keys):
      tip = " ".join(r.final_text.split())[:MAX_TIP_CHARS]
      if e.entries == "episode":
        added += self.tips.add(self._slot(r.spec), tip, key, r.total_reward)
      else:
        for s in r.steps:
          entry = (f"{tip}; At that timestep, the specific action you took was {' '.join(s.response_text.split())}; "
                   f"Eventually you got the score {r.total_reward:g}")
          added += self.tips.add(self._slot(r.spec), entry, key, r.total_reward)
    self._novelty = self._novelty_of(finished)
    modes = np.array([r.spec.context.get("mode", PLAIN) for r in finished])
    shown = [s.prompt_notes.get("tips", 0) for r in finished for s in r.steps if r.spec.context.get("memory")]
    n = max(len(finished), 1)
    return {"empo2/plain": float((modes == PLAIN).sum()) / n, "empo2/on_policy_tips": float((modes == ON_POLICY).sum()) / n,
            "empo2/off_policy": float((modes == OFF_POLICY).sum()) / n, "empo2/tips_added": float(added),
            "empo2/tips_shown_per_step": float(np.mean(shown)) if shown else 0.0,
            "empo2/memory_per_task": float(np.mean([self.tips.size(t) for t in range(self.slots)])),
            "empo2/novelty_mean": float(np.mean(list(self._novelty.values()))) if self._novelty else 0.0}

  def _novelty_of(self, finished: list[EpisodeResult]) -> dict[tuple[int, int], float]:
    kind = self.config.empo2.novelty
    out: dict[tuple[int, int], float] = {}
    if kind == "state":
      steps = [(r, s) for r in finished for s in r.steps]
      keys = self._encode([observation_text(s.observation) for _, s in steps])
      for (r, s), key in zip(steps, keys):
        out[(r.spec.episode_id, s.step_index)] = self.states.reward(self._slot(r.spec), key)
    elif kind == "retrieved":
      for r in finished:
        tips_mode = r.spec.context.get("mode", PLAIN) != PLAIN
        for s in r.steps:
          out[(r.spec.episode_id, s.step_index)] = 1.0 / (s.prompt_notes.get("tips", 0) + 1) if tips_mode else 0.0
    return out

  def _encode(self, texts: list[str]) -> np.ndarray:
    """The encoder's rows for `texts`, each distinct text encoded once (an episode revisits its states)."""
    distinct = sorted(set(texts))
    if not distinct:
      return np.zeros((0, self.dim), np.float32)
    rows = np.asarray(self.encode(distinct), np.float32)
    index = {t: i for i, t in enumerate(distinct)}
    return rows[[index[t] for t in texts]]

  # ---- records -------------------------------------------------------------------------------------
  def record_fields(self, ctx: BuildContext) -> dict[str, Any]:
    from explore_jax.replay import ExtraField

    P = int(self.config.rollout.max_prompt_tokens)
    return {"empo2_mode": ExtraField((), "int32"), "empo2_novelty": ExtraField((), "float32"),
            "empo2_prompt_without_tips": ExtraField((P,), "int32", pad="left"),
            "empo2_prompt_without_tips_mask": ExtraField((P,), "bool", pad="left")}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    P = int(self.config.rollout.max_prompt_tokens)
    mode = int(result.spec.context.get("mode", PLAIN))
    out = []
    for s in result.steps:
      ids = np.asarray(s.prompt_variants.get(NO_TIPS, s.prompt_ids)[-P:], np.int32)
      out.append({"empo2_mode": np.int32(mode),
                  "empo2_novelty": np.float32(self._novelty.get((result.spec.episode_id, s.step_index), 0.0)),
                  "empo2_prompt_without_tips": ids, "empo2_prompt_without_tips_mask": np.ones(len(ids), bool)})
    return out

  # ---- learning ------------------------------------------------------------------------------------
  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    bonus = np.asarray(records.extras["empo2_novelty"], np.float32) * np.asarray(records.valid, np.float32)
    return {"novelty": (float(self.config.empo2.novelty_coef) * bonus).astype(np.float32)}

  def update_batch(self, batch: dict[str, Any], records: Any, rng: np.random.Generator) -> dict[str, Any]:
    """Table 3's off-policy row: the response is scored under the prompt without tips; the behaviour log-probs
    (sampled with them) and everything else stay."""
    import jax.numpy as jnp

    off = jnp.asarray(np.asarray(records.extras["empo2_mode"]) == OFF_POLICY)[:, None]
    return {**batch,
            "prompt_tokens": jnp.where(off, jnp.asarray(records.extras["empo2_prompt_without_tips"]),
                                       batch["prompt_tokens"]),
            "prompt_mask": jnp.where(off, jnp.asarray(records.extras["empo2_prompt_without_tips_mask"]),
                                     batch["prompt_mask"])}

  # ---- checkpoints ---------------------------------------------------------------------------------
  def state_dict(self) -> dict[str, Any]:
    return {"tips": self.tips.texts()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self._restoring["texts"] = state.get("tips", {})
    self._restore()

  def array_state(self) -> Any:
    return {"tips": self.tips.arrays(self.slots, self.dim), "states": self.states.arrays(self.slots, self.dim)}

  def load_array_state(self, tree: Any) -> None:
    self._restoring["arrays"] = {k: {n: np.asarray(v) for n, v in d.items()} for k, d in tree.items()}
    self._restore()

  def _restore(self) -> None:
    """A checkpoint's memories: the tips' texts (JSON) and their keys (arrays) arrive by two hooks, in either
    order; the memories are rebuilt once both are there."""
    if {"texts", "arrays"} <= set(self._restoring):
      arrays = self._restoring["arrays"]
      self.tips.restore(self._restoring["texts"], arrays["tips"])
      self.states.restore(arrays["states"])
      self._restoring = {}
