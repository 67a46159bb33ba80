"""Step 1 of the pipeline (convert -> train -> analyze -> report): a Pre-LN checkpoint becomes a Mix-LN one."""
