"""The scripted expert of the miniature: a teacher that knows each task's gold fix (warm-start demonstrations)."""

from repro.expert.script import ExpertScript

__all__ = ["ExpertScript"]
