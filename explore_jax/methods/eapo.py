"""EAPO: explore/memory fields, a learned variational exploration reward q_phi, exploration-aware grouping and
rollback SFT (METHODS.md "EAPO"; the paper's eqs. 8-14; the authors' released reward manager where it is precise).

  Fields       the world is answered in EAPO's fields (config.env.answer = "fields", envs/fields.py):
               <think>..</think><explore>e_t</explore><memory>m_t</memory><action>.. \\boxed{a} ..</action>; the
               boxed action is played, anything else is an invalid action with format reward 0. FieldsPrompt
               carries the previous answer's e_{t-1} and m_{t-1} into the next input and states the format.
  q_phi        an aux model of the policy's architecture, {"q", "prior"} both copies of the policy RL starts
               from (after the warm start, which is what taught it the fields; LoRA merged; the prior frozen),
               AdamW at 1e-4 with clipping 1.0 and decay 0.01 (torch's AdamW
               default, as released), checkpointed with the run. Each step record carries two rows of token ids
               (record fields `eapo_q_*`): the state s_t (the step's observation), then a target, the plain
               "<explore>e_t</explore>\\n<memory>m_t</memory>" or the explored one with s_{t+1} appended to the
               memory. The state is cut from the left to fit `eapo.q_phi.max_tokens`.
               Trained in the "before_rewards" phase, as the released manager trains on each sample's targets
               before it scores them: `eapo.q_phi.epochs` passes of eq. 8 (rl/q_phi.py) over the iteration's
               targets in batches of `eapo.q_phi.batch_size`, weighted by the step's task reward.
               With LoRA on, q_phi is still a full copy (the policy's base with its adapters merged), not
               adapters on the shared base: q and the prior are two more policy-sized parameter sets, and q's AdamW
               moments two more, i.e. 4x the policy's parameters beside it, for the simplest exact q_phi (its own
               optimizer, checkpoint and shardings, nothing shared with the policy's update).
  Rewards      R = R_task + alpha1 R_format + alpha2 R_explore (eq. 10): the intrinsic terms "eapo_format"
               (alpha1 R_format) and "eapo_explore" (alpha2 R_explore, eq. 9: max{q(plain | s_t), gamma^2
               q(explored | s_t)}, each q = exp of the clamped log q, eapo.clamp "sequence" or "token_mean"). Each
               term is added once; the released manager adds both a second time (eapo_fields' docstring).
  Grouping     the `eapo` estimator: step returns normalised within (state, visitation depth) groups of the
               task group (eqs. 12-14; rl/advantages.py).
  Rollback     SFT on verified rollback transitions (methods/eapo_rollback.py): the prompt the policy saw at
               s' with eq. 11's rollback instruction x and the state s after its observation, and an answer whose
               boxed action takes it back to s (explore = that action, memory = the step's own memory where it
               wrote one). First as Algorithm 1's stage before RL (the cold start,
               `eapo.rollback.cold_start`: mined from the oracle's episodes of the warm start's seeds, cached with
               the warm start, train/warm_start.py), then after the iterations `eapo.rollback.every` names, mined
               from the iteration's own episodes. Each stage rehearses the oracle's own steps beside the
               rollbacks (`rehearsal`: on rollbacks alone the tiny warm start unlearnt its fields,
               docs/results.md "EAPO"). Candidates are the episodes' own steps back and the admissible actions as
               guesses; with `eapo.rollback.teacher` (a checkpoint), a teacher model's answers too,
               asked as the paper asks, with s' and s (eapo_rollback.teacher_rollbacks). Replay keeps what is true.

Indexing. The paper writes eq. 9 with e_{t-1}, m_{t-1} scored given s_t; the released manager scores, for each
sampled response, that response's own fields given the state it answered, with the next state appended for the
explored target. That is what is done here: step t's record gets R_explore from its fields e_t, m_t, its state s_t
and the state s_{t+1} its action reached. The released state text is the repr of the whole chat prompt; here it is
the observation s_t, the state eq. 9 conditions on, which keeps q_phi's rows short.

Ablations are overrides: no R_explore (eapo.alpha2=0), plain group-relative normalisation of the same step returns
over the task group (rl.advantage_options.groups=task), no rollback SFT (eapo.rollback.enabled=False: neither
stage). Every method logs the share of steps that revisit a state and the size of the (state, depth) groups
(train/rollout.revisit_measures).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult
from explore_jax.methods import grpo
from explore_jax.methods.base import Method, ObservationPrompt, SFTRequest, join_text, observation_text, register_method
from explore_jax.methods.eapo_fields import (CLAMPS, Fields, answer_text, explored_target_text, parse_fields,
                                             target_text)

AUX = "q_phi"
TOKENS, ATTENTION, TARGET = "eapo_q_tokens", "eapo_q_attention", "eapo_q_target"
ROLLBACK_INSTRUCTION = "Go back to the state you were in before:"  # eq. 11's x, followed by that state s
FORMAT = ("Answer in four blocks: <think>your reasoning</think><explore>the actions you are unsure of and "
          "might try</explore><memory>what you have seen so far</memory><action>\\boxed{your next action}"
          "</action>.")


def configure(c: Any) -> Any:
  """EAPO's recipe on a config: GRPO's clipped loss at token-mean, the `eapo` estimator and its own fields."""
  grpo.configure(c, "grpo")
  c.method = "eapo"
  c.rl.loss.aggregation = "token-mean"
  return add_config(c)


def add_config(c: Any) -> Any:
  """EAPO's own fields (table 3's settings where it gives them), for a config whose method includes it."""
  import ml_collections

  c.env.answer = "fields"
  c.rl.advantage = "eapo"
  # groups: "state_depth" (eqs. 12-14) or "task", the ablation normalising the same step returns over the task group.
  c.rl.advantage_options = {"gamma": 0.9, "eps": 1e-6, "normalize_std": True, "groups": "state_depth"}
  e = c.eapo = ml_collections.ConfigDict()
  e.alpha1 = 0.5                 # R_format's weight (eq. 10)
  e.alpha2 = 1.0                 # R_explore's weight; 0 is the no-R_explore ablation
  e.gamma = 0.9                  # eq. 9's discount of the explored target
  e.clamp = "sequence"           # log q as the clamped sum ("sequence") or per-token mean ("token_mean")
  q = e.q_phi = ml_collections.ConfigDict()
  q.learning_rate = 1e-4
  q.max_grad_norm = 1.0
  q.weight_decay = 0.01
  q.beta = 1.0
  q.kappa = 1.0
  q.max_tokens = 256             # a row: the state then one target
  q.batch_size = 16              # rows per q_phi step (and per scoring pass)
  q.epochs = 1                   # passes over the iteration's targets (the released code: one step each)
  r = e.rollback = ml_collections.ConfigDict()
  r.enabled = True               # False: the no-rollback ablation (neither the cold start nor the later stages)
  r.cold_start = True            # Algorithm 1's first stage: SFT on the oracle episodes' verified rollbacks before RL
  r.cold_start_steps = 32
  r.cold_start_max_replays = 512
  # Rehearsal: beside its rollbacks, each stage trains on up to `rehearsal` x as many of the oracle's own steps (those
  # the warm start imitated), so that a policy that learnt the fields in its warm start keeps them; 0: rollbacks
  # alone (eq. 11). On rollbacks alone the tiny KeyDoor warm start fell from 0.58 to 0.00 held-in pass@1 in the
  # cold start, and 4 steps of a later stage took held-out success from 0.33 to 0.13 (docs/results.md "EAPO"). At 2
  # the cold start's 298 KeyDoor rollbacks take all 421 of the oracle's steps, the setting measured.
  r.rehearsal = 2.0
  r.every = 5                    # SFT on verified rollbacks after iterations 0, every, 2 every, ...; 0: off
  r.admissible = True            # mine the admissible actions as guesses too
  r.teacher = ""                 # a teacher model asked for ways back (the paper's source): a checkpoint dir or .gguf
  r.teacher_max_new_tokens = 16
  r.max_replays = 64             # replays per iteration (each resets the world and replays a prefix)
  r.steps = 4
  r.batch_size = 16
  r.learning_rate = 1e-4
  return c


@dataclasses.dataclass(frozen=True)
class FieldsPrompt:
  """The run's prompt with the previous answer's explore and memory fields and the answer format after the
  observation; the earlier answers it is given as history are their boxed actions (what the inner prompt lists
  of them). Picklable, jax-free."""
  inner: Any = dataclasses.field(default_factory=ObservationPrompt)

  def __call__(self, observation, history, context, info):
    previous = parse_fields(history[-1][1])[0] if history else None
    carried = (f"Your exploration notes: {previous.explore}\nYour memory: {previous.memory}"
               if previous is not None else "")
    text = join_text(observation_text(observation), carried, FORMAT)
    shown = {**observation, "text": text} if isinstance(observation, dict) else text
    return self.inner(shown, [(o, _action_of(r)) for o, r in history], context, info)


def _action_of(response: str) -> str:
  """What the inner prompt shows of an earlier answer (its history, its list of last actions): the boxed action, or
  the response itself where it did not parse."""
  fields, _ = parse_fields(response)
  return response if fields is None else fields.action


def _token_ids(tokenizer: Any, text: str) -> list[int]:
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def q_rows(tokenizer: Any, result: EpisodeResult, max_tokens: int) -> list[dict[str, np.ndarray]]:
  """Each step's two q_phi rows (plain and explored target after the state, right-padded to `max_tokens`):
  token ids, real-token mask and target mask; a malformed answer's rows are empty."""
  out = []
  observations = [observation_text(s.observation) for s in result.steps] + [result.final_observation]
  for t, step in enumerate(result.steps):
    tokens = np.zeros((2, max_tokens), np.int32)
    attention = np.zeros((2, max_tokens), bool)
    target = np.zeros((2, max_tokens), bool)
    fields, _ = parse_fields(step.response_text)
    if fields is not None:
      state = _token_ids(tokenizer, observations[t]) or [0]
      for row, text in enumerate((target_text(fields.explore, fields.memory),
                                  explored_target_text(fields.explore, fields.memory, observations[t + 1]))):
        goal = _token_ids(tokenizer, text)[:max_tokens - 1]
        ids = state[-(max_tokens - len(goal)):] + goal
        tokens[row, :len(ids)] = ids
        attention[row, :len(ids)] = True
        target[row, len(ids) - len(goal):len(ids)] = True
    out.append({TOKENS: tokens, ATTENTION: attention, TARGET: target})
  return out


