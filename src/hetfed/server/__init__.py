"""The server side every algorithm with a server model shares: combine → DP noise → server optimiser.

Screening (the norm filter) runs as a round's updates arrive
(:class:`hetfed.engine.types.RoundUploads`); :mod:`hetfed.server.pipeline` composes
the rest; :mod:`hetfed.server.optimizers` holds the server optimisers.
"""
