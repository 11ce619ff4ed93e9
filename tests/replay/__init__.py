"""Replays of recorded engine logs through the planner, shared by the unit tests and the benchmarks."""
