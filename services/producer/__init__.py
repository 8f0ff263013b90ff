"""Producer SDK: contract-checked publishing (simulators: refold.deploy.simulators)."""
