"""Running scenarios: launching trainers (and owning every process they start), baselines,
progress, results."""