@register_method("eapo")
class EAPO(Method):
  """The fields prompt, q_phi's rows and model, eq. 10's terms, rollback SFT; grouping by the `eapo` estimator."""

  name = "eapo"
  intrinsic_names = ("eapo_format", "eapo_explore")

  def __init__(self, config: Any):
    super().__init__(config)
    if config.env.get("answer", "plain") != "fields":
      raise ValueError("EAPO's answers are its fields: set env.answer to 'fields'")
    if config.eapo.clamp not in CLAMPS:
      raise ValueError(f"eapo.clamp must be one of {CLAMPS}, got {config.eapo.clamp!r}")
    self.tokenizer: Any = None
    self.model: Any = None
    self._teacher: Any = None  # the rollback teacher (sampling/text.ChatModel), loaded on first use
    self._oracle_demos: Optional[list[dict[str, Any]]] = None  # what the later stages rehearse, built on first use

  def setup(self, ctx) -> None:
    self.tokenizer, self.model = ctx.tokenizer, ctx.model

  # ---- rollout -------------------------------------------------------------------------------------
  def prompt_hook(self) -> FieldsPrompt:
    return self.wrap_prompt_hook(super().prompt_hook())

  def wrap_prompt_hook(self, hook: Any) -> FieldsPrompt:
    return FieldsPrompt(inner=hook)

  # ---- records and q_phi ---------------------------------------------------------------------------
  def record_fields(self, ctx) -> dict[str, Any]:
    from explore_jax.replay import ExtraField

    n = int(self.config.eapo.q_phi.max_tokens)
    return {TOKENS: ExtraField((2, n), "int32"), ATTENTION: ExtraField((2, n), "bool"),
            TARGET: ExtraField((2, n), "bool")}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    return q_rows(self.tokenizer, result, int(self.config.eapo.q_phi.max_tokens))

  def aux_models(self, ctx) -> dict[str, Any]:
    from explore_jax.rl import q_phi
    from explore_jax.train.aux_models import AuxModelSpec

    q = self.config.eapo.q_phi
    axes = ctx.model.param_axes()
    # Shapes only: the learner restarts q_phi from the policy RL starts from (`from_policy`) before any use, and a
    # resumed run restores it. A fresh init, not the starting weights closed over: those would be compiled in as
    # constants of the init program.
    init = lambda key: {"q": ctx.model.init(key), "prior": ctx.model.init(key)}  # noqa: E731
    loss = functools.partial(q_phi.loss_and_metrics, ctx.model, beta=float(q.beta), kappa=float(q.kappa))
    return {AUX: AuxModelSpec(init=init, loss=loss, batches=self._q_batches, param_axes={"q": axes, "prior": axes},
                              frozen=("prior",), phase="before_rewards", learning_rate=float(q.learning_rate),
                              max_grad_norm=float(q.max_grad_norm), weight_decay=float(q.weight_decay),
                              from_policy=lambda policy: {"q": policy, "prior": policy})}

  def _rows(self, records: Any) -> dict[str, np.ndarray]:
    """The records' q_phi rows flattened to [2N, T] (plain then explored per record), with [2N] valid and reward."""
    tokens = np.asarray(records.extras[TOKENS])
    n, _, width = tokens.shape
    target = np.asarray(records.extras[TARGET]).reshape(2 * n, width)
    return {"tokens": tokens.reshape(2 * n, width),
            "attention": np.asarray(records.extras[ATTENTION]).reshape(2 * n, width), "target": target,
            "valid": np.repeat(np.asarray(records.valid, bool), 2) & target.any(-1),
            "reward": np.repeat(np.asarray(records.task_reward, np.float32), 2)}

  def _q_batches(self, records: Any) -> list[dict[str, np.ndarray]]:
    rows = self._rows(records)
    live = np.flatnonzero(rows["valid"])
    size = int(self.config.eapo.q_phi.batch_size)
    out = []
    for _ in range(int(self.config.eapo.q_phi.epochs)):
      for start in range(0, len(live), size):
        out.append(_padded({k: v[live[start:start + size]] for k, v in rows.items()}, size))
    return out

  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    import jax.numpy as jnp

    from explore_jax.rl import q_phi

    e = self.config.eapo
    valid = np.asarray(records.valid, bool)
    rows = self._rows(records)
    sums, counts = self._scores(aux_params[AUX]["q"], rows)
    log_q = np.asarray(q_phi.clamped_log_q(jnp.asarray(sums), jnp.asarray(counts), e.clamp)).reshape(-1, 2)
    ok = rows["valid"].reshape(-1, 2)
    explore = np.asarray(q_phi.explore_rewards(log_q[:, 0], log_q[:, 1], ok[:, 0], ok[:, 1], float(e.gamma)))
    fmt = np.asarray(records.format_reward, np.float32)
    return {"eapo_format": (float(e.alpha1) * fmt * valid).astype(np.float32),
            "eapo_explore": (float(e.alpha2) * explore * valid).astype(np.float32)}

  def _scores(self, params: Any, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[2N] summed target log-probs and target counts under q, in fixed-size batches of the live rows."""
    import jax

    sums = np.zeros(len(rows["valid"]), np.float32)
    counts = np.zeros(len(rows["valid"]), np.float32)
    live = np.flatnonzero(rows["valid"])
    size = int(self.config.eapo.q_phi.batch_size)
    score = _jitted_scores(self.model)
    chunks = [live[start:start + size] for start in range(0, len(live), size)]
    outputs = []
    for idx in chunks:  # every batch queued before one transfer back
      part = _padded({k: rows[k][idx] for k in ("tokens", "attention", "target")}, size)
      outputs.append(score(params, part["tokens"], part["attention"], part["target"]))
    for idx, (s, c) in zip(chunks, jax.device_get(outputs)):
      sums[idx], counts[idx] = np.asarray(s)[:len(idx)], np.asarray(c)[:len(idx)]
    return sums, counts

  # ---- rollback SFT --------------------------------------------------------------------------------
  def cold_start_key(self) -> Optional[dict[str, Any]]:
    r = self.config.eapo.rollback
    if not (r.enabled and r.cold_start and int(r.cold_start_steps) > 0):
      return None
    key = {k: r[k] for k in ("admissible", "cold_start_steps", "cold_start_max_replays", "rehearsal",
                             "batch_size", "learning_rate")}
    if r.teacher:
      key.update(teacher=r.teacher, teacher_max_new_tokens=int(r.teacher_max_new_tokens))
    return {"rollback": key}

  def cold_start_request(self, episodes: list[EpisodeResult]) -> Optional[SFTRequest]:
    """Algorithm 1's first stage: SFT on the verified rollbacks of the oracle's episodes (those the warm start
    imitates; a searching oracle walks back through rooms it has seen), before any RL step."""
    from explore_jax.train import sft_data

    r = self.config.eapo.rollback
    demos = self.rollback_demonstrations(episodes, max_replays=int(r.cold_start_max_replays))
    if not demos:
      return None
    seed = int(self.config.sft.get("seed", 0))
    if float(r.rehearsal) > 0:
      demos += self._rehearsal(sft_data.episode_demos(episodes, self.prompt_hook()), len(demos), seed)
    return SFTRequest(tuple(demos), steps=int(r.cold_start_steps), batch_size=int(r.batch_size),
                      learning_rate=float(r.learning_rate), seed=seed, label="eapo_rollback_cold_start")

  def sft_request(self, iteration: int, results: list[EpisodeResult]) -> Optional[SFTRequest]:
    """The later stages: SFT on the iteration's verified rollbacks, beside the oracle's steps (`rehearsal`)."""
    from explore_jax.train import sft_data

    r = self.config.eapo.rollback
    if not r.enabled or int(r.every) <= 0 or iteration % int(r.every):
      return None
    demos = self.rollback_demonstrations(results)
    if not demos:
      return None
    if float(r.rehearsal) > 0:
      if self._oracle_demos is None:
        self._oracle_demos = sft_data.episode_demos(sft_data.warm_start_oracle_episodes(self.config),
                                                    self.prompt_hook())
      demos += self._rehearsal(self._oracle_demos, len(demos), iteration)
    return SFTRequest(tuple(demos), steps=int(r.steps), batch_size=int(r.batch_size),
                      learning_rate=float(r.learning_rate), seed=iteration, label="eapo_rollback")

  def _rehearsal(self, pool: list[dict[str, Any]], rollbacks: int, seed: int) -> list[dict[str, Any]]:
    """Up to eapo.rollback.rehearsal x `rollbacks` of the oracle's step demonstrations `pool`: all of them, in order,
    when that many or fewer; else a draw without replacement, in order, from `seed`'s stream."""
    n = int(float(self.config.eapo.rollback.rehearsal) * rollbacks)
    if n >= len(pool):
      return list(pool)
    return [pool[i] for i in sorted(np.random.default_rng(seed).choice(len(pool), n, replace=False))]

  def rollback_demonstrations(self, results: list[EpisodeResult], max_replays: Optional[int] = None
                              ) -> list[dict[str, Any]]:
    """(prompt at s', answer taking the rollback action) for the verified rollbacks of `results` (module
    docstring), replayed in one instance of the world the episodes played; at most `max_replays` replays
    (default eapo.rollback.max_replays)."""
    import gymnasium

    from explore_jax.methods.eapo_rollback import teacher_rollbacks, verified_rollbacks
    from explore_jax.train import sft_data

    r = self.config.eapo.rollback
    finished = [res for res in results if not res.dropped and res.steps]
    if not finished:
      return []
    spec = finished[0].spec
    env = gymnasium.make(spec.env_id, **spec.env_kwargs)
    try:
      kept = verified_rollbacks(env, finished, admissible=bool(r.admissible),
                                answer=replay_answer,
                                max_replays=int(r.max_replays if max_replays is None else max_replays),
                                proposed=teacher_rollbacks(finished, self._ask_teacher) if r.teacher else ())
    finally:
      env.close()
    by_seed_prefix = {(res.spec.seed, tuple(s.response_text for s in res.steps[:t])): (res, t)
                      for res in finished for t in range(len(res.steps))}
    hook, demos = self.prompt_hook(), []
    for c in kept:
      res, t = by_seed_prefix[(c.seed, c.prefix)]
      history = [(s.observation, s.response_text) for s in res.steps[:t]]
      info = res.steps[t - 1].info if t else {}
      # Eq. 11 conditions on s', s and a rollback instruction x: the prompt at s' names the state to go back to.
      here = res.steps[t].observation
      back_to = next(s.observation for s in res.steps[:t] if int(s.state_key) == c.target_key)
      text = join_text(observation_text(here), ROLLBACK_INSTRUCTION, observation_text(back_to))
      prompt = hook({**here, "text": text} if isinstance(here, dict) else text, history, {}, info)
      own = parse_fields(res.steps[t].response_text)[0]
      memory = own.memory if own is not None else observation_text(res.steps[t].observation).split("\n")[0]
      demos.append(sft_data.demonstration(
          prompt, answer_text(Fields("Go back to a state seen before.", c.action, memory, c.action))))
    return demos

  def _ask_teacher(self, questions: list[list[dict[str, str]]]) -> list[str]:
    """The rollback teacher's answers (eapo.rollback.teacher, loaded once, greedy; sampling/text.py)."""
    from explore_jax.sampling.text import ChatModel

    r = self.config.eapo.rollback
    if self._teacher is None:
      self._teacher = ChatModel.load(r.teacher)
    return self._teacher.complete(questions, max_new_tokens=int(r.teacher_max_new_tokens))


def replay_answer(action: str) -> str:
  """A candidate rollback action answered in the fields, as a replay gives it to the world."""
  return answer_text(Fields("", action, "replay", action))


def _padded(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
  """`batch` with rows of zeros (valid False) appended up to `size`: every step has one compiled shape."""
  n = len(next(iter(batch.values())))
  return {k: np.concatenate([v, np.zeros((size - n, *v.shape[1:]), v.dtype)]) if n < size else v
          for k, v in batch.items()}


@functools.lru_cache(maxsize=None)
def _jitted_scores(model: Any):
  import jax

  from explore_jax.rl.q_phi import target_scores

  return jax.jit(functools.partial(target_scores, model))
