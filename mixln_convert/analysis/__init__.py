"""Layer analysis (layer drop, angular distance, block influence, gradient norms, pruning curves)
and the measures the reports compute from it."""
