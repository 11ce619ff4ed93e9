"""One module per inference engine; each owns everything engine-specific (argv, logs, health)."""
