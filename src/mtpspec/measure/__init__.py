"""Measuring: side-by-side benchmark, acceptance, per-forward costs, reports."""
