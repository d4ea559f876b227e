"""The warm start, fenced in one place: `scaletrain up`'s local Ray head (cluster.py) and the fork server
beside it that starts Ray's worker processes and scaletrain's drivers pre-imported (forkserver.py)."""
