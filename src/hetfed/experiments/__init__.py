"""Runs, sweeps, run directories, figures and reports."""
