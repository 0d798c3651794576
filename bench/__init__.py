"""agent-fsm's benchmarks: `make bench` (python -m bench.run); see docs/benchmarks.md."""
