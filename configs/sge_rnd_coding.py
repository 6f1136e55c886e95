"""SGE and RND composed ("sge+rnd"): SGE's strategy prompts, mixed temperatures and reflections, with RND's
exploration bonus on failed trajectories, on coding tasks (configs/coding.py). No class of its own: the two
plug-ins merge (explore_jax/methods/composite.py).

  python launch/train.py --config=configs/sge_rnd_coding.py --workdir=runs/sge_rnd_coding
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("sge+rnd", variant)
