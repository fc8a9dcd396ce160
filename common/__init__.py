"""Shared parts of the agents: tasks and physics backends, the agent protocol,
logging, checkpoints and evaluation. Copy this package with any one script."""
