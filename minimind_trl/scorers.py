"""`minimind_trl.scorers`, the public import path of the scorers (they live in `minimind_trl.rewards.scorers`)."""

from .rewards.scorers import InternLM2Scorer, SequenceClassifierScorer

__all__ = ["InternLM2Scorer", "SequenceClassifierScorer"]
