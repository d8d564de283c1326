"""Tying strategies, each one class deciding from what it observes (`TyingDecisions`), chosen by `tying_strategy`."""

from .agent import AgentDecisions, RandomDecisions
from .base import Decision, Observation, StrategySettings, TyingDecisions, split_strategy
from .fixed import SimilarityDecisions, StaticDecisions

# Every strategy by the word that selects it in `tying_strategy` ("dlt", "static:cycle:4", ...).
DECISIONS: dict[str, type[TyingDecisions]] = {
    cls.mode: cls for cls in (AgentDecisions, RandomDecisions, StaticDecisions, SimilarityDecisions, TyingDecisions)
}

__all__ = [
    "DECISIONS",
    "AgentDecisions",
    "Decision",
    "Observation",
    "RandomDecisions",
    "SimilarityDecisions",
    "StaticDecisions",
    "StrategySettings",
    "TyingDecisions",
    "split_strategy",
]
