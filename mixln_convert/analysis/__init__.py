"""Layer analysis (layer drop, angular distance, block influence, gradient norms) and pruning."""
