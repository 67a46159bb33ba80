"""Checkpoint and run-folder input/output, kept apart from the logic that decides what to write: lazy readers
(``loader``, ``gguf``) and their checks (``validate``, ``checkpoint_files``), the writers (``writer``,
``atomic``) and the model card they leave (``model_card``), where a command may read and write (``paths``,
``hub``) and the files of run folders (``runs``)."""
