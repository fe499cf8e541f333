"""repro on verl, the engine Agent Lightning's run used: its real actor (FSDP2, remove-padding, chunked log-probs,
sequence parallelism, offload) updates the policy from repro's rows. verl pins a ``transformers`` of its own, so it
runs from an environment of its own: :mod:`repro.verl.env` (imported in the package's environment) builds it; every
other module here runs inside it (``python -m repro.verl.check`` with the package's root on ``PYTHONPATH``) and
imports only torch, numpy and verl."""
