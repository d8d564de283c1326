"""Dynamic Layer Tying's decision maker, usable without the Trainer: agents, reward, controller, synthetic problem."""

from .agent import AfterstateAgent, PaperAgent, Proposal, RandomAgent, TyingAgent, make_agent
from .agent_config import VARIANT_DEFAULTS, VARIANTS, AgentConfig
from .controller import Outcome, TyingController
from .reward import TyingReward
from .synthetic import SyntheticTyingProblem, run_synthetic
from .value import AfterstateValue, PaperQNetwork

__all__ = [
    "VARIANTS",
    "VARIANT_DEFAULTS",
    "AfterstateAgent",
    "AfterstateValue",
    "AgentConfig",
    "Outcome",
    "PaperAgent",
    "PaperQNetwork",
    "Proposal",
    "RandomAgent",
    "SyntheticTyingProblem",
    "TyingAgent",
    "TyingController",
    "TyingReward",
    "make_agent",
    "run_synthetic",
]
