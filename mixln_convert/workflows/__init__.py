"""The workflows that chain the stages (convert -> heal -> train -> analyze -> report) into one command:
``train`` (every arm of a recipe), ``demo``, ``sweep`` (the Post-LN ratio), ``study`` (from scratch), and
the run folder each holds from its claim to its end (:mod:`.runs`)."""
