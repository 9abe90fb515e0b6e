"""Accuracy evaluation: teacher-forced KL drift, lm-eval tasks, data sources, statistics."""
