"""Reports a person can read: per-model Markdown and self-contained HTML with plots."""

from .render import Report, build_report, recommendation_markdown

__all__ = ["Report", "build_report", "recommendation_markdown"]
