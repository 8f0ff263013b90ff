"""Producer SDK: contract-checked publishing (test-data simulators live in deploy.simulators)."""
