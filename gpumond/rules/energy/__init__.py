"""Energy per job: the agents' energy counters joined with the jobs the rules service knows, and the power
slack of the GPUs that only wait on their peers."""
