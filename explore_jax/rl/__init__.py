"""RL core: policy losses, grouped advantage estimators, trajectory returns, DPEPO diversity."""

from explore_jax.rl.advantages import (
    RecordLayout,
    StepRecords,
    diversity_weighted_advantages,
    dpepo_advantages,
    eapo_advantages,
    get_advantage_estimator,
    gigpo_advantages,
    grpo_advantages,
    intern_keys,
    list_advantage_estimators,
    normalize_in_groups,
    register_advantage_estimator,
    reinforce_advantages,
    rloo_advantages,
    screen_explorer_advantages,
)
from explore_jax.rl.diversity import dpepo_step_weight, dpepo_trajectory_weights
from explore_jax.rl.losses import (
    AGGREGATION_MODES,
    KL_TYPES,
    PolicyLossConfig,
    aggregate_loss,
    broadcast_advantages,
    clipped_surrogate_loss,
    entropy_advantage,
    importance_ratio,
    kl_penalty,
    loss_totals,
    low_probability_mask,
    policy_loss,
)
from explore_jax.rl.returns import (
    TrajectoryIndex,
    dense_segment_ids,
    discounted_returns,
    episode_returns,
    first_record_mask,
    trajectory_index,
    visitation_depth,
)
