"""Training: the policy-gradient update on proxy-recorded rows (``rl.py``, its objective in ``objective.py``) and the
supervised warm start (``sft.py``, trl's SFTTrainer). Import the submodules directly; this package imports no torch."""
