"""Reports over stored runs and recorded landscapes: best-so-far curves and plots."""

from evoengineer.report.convergence import best_so_far, plot_convergence

__all__ = ["best_so_far", "plot_convergence"]
