"""After training: what the commands ``export``, ``eval``, ``chat`` and ``serve`` do with a finished run
(shard-by-shard export, lm-eval and generation evals kept in the run, a chat session, a server's command line)."""
