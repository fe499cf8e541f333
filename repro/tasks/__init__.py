"""Tasks: the SWE-bench-style schema, loaders for task files, and bundled distributions (hand-written packages
and procedurally generated modules, mutated into bug-fix tasks with their own git repositories)."""
