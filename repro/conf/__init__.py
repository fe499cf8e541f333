"""The Hydra config root of `repro run`, shipped inside the package (``pkg://repro.conf``): ``config.yaml`` and one
folder per config group (``experiment/*.yaml`` is one file per experiment)."""
