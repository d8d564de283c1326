"""Dynamic Layer Tying's decision maker: a Q-learning agent over tying maps, usable without the Trainer."""

from .agent import AgentConfig, Decision, TyingAgent
from .q_network import TyingQNetwork
from .reward import TyingReward

__all__ = ["AgentConfig", "Decision", "TyingAgent", "TyingQNetwork", "TyingReward"]
