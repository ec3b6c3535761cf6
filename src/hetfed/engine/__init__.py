"""The simulation engine: executors, client sampling, local training, evaluation."""
