"""repro on verl, the engine Agent Lightning's run used: its real actor (FSDP2, remove-padding, chunked log-probs,
sequence parallelism, offload) updates the policy from repro's rows. verl pins a ``transformers`` of its own, so it
runs from an environment of its own: :mod:`repro.verl.env` builds it, :mod:`repro.verl.config` and
:mod:`repro.verl.policy` (the loop's side of ``trainer=verl``) run in the package's environment; every other module
here runs inside verl's (``python -m repro.verl.check`` with the package's root on ``PYTHONPATH``) and
imports only torch, numpy and verl."""
