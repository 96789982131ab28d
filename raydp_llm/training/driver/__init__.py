"""What runs in the process the user started: a run from its settings to its outputs (run.py), Ray
up and the data (session.py, mixed_data.py), Ray Train's fit (fit.py), the console (progress.py),
metrics.csv and summary.json (metrics.py), plots, MLflow (tracking.py), run identity (runs.py),
the best checkpoint (best.py), sweeps' reports (trial_reports.py), text from a model
(generation.py) and a DPO run's reference record (reference.py)."""
