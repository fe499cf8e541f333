"""Sandboxes: where a rollout's commands run and where its patch is graded."""
