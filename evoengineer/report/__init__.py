"""Reports over stored runs and recorded landscapes: best-so-far curves, plots, the HTML run report."""

from evoengineer.report.convergence import best_so_far, plot_convergence
from evoengineer.report.run_report import run_label, summarize_run, write_report

__all__ = ["best_so_far", "plot_convergence", "run_label", "summarize_run", "write_report"]
