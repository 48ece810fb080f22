"""Distribution and process control: the process group, heartbeats and the hang monitor,
preemption."""
