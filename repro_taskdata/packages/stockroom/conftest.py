"""Puts the repository root on sys.path so the tests import the package from the working copy."""
