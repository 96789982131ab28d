"""What runs in each Ray Train worker: its entry and loop (loop.py), the worker's model, optimizer
and checkpoints (worker.py), the starting weights (starting.py, sharded_start.py), how the
workers share the model (parallel.py) and the optimizer (optim.py)."""
