"""Proposals: remediations a model proposed with propose_action. Nothing runs until an operator
of the same tenant confirms one; confirmed proposals go to an ``ActionExecutor``."""

from kortex.proposals.executor import ActionExecutor, ExecutionOutcome, RecordingExecutor
from kortex.proposals.service import DecisionOutcome, ProposalService
from kortex.proposals.store import EXPIRES_AFTER, NewProposal, ProposalRecord

__all__ = ["EXPIRES_AFTER", "ActionExecutor", "DecisionOutcome", "ExecutionOutcome", "NewProposal",
           "ProposalRecord", "ProposalService", "RecordingExecutor"]
