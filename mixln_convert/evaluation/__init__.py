"""How well a checkpoint does, measured: perplexity on held-out text and ``score_checkpoint``, what
``mixln-convert eval`` prints (:mod:`.perplexity`), greedy continuations of fixed prompts and how much
they repeat (:mod:`.generation`), lm-evaluation-harness tasks on the loaded model (:mod:`.downstream`,
the optional ``[eval]`` extra) and the offline tasks that ship (:mod:`.tasks`)."""
